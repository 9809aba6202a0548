"""Speculative rounds vs plain decode: the invariants of issue 7, over recipes x capacities x widths.

Cases come from the registry (recipes with a prepared model; for qwen3 a seeded tiny checkpoint whose
greedy continuations depend on their context -- :func:`conformance.speculative.probe_checkpoint`).  On this machine's device (eager prepared steps on CPU; captured graphs on a GPU):

- **width one = decode**: 256 steps of the width-one round against 256 plain decode steps from the same
  restored state -- logits, emitted tokens, final KV pool and sampling state bytewise equal (rows mix greedy
  and seeded sampling; one row inactive when the capacity allows);
- **transitions** W=1 -> W -> 1 -> ... with ragged and wrong proposals, an inactive row, proposals crossing
  KV page boundaries (page size 8): the greedy emitted sequence equals plain decode, and after every round
  the written-but-rejected positions are poisoned -- no later step may see them;
- **self-drafting** (proposals = the target's own greedy continuation): every proposal accepted;
- **planted defects** the same checks catch: a commit that keeps a rejected token's K/V visible, and an
  acceptance that lets every proposal through.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from .registry import GraphCase, speculative_cases
from .speculative import Case, shared_probe_checkpoint

PARITY_STEPS = 256
SPEC_TOKENS = 40
CASES = speculative_cases()  # Qwen3 -- CPU: capacities 1, 4 (CI); each GPU class: 1, 4, 64, marked gpu
FIRST = [c for c in CASES if c.values[0].capacity == 1]  # planted defects: one case per device class


def _widths(recipe: str) -> tuple[int, ...]:
    return importlib.import_module(f"ignition.recipes.{recipe}.recipe").SPECULATIVE_WIDTHS


_BUILT: dict = {}


def _device(gc: GraphCase) -> str:
    return "cpu" if gc.gpu_class == "cpu" else "cuda"


def _case(gc: GraphCase) -> Case:
    key = (gc.recipe, gc.capacity, _device(gc))
    if key not in _BUILT:
        _BUILT[key] = _new_case(gc)
    return _BUILT[key]


def _new_case(gc: GraphCase) -> Case:
    recipe, capacity, device = gc.recipe, gc.capacity, _device(gc)
    module = importlib.import_module(f"ignition.recipes.{recipe}.recipe")
    path, name = module.MODEL.split(":")
    cls = getattr(importlib.import_module(path), name)
    inactive = frozenset({1}) if capacity > 1 else frozenset()
    sampled = frozenset({2, 3}) if capacity > 2 else frozenset()
    return Case(cls, shared_probe_checkpoint(), capacity, _widths(recipe), PARITY_STEPS + SPEC_TOKENS,
                inactive=inactive, sampled_rows=sampled, device=device, compile=device == "cuda")


@pytest.mark.parametrize("gc", CASES)
def test_width_one_round_is_decode_bytewise(gc, flare_samples):
    case = _case(gc)
    recipe, capacity = gc.recipe, gc.capacity
    reference = case.decode(PARITY_STEPS)
    kv_ref = (case.model.kv_cache.k.clone(), case.model.kv_cache.v.clone())
    state = case.graphs.sampling
    state_ref = (state.step[:capacity].clone(), state.output_counts[:capacity].clone())
    pending = case.restore()
    mismatches = 0
    for i in range(PARITY_STEPS):
        logits, emitted, n, rejected = case.round(1, pending, [[] for _ in range(capacity)])
        assert not rejected
        ref_logits, ref_tokens = reference[i]
        mismatches += not torch.equal(logits[:, 0], ref_logits)
        assert torch.equal(emitted[:, 0], ref_tokens.cpu()), f"step {i}: width-one tokens differ from decode"
        pending = [int(t) if t >= 0 else p for t, p in zip(emitted[:, 0], pending)]
    kv_equal = torch.equal(case.model.kv_cache.k, kv_ref[0]) and torch.equal(case.model.kv_cache.v, kv_ref[1])
    state_equal = torch.equal(state.step[:capacity], state_ref[0]) and \
        torch.equal(state.output_counts[:capacity], state_ref[1])
    flare_samples(case={"recipe": recipe, "capacity": capacity, "width": 1, "check": "width_one_vs_decode",
                        "device": _device(gc), "gpu_class": gc.gpu_class}, steps=PARITY_STEPS, logits_mismatched_steps=mismatches,
                  kv_bytewise=kv_equal, sampling_state_equal=state_equal)
    assert mismatches == 0 and kv_equal and state_equal


def _greedy_reference(case: Case, tokens: int) -> list[list[int]]:
    """Each row's plain greedy continuation (all rows greedy for the transition cases)."""
    sampled, case.sampled = case.sampled, frozenset()
    try:
        out = case.decode(tokens)
    finally:
        case.sampled = sampled
    return [[int(step[1][r]) for step in out] for r in range(case.capacity)]


