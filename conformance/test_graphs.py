"""GPU conformance: each captured decode capacity of each recipe against its eager prepared forward.

Cases are generated from the registry (recipes x capacities x GPU classes).  One class-scoped
preparation per recipe builds the eager steps and the compiled + captured catalog (one graph pool) of the
recipe's tiny checkpoint (qwen3: :func:`conformance.speculative.probe_checkpoint`, whose continuations depend on
their context -- the embedded default's fall into a one-token loop that would hide a KV defect); each case then
decodes its capacity with partially inactive rows, its decode steps crossing a page boundary, and compares logits
and tokens of every step bytewise (the bf16 bound ``4 * 2^-8 * max|logit|`` is archived beside the largest
difference, as a scale).
"""

from __future__ import annotations

import importlib

import pytest

from .registry import graph_cases

CASES = graph_cases()
PAGE = 16
PROMPT_LEN = 28  # the 8 decode steps below write positions 28..35: across the page boundary at 32
STEPS = 8
BOUND_FACTOR = 4.0


def _model_module(recipe: str):
    module = importlib.import_module(f"ignition.recipes.{recipe}.recipe")
    return module if hasattr(module, "MODEL") else None


def _checkpoint(recipe: str):
    from .speculative import shared_probe_checkpoint

    if recipe == "qwen3":
        return shared_probe_checkpoint()
    pytest.skip(f"no tiny checkpoint declared for recipe {recipe}")


_PREPARED: dict = {}


def _prepared(recipe: str, capacities, device: str = "cuda"):
    """The recipe's eager steps and its compiled, captured catalog (on ``device``; off CUDA both eager -- the test's
    mechanics alone)."""
    import torch

    if recipe not in _PREPARED:
        module = _model_module(recipe)
        cls_path, cls_name = module.MODEL.split(":")
        cls = getattr(importlib.import_module(cls_path), cls_name)
        ckpt = _checkpoint(recipe)
        catalog = module.graph_catalog()
        built = []
        for captured in (False, True):
            model = cls.from_pretrained(ckpt, device=device)
            model.allocate_kv_cache(num_pages=max(capacities) * 4 + 8, page_size=PAGE, max_context=512)
            graphs = catalog.prepare(model, decode=capacities, prefill=(catalog.prefill_chunks[0],))
            built.append(graphs.compile().capture() if captured and device == "cuda" else graphs)
        if device == "cuda":
            torch.cuda.synchronize()
        _PREPARED[recipe] = built
    return _PREPARED[recipe]


def _rows_inputs(rows, tokens, width, torch, device="cuda"):
    parts = {k: [] for k in ("input_ids", "positions", "slot_mapping", "block_tables", "seq_lens", "active_rows")}
    for row, tok in zip(rows, tokens):
        if row is None:
            parts["input_ids"].append([[0]]), parts["positions"].append([[0]]), parts["slot_mapping"].append([[-1]])
            parts["block_tables"].append([[0] * width]), parts["seq_lens"].append([0])
            parts["active_rows"].append([False])
            continue
        pos = row["len"]
        page = row["pages"][pos // PAGE]
        parts["input_ids"].append([[tok]]), parts["positions"].append([[pos]])
        parts["slot_mapping"].append([[page * PAGE + pos % PAGE]])
        parts["block_tables"].append([row["pages"] + [0] * (width - len(row["pages"]))])
        row["len"] += 1
        parts["seq_lens"].append([row["len"]]), parts["active_rows"].append([True])
    out = {k: torch.tensor(sum(v, []), device=device) for k, v in parts.items()}
    out["block_tables"] = out["block_tables"].to(torch.int32)
    return out


def _decode(graphs, capacity, torch, device="cuda"):
    """Prefill every active row (row 1 inactive when capacity > 1), then STEPS decodes at this capacity."""
    width = graphs.steps[0].max_pages
    vocab = graphs.model.vocab_size
    rows = [None if (capacity > 1 and i == 1) else {"pages": list(range(1 + 3 * i, 4 + 3 * i)), "len": 0}
            for i in range(capacity)]
    nxt = []
    chunk = graphs.catalog.prefill_chunks[0]
    for i, row in enumerate(rows):
        if row is None:
            nxt.append(0)
            continue
        prompt = [(i * 131 + j * 17) % (vocab - 10) + 10 for j in range(PROMPT_LEN)]
        pos = torch.arange(PROMPT_LEN)[None]
        slots = torch.tensor([[row["pages"][p // PAGE] * PAGE + p % PAGE for p in range(PROMPT_LEN)]])
        _, tok = graphs.step("prefill", 1, chunk).run(
            input_ids=torch.tensor([prompt]), positions=pos, slot_mapping=slots,
            block_tables=torch.tensor([row["pages"] + [0] * (width - len(row["pages"]))], dtype=torch.int32),
            seq_lens=torch.tensor([PROMPT_LEN]), active_rows=torch.tensor([True]))
        row["len"] = PROMPT_LEN
        nxt.append(int(tok[0]))
    step = graphs.step("decode", capacity)
    logits_all, tokens_all = [], []
    for _ in range(STEPS):
        logits, tokens = step.run(**_rows_inputs(rows, nxt, width, torch, device))
        logits_all.append(logits[:capacity].float().cpu().clone())
        tokens_all.append(tokens[:capacity].cpu().clone())
        nxt = [int(t) for t in tokens[:capacity].cpu()]
    return logits_all, tokens_all, rows


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_captured_capacity_matches_eager(case, flare_samples):
    import torch

    from ignition.recipes.registry import load_recipe

    if _model_module(case.recipe) is None:
        pytest.skip(f"recipe {case.recipe} has no prepared model yet (frontend only)")
    capacities = load_recipe(case.recipe).capacities
    eager, captured = _prepared(case.recipe, capacities)
    e_logits, e_tokens, rows = _decode(eager, case.capacity, torch)
    c_logits, c_tokens, _ = _decode(captured, case.capacity, torch)
    bound = BOUND_FACTOR * 2 ** -8 * max(float(x.abs().max()) for x in e_logits)
    diff = max(float((a - b).abs().max()) for a, b in zip(e_logits, c_logits))
    first = next((i for i, (a, b) in enumerate(zip(e_logits, c_logits)) if not torch.equal(a, b)), None)
    active = [i for i, row in enumerate(rows) if row is not None]
    distinct = len({int(t[i]) for t in e_tokens for i in active})
    flare_samples(case={"recipe": case.recipe, "capacity": case.capacity, "gpu_class": case.gpu_class,
                        "check": "captured_vs_eager"}, max_abs_diff=diff, bound=bound,
                  bytewise_equal=first is None, first_mismatch_step=first, distinct_tokens=distinct)
    assert PROMPT_LEN // PAGE != (PROMPT_LEN + STEPS - 1) // PAGE  # the decode steps cross a page boundary
    assert distinct > 1, "the checkpoint's tokens repeat one id: they would hide a KV defect"
    assert first is None, f"captured logits differ from eager at decode step {first} (max |diff| {diff:.3g})"
    assert all(torch.equal(a, b) for a, b in zip(e_tokens, c_tokens))
    for i, row in enumerate(rows):
        if row is None:
            assert all(not x[i].any() for x in c_logits) and all(int(t[i]) == -1 for t in c_tokens)
