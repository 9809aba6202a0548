"""``flare::sample_advance_into_`` (``ignition/components/sampling.py``; ``kernels/sampler_done.py``): the sampler and
its state update in one op, whose front ends the rows nothing after it changes.

- Interpreter (CPU machines with Triton): the op's launches against the launches it replaces --
  ``flare::sampler_front``, ``flare::sampling_cut_compact`` and ``flare::draw_finish_into_`` one after another --
  tokens, counts and steps equal, on batches mixing greedy rows, sampled rows without a filter (the front's draw),
  with top-k / top-p / min-p, inactive rows of both kinds, and on batches whose rows are all done (the later launches
  return at once); both against the traced reference (``sample`` + ``advance`` with the sorting cut); the row tickets
  back at zero.  ``sampler_done``'s predicate against the rows the reference's cut and min-p leave whole.
- CPU: the op's reference is ``sample`` then ``advance``; its arguments checked by name; ``sample_advance`` takes the
  op only on CUDA.
- Vocabulary-sized rows, compiled and captured: ``test_components_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from ignition.components import sampling
from ignition.components.sampling import SamplingTensors, advance, sample, sample_advance, sample_advance_into_op
from test_triton_attention import interpreter  # sets TRITON_INTERPRET on CPU machines before triton is imported

try:
    import triton
    import triton.language as tl

    from ignition.components.kernels.sampler_done import _all_rows_done, _done_row
except ImportError:  # no Triton: the interpreter tests skip
    triton = None

if triton is not None:
    @triton.jit
    def _probe(TEMP, TOPK, TOPP, MINP, OUT, ALL, B, V, eps, BP: tl.constexpr):
        """``sampler_done``'s predicate of each row into ``OUT`` and of the batch into ``ALL``."""
        r = tl.arange(0, BP)
        m = r < B
        done = _done_row(tl.load(TEMP + r, mask=m), tl.load(TOPK + r, mask=m), tl.load(TOPP + r, mask=m),
                         tl.load(MINP + r, mask=m), V, eps)
        tl.store(OUT + r, done.to(tl.int32), mask=m)
        tl.store(ALL, _all_rows_done(TEMP, TOPK, TOPP, MINP, B, V, eps, BP).to(tl.int32))

#: Rows of every kind: greedy (a filter set, ignored), sampled without a filter (top-k at the vocabulary counts as
#: none), top-k with top-p, min-p alone, top-p alone, and two inactive rows (one plain, one with a cut).
MIXED = [{"temperature": 0.0, "top_k": 20}, {"temperature": 1.0}, {"temperature": 0.8, "top_k": 20, "top_p": 0.95},
         {"temperature": 1.2, "min_p": 0.1}, {"temperature": 0.7, "top_p": 0.5}, {"temperature": 1.0},
         {"temperature": 0.9, "top_k": 5}, {"temperature": 1.3, "top_k": -1}]