def _speculate(case: Case, schedule, draft, commit=None, poison=True, tokens: int = SPEC_TOKENS):
    """Rounds until every active row has ``tokens`` tokens; ``draft(r, produced, width)`` -> proposals."""
    sampled, case.sampled = case.sampled, frozenset()
    pending = case.restore()
    case.sampled = sampled
    produced = [[] for _ in range(case.capacity)]
    accepted_all, k = True, 0
    while any(len(produced[r]) < tokens for r in range(case.capacity) if r not in case.rows.inactive):
        width = schedule[k % len(schedule)]
        k += 1
        proposals = [[] if r in case.rows.inactive else draft(r, produced[r], width) for r in range(case.capacity)]
        _, emitted, n_emitted, rejected = case.round(width, pending, proposals, commit=commit)
        for r in range(case.capacity):
            if r in case.rows.inactive:
                assert int(n_emitted[r]) == 0 and (emitted[r] == -1).all()
                continue
            got = [int(t) for t in emitted[r, :int(n_emitted[r])]]
            accepted_all &= int(n_emitted[r]) == len(proposals[r]) + 1
            produced[r] += got
            pending[r] = got[-1]
        if poison:
            case.poison(rejected)
    return [p[:tokens] for p in produced], accepted_all


def _noisy_oracle(reference, seed: int):
    gen = torch.Generator().manual_seed(seed)

    def draft(r, produced, width):
        n = int(torch.randint(0, width, (1,), generator=gen))  # ragged: 0 .. width-1 proposals
        props = list(reference[r][len(produced):len(produced) + n])
        if props and int(torch.randint(0, 3, (1,), generator=gen)) == 0:
            i = int(torch.randint(0, len(props), (1,), generator=gen))
            props[i] = (props[i] + 1 + i) % 50 + 4  # a wrong proposal: rejected there
        return props

    return draft


@pytest.mark.parametrize("gc", CASES)
def test_transitions_equal_plain_greedy_decode_with_rejected_slots_poisoned(gc, flare_samples):
    case = _case(gc)
    recipe, capacity = gc.recipe, gc.capacity
    reference = _greedy_reference(case, SPEC_TOKENS + max(case.widths))
    schedule = (1, 4, 1, 2, 8, 4, 1)
    produced, _ = _speculate(case, schedule, _noisy_oracle(reference, seed=capacity))
    differ = [r for r in range(capacity) if r not in case.rows.inactive and produced[r] != reference[r][:SPEC_TOKENS]]
    flare_samples(case={"recipe": recipe, "capacity": capacity, "check": "transitions_greedy",
                        "schedule": list(schedule), "device": _device(gc), "gpu_class": gc.gpu_class},
                  tokens=SPEC_TOKENS, equal=not differ, rows_differing=differ)  # archived before the verdict
    assert not differ, f"rows {differ}: speculative output differs from decode"


@pytest.mark.parametrize("gc", CASES)
def test_self_drafting_accepts_every_proposal(gc):
    case = _case(gc)
    recipe, capacity = gc.recipe, gc.capacity
    reference = _greedy_reference(case, SPEC_TOKENS + max(case.widths))

    def self_draft(r, produced, width):
        return list(reference[r][len(produced):len(produced) + width - 1])

    produced, accepted_all = _speculate(case, (4, 8, 2), self_draft)
    assert accepted_all
    assert all(produced[r] == reference[r][:SPEC_TOKENS] for r in range(capacity) if r not in case.rows.inactive)


@pytest.mark.parametrize("gc", FIRST)
def test_planted_defect_commit_keeping_rejected_kv_is_caught(gc):
    case = _case(gc)
    recipe, capacity = gc.recipe, gc.capacity
    reference = _greedy_reference(case, SPEC_TOKENS + max(case.widths))
    keep_rejected = lambda n_proposals, n_emitted: n_proposals + 1  # noqa: E731 -- every written position stays

    def wrong(r, produced, width):  # every proposal wrong: each round leaves width - 1 rejected positions
        return [(t + 5) % 50 + 4 for t in reference[r][len(produced):len(produced) + width - 1]]

    produced, _ = _speculate(case, (8,), wrong, commit=keep_rejected, poison=False, tokens=12)
    assert any(produced[r] != reference[r][:12] for r in range(capacity) if r not in case.rows.inactive)


@pytest.mark.parametrize("gc", FIRST)
def test_planted_defect_accept_everything_is_caught(gc, monkeypatch):
    from ignition.components import speculative

    reference = _greedy_reference(_case(gc), SPEC_TOKENS + max(_widths(gc.recipe)))
    capacity = gc.capacity
    monkeypatch.setattr(speculative, "_greedy_match", lambda proposals, greedy: torch.ones_like(proposals, dtype=torch.bool))
    # the defect is planted before the rounds are traced: a captured graph holds the acceptance it was built with
    case = _new_case(gc)
    produced, _ = _speculate(case, (4, 8), _noisy_oracle(reference, seed=11))
    assert any(produced[r] != reference[r][:SPEC_TOKENS] for r in range(capacity) if r not in case.rows.inactive)