INACTIVE = (5, 6)
#: Every row done after the front: greedy, plain, top-k at the vocabulary's size (set per case), inactive plain.
DONE = [{"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 0.5, "top_k": -1}, {"temperature": 2.0}]


def _state(rows: list[dict], v: int, seed: int) -> tuple[SamplingTensors, torch.Tensor, torch.Tensor]:
    """``(params, logits, active)``: the rows admitted with penalties and prompts, counts already holding tokens,
    steps apart; ``top_k`` -1 stands for the vocabulary's size."""
    gen = torch.Generator().manual_seed(seed)
    resolved = [{**r, "top_k": v if r.get("top_k") == -1 else r.get("top_k", 0), "seed": seed * 10 + i,
                 "presence_penalty": 0.3, "frequency_penalty": 0.1, "repetition_penalty": 1.1}
                for i, r in enumerate(rows)]
    params = SamplingTensors.from_resolved(resolved, len(rows), vocab_size=v,
                                           prompt_token_ids=[[i, 3, v - 1 - i] for i in range(len(rows))])
    params.output_counts.copy_(torch.randint(0, 3, (len(rows), v), generator=gen, dtype=torch.int32)
                               * (torch.rand(len(rows), v, generator=gen) < 0.01))
    params.step.copy_(torch.arange(len(rows)) * 7 + seed)
    logits = (torch.randn(len(rows), v, generator=gen) * 4).to(torch.bfloat16)
    active = torch.tensor([i not in INACTIVE for i in range(len(rows))])
    return params, logits, active


def _clone(params: SamplingTensors) -> SamplingTensors:
    return SamplingTensors(**{k: (t.clone() if isinstance(t, torch.Tensor) else t) for k, t in vars(params).items()})


def _args(params: SamplingTensors, logits: torch.Tensor, active: torch.Tensor) -> tuple:
    return (logits, params.output_counts, params.prompt_mask, params.repetition_penalty, params.frequency_penalty,
            params.presence_penalty, params.temperature, params.min_p, params.top_k, params.top_p, params.seed,
            params.step, active)


def _separate_launches(params: SamplingTensors, logits: torch.Tensor, active: torch.Tensor, pad: int) -> torch.Tensor:
    """The launches the op replaces, one op after another (the CUDA route of ``sample_advance`` before it)."""
    from ignition.components.kernels import gumbel, sampler_front
    from ignition.components.kernels.sampling_cut import sampling_cut_compact_triton

    args = _args(params, logits, active)
    greedy, scaled = sampler_front.sampler_front_triton(*args[:8], sampling.GREEDY_EPS)
    cut = sampling_cut_compact_triton(scaled, params.top_k, params.top_p, params.temperature,
                                      skip_below=sampling.GREEDY_EPS)
    out = torch.full_like(params.step, 12345)
    return gumbel.gumbel_argmax_triton(scaled, cut, params.seed, params.step, out=out,
                                       finish=(greedy, params.temperature, active, params.output_counts,
                                               sampling.GREEDY_EPS, pad))


def _traced(params: SamplingTensors, logits: torch.Tensor, active: torch.Tensor, pad: int) -> torch.Tensor:
    tokens = sample(logits.float(), params, active=active, pad_id=pad)
    advance(params, tokens, active=active)
    return tokens


@interpreter
@pytest.mark.parametrize("rows,v,seeds", [("mixed", 5000, 1), ("done", 5000, 2), ("done", 9000, 1)])
def test_kernels_equal_the_separate_launches_and_the_reference(rows, v, seeds):
    from ignition.components.kernels import gumbel, launch, sampler_front

    pad = -1
    for seed in range(seeds):
        params, logits, active = _state(MIXED if rows == "mixed" else DONE, v, seed)
        separate, traced = _clone(params), _clone(params)
        want = _separate_launches(separate, logits, active, pad)
        want_traced = _traced(traced, logits, active, pad)
        out = torch.full((params.capacity + 1,), 777, dtype=torch.int64)
        sampling.sample_advance_into_triton(out[:-1], *_args(params, logits, active), pad)
        assert torch.equal(out[:-1], want) and out[-1] == 777, (seed, out, want)
        assert torch.equal(want, want_traced), (seed, want, want_traced)
        for p in (separate, traced):
            assert torch.equal(params.output_counts, p.output_counts) and torch.equal(params.step, p.step), seed
        if rows == "mixed":
            assert all(int(out[i]) == pad for i in INACTIVE)
        for store in (gumbel._COUNTS, sampler_front._COUNTS):
            assert not store[launch.device_key(out.device)].any()


@interpreter
def test_done_rows_are_the_rows_no_later_launch_changes():
    """``sampler_done``'s predicate against what the later launches would do (the traced reference): a done row is
    greedy, or its sorting cut is -inf and its min-p mask keeps every value -- over a grid of parameters (top-k at,
    below and past the vocabulary; top-p 1 and below; min-p 0 and above; NaN temperature); and the batch is all
    done exactly when each row is."""
    import itertools

    from ignition.components.sampling import apply_min_p
    from ignition.components.sampling_cut import sampling_cut_reference

    probe = _probe
    v = 64
    grid = list(itertools.product([0.0, 1e-6, 1.0, float("nan")], [0, 1, 5, v - 1, v, v + 3], [1.0, 0.9],
                                  [0.0, 0.2]))
    temp, top_k, top_p, min_p = (torch.tensor(c, dtype=d) for c, d in
                                 zip(zip(*grid), (torch.float32, torch.int32, torch.float32, torch.float32)))
    n = len(grid)
    y = torch.randn(n, v) * 3
    out, every = torch.empty(n, dtype=torch.int32), torch.empty(1, dtype=torch.int32)
    probe[(1,)](temp, top_k, top_p, min_p, out, every, n, v, sampling.GREEDY_EPS, BP=triton.next_power_of_2(n))
    cut = sampling_cut_reference(y, top_k, top_p, torch.zeros(n, dtype=torch.bool))
    untouched = (cut == float("-inf")) & (apply_min_p(y, min_p) == y).all(dim=-1)
    greedy = temp < sampling.GREEDY_EPS
    assert torch.equal(out.bool(), greedy | untouched), [g for g, o in zip(grid, out) if o]
    assert int(every) == 0 and out.bool().any() and not out.bool().all()
    rows = out.bool().nonzero()[:, 0]  # only the done rows: the batch is all done
    sub = [t[rows].contiguous() for t in (temp, top_k, top_p, min_p)]
    probe[(1,)](*sub, torch.empty(len(rows), dtype=torch.int32), every, len(rows), v, sampling.GREEDY_EPS,
                BP=triton.next_power_of_2(len(rows)))
    assert int(every) == 1


def test_op_off_cuda_is_sample_then_advance_and_checks_its_arguments():
    params, logits, active = _state(MIXED, 3000, 5)
    traced = _clone(params)
    want = _traced(traced, logits, active, 0)
    out = torch.full_like(params.step, 777)
    assert sample_advance_into_op(out, *_args(params, logits, active), 0) is None
    assert torch.equal(out, want)
    assert torch.equal(params.output_counts, traced.output_counts) and torch.equal(params.step, traced.step)
    args = list(_args(params, logits, active))
    for i, name, bad in ((8, "top_k", params.top_k.long()), (9, "top_p", params.top_p[:2]),
                         (10, "seed", params.seed.int()), (12, "active", active.int()),
                         (6, "temperature", params.temperature.double()), (1, "counts", params.output_counts[:, 1:])):
        with pytest.raises(ValueError, match=f"sample_advance_into_: {name}"):
            sample_advance_into_op(out, *(args[:i] + [bad] + args[i + 1:]), 0)
    with pytest.raises(ValueError, match="sample_advance_into_: out"):
        sample_advance_into_op(out[:2], *args, 0)


def test_sample_advance_takes_the_op_only_on_cuda(monkeypatch):
    """Off CUDA the switch changes nothing: ``sample_advance`` into a static buffer is the traced sampler."""
    calls = []
    monkeypatch.setattr(sampling, "sample_advance_into_op", lambda *a: calls.append(a))
    params, logits, active = _state(MIXED, 3000, 6)
    traced = _clone(params)
    out = torch.full_like(params.step, 777)
    got = sample_advance(logits.float(), params, active=active, pad_id=0, out=out)
    assert not calls and torch.equal(got, _traced(traced, logits, active, 0))
