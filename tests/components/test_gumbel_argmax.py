"""``flare::gumbel_argmax`` (``ignition/components/sampling.py``, kernel ``kernels/gumbel.py``): the sampler's
Gumbel-max draw in one launch.

- Interpreter (CPU machines with Triton): the kernel's tokens against the traced reference
  (:func:`gumbel_argmax_reference`: the cut's ``masked_fill``, ``uniform_noise``'s torch hash, the logs, the
  two-stage argmax) over rows kept whole, cut to a few values by -inf or by the row's cut (values tied with it kept),
  to one value, dropped entirely, with a NaN, negative and 64-bit seeds, steps past 2**32, chunks that do not divide
  the row; the noise's bits themselves; the row counts back at zero.
- CPU: the op's reference is the sampler's draw (the switch changes nothing off CUDA); arguments checked by name;
  the count buffers its tickets (and the decode combine's and the MLP handoff's) live in (``launch.zeroed_counts``).
- The vocabulary-sized rows on the H200: ``test_components_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from ignition.components import sampling
from ignition.components.sampling import gumbel_argmax_op, gumbel_argmax_reference, uniform_noise
from test_triton_attention import interpreter  # sets TRITON_INTERPRET on CPU machines before triton is imported


def _rows(v: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(scaled, cut, seeds, steps)``: six rows of ``v`` values -- whole (no cut), a few kept (-inf elsewhere), one
    kept, none kept, one NaN, large values cut at their 10th largest (ties with it planted); seeds of both signs and
    steps past 2**32."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(6, v, generator=gen) * 3
    y[1, torch.randperm(v, generator=gen)[: v - 7]] = float("-inf")
    y[2] = float("-inf")
    y[2, v // 2 + 1] = 0.5
    y[3] = float("-inf")
    y[4, v // 3] = float("nan")
    y[5] = y[5] * 1e3
    tenth = y[5].topk(10).values[-1]
    y[5, torch.randperm(v, generator=gen)[:3]] = tenth  # ties with the cut: kept
    cut = torch.full((6,), float("-inf"))
    cut[5] = tenth
    seeds = torch.tensor([0, -1, 1 << 62, -(1 << 63), 123456789, 42], dtype=torch.int64)
    steps = torch.tensor([0, 1, (1 << 32) + 5, 7, 1 << 40, 99], dtype=torch.int64)
    return y, cut, seeds, steps


@interpreter
@pytest.mark.parametrize("v,chunk", [(10_000, 1024), (4096, 4096), (5000, 256), (151_936, 4096)])
def test_kernel_draws_the_reference_token(v, chunk):
    from ignition.components.kernels import gumbel, launch

    y, cut, seeds, steps = _rows(v, seed=v)
    want = gumbel_argmax_reference(y, cut, seeds, steps)
    got = gumbel.gumbel_argmax_triton(y, cut, seeds, steps, chunk=chunk)
    assert got.dtype == torch.int64 and torch.equal(got, want), (got, want)
    assert int(got[3]) == 0 and int(got[4]) == v // 3 and int(got[2]) == v // 2 + 1 and y[5, got[5]] >= cut[5]
    assert not gumbel._COUNTS[launch.device_key(y.device)].any()
    # many draws of one row: the tokens follow its support above the cut (a value tied with it kept) and change with
    # the step
    row = torch.full((1, v), float("-inf"))
    row[0, :6] = torch.tensor([0.0, 1.0, 2.0, 0.5, -1.0, 0.5])
    half = torch.tensor([0.5])
    tokens = {int(gumbel.gumbel_argmax_triton(row, half, seeds[:1], torch.tensor([s]), chunk=chunk))
              for s in range(40)}
    assert tokens <= {1, 2, 3, 5} and len(tokens) >= 3


@interpreter
def test_kernel_noise_is_the_reference_noise_bit_for_bit():
    """The kernel's hash in uint32 lanes against ``uniform_noise``'s int64 one: a row of zeros draws the index of the
    largest ``-log(-log u)``, i.e. of the largest ``u`` -- compared over many (seed, step) pairs, and the noise itself
    through a row that keeps exactly the indices where the reference's ``u`` tops a threshold."""
    from ignition.components.kernels import gumbel

    v = 3000
    seeds = torch.tensor([5, -7, 1 << 50, -(1 << 40)], dtype=torch.int64)
    for step in (0, 3, (1 << 33) + 1):
        steps = torch.full((4,), step, dtype=torch.int64)
        u = uniform_noise(seeds, steps, v)
        got = gumbel.gumbel_argmax_triton(torch.zeros(4, v), torch.zeros(4), seeds, steps, chunk=512)
        assert torch.equal(got, u.argmax(dim=-1))


def _finish_rows(v: int, seed: int = 0):
    """``(scaled, cut, seeds, steps, greedy, temperature, active, counts)`` of :func:`_rows`' six rows: greedy rows
    (temperature 0 and just below ``GREEDY_EPS``) and sampled ones (at ``GREEDY_EPS`` itself, above), the fourth row
    inactive, greedy tokens at both ends of the vocabulary, counts already holding some tokens."""
    y, cut, seeds, steps = _rows(v, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    eps = sampling.GREEDY_EPS
    temperature = torch.tensor([0.0, 0.7, eps * 0.999, 1.0, eps, 1.3], dtype=torch.float32)
    active = torch.tensor([True, True, True, False, True, True])
    greedy = torch.tensor([0, 5, v - 1, 3, 7, 11], dtype=torch.int64)
    counts = torch.randint(0, 3, (6, v), generator=gen, dtype=torch.int32)
    return y, cut, seeds, steps, greedy, temperature, active, counts


def _finish_reference(y, cut, seeds, steps, greedy, temperature, active, counts, pad):
    """The sampler's end as the traced region had it: the draw, ``sample``'s choice, ``advance`` (new tensors)."""
    drawn = gumbel_argmax_reference(y, cut, seeds, steps)
    tokens = torch.where(active, torch.where(temperature < sampling.GREEDY_EPS, greedy, drawn), pad)
    counts = counts.clone()
    counts.scatter_add_(1, tokens.clamp(0, y.shape[1] - 1)[:, None], active.to(torch.int32)[:, None])
    return tokens, counts, steps + active.to(torch.int64)


@interpreter
@pytest.mark.parametrize("v,chunk,pad,into", [(10_000, 1024, -1, False), (5000, 256, 0, True)])
def test_kernel_finish_picks_and_advances_as_the_sampler_does(v, chunk, pad, into):
    """``FINISH``: the tokens (greedy below ``GREEDY_EPS``, drawn at and above it, the pad for the inactive row), the
    counts and the steps against the draw, ``sample``'s choice and ``advance`` traced apart; the steps move only
    after every program of the row read them (the drawn tokens are those of the old steps).  ``into``: the tokens
    written into a given tensor, which the launch returns."""
    from ignition.components.kernels import gumbel, launch

    y, cut, seeds, steps, greedy, temperature, active, counts = _finish_rows(v, seed=v)
    want, want_counts, want_steps = _finish_reference(y, cut, seeds, steps, greedy, temperature, active, counts, pad)
    assert want[2] == v - 1 and want[3] == pad and want[4] != 7  # greedy, inactive, sampled at GREEDY_EPS
    out = torch.full_like(want, 12345) if into else None
    got = gumbel.gumbel_argmax_triton(y, cut, seeds, steps, chunk=chunk, out=out,
                                      finish=(greedy, temperature, active, counts, sampling.GREEDY_EPS, pad))
    assert (got is out) if into else got.data_ptr() not in (y.data_ptr(), steps.data_ptr())
    assert torch.equal(got, want), (got, want)
    assert torch.equal(counts, want_counts) and torch.equal(steps, want_steps)
    assert not gumbel._COUNTS[launch.device_key(y.device)].any()


def test_draw_finish_op_off_cuda_is_the_reference_and_checks_its_arguments():
    from ignition.components.sampling import draw_finish_op

    y, cut, seeds, steps, greedy, temperature, active, counts = _finish_rows(777)
    want, want_counts, want_steps = _finish_reference(y, cut, seeds, steps, greedy, temperature, active, counts, -1)
    assert torch.equal(draw_finish_op(y, cut, seeds, steps, greedy, temperature, active, counts, -1), want)
    assert torch.equal(counts, want_counts) and torch.equal(steps, want_steps)
    for name, bad in (("greedy", (greedy.int(), temperature, active, counts)),
                      ("temperature", (greedy, temperature[:3], active, counts)),
                      ("active", (greedy, temperature, active.int(), counts)),
                      ("counts", (greedy, temperature, active, counts[:, :-1]))):
        with pytest.raises(ValueError, match=f"draw_finish_: {name}"):
            draw_finish_op(y, cut, seeds, steps, *bad, -1)
    with pytest.raises(ValueError, match="draw_finish_: step"):
        draw_finish_op(y, cut, seeds, steps[:2], greedy, temperature, active, counts, -1)


def test_draw_finish_into_op_off_cuda_writes_the_reference_into_out_and_checks_it():
    from ignition.components.sampling import draw_finish_into_op

    y, cut, seeds, steps, greedy, temperature, active, counts = _finish_rows(777)
    want, want_counts, want_steps = _finish_reference(y, cut, seeds, steps, greedy, temperature, active, counts, -1)
    out = torch.full((y.shape[0] + 1,), 12345, dtype=torch.int64)
    assert draw_finish_into_op(out[:-1], y, cut, seeds, steps, greedy, temperature, active, counts, -1) is None
    assert torch.equal(out[:-1], want) and out[-1] == 12345
    assert torch.equal(counts, want_counts) and torch.equal(steps, want_steps)
    for bad in (out, out[:-1].int()):
        with pytest.raises(ValueError, match="draw_finish_into_: out"):
            draw_finish_into_op(bad, y, cut, seeds, steps, greedy, temperature, active, counts, -1)


def test_draw_finish_op_compiled_advances_the_state_through_views():
    """Compiled (Inductor, this machine's backend), the op's mutations of views of the state -- the catalog's sampler
    region passes the first rows of the shared counts and steps -- reach the state; the rows beyond stay."""
    from ignition.components.sampling import draw_finish_op

    def finish(y, cut, seeds, steps, greedy, temperature, active, counts):
        return draw_finish_op(y, cut, seeds, steps[:6], greedy, temperature, active, counts[:6], -1)

    y, cut, seeds, steps, greedy, temperature, active, counts = _finish_rows(500)
    want = _finish_reference(y, cut, seeds, steps, greedy, temperature, active, counts, -1)
    state_steps, state_counts = torch.cat([steps, steps[:1]]), torch.cat([counts, counts[:1]])
    got = torch.compile(finish, fullgraph=True, dynamic=False)(y, cut, seeds, state_steps, greedy, temperature, active,
                                                               state_counts)
    assert torch.equal(got, want[0])
    assert torch.equal(state_counts[:6], want[1]) and torch.equal(state_counts[6], counts[0])
    assert torch.equal(state_steps[:6], want[2]) and state_steps[6] == steps[0]


def test_sample_advance_is_sample_then_advance(monkeypatch):
    """The catalog's sampler region: :func:`sample_advance` against :func:`sample` and :func:`advance` on a copy of the
    same state over a few steps (mixed rows, an inactive one), with the switch either way (CUDA only: the CPU keeps
    the traced path)."""
    from ignition.components.sampling import SamplingTensors, advance, sample, sample_advance

    v = 3000
    rows = [{"temperature": t, "top_k": k, "top_p": p, "presence_penalty": 0.4, "seed": 3 + i}
            for i, (t, k, p) in enumerate([(0.0, 0, 1.0), (0.7, 20, 0.9), (1.2, 0, 0.8), (1.0, 5, 1.0)])]
    for finish in ("1", "0"):
        monkeypatch.setenv("FLARE_DRAW_FINISH", finish)
        a = SamplingTensors.from_resolved(rows, 5, vocab_size=v, prompt_token_ids=[[1, 2]] * 4)
        b = SamplingTensors.from_resolved(rows, 5, vocab_size=v, prompt_token_ids=[[1, 2]] * 4)
        act = torch.tensor([True, True, False, True, True])
        gen = torch.Generator().manual_seed(9)
        for _ in range(4):
            logits = torch.randn(5, v, generator=gen) * 4
            want = sample(logits, a, active=act)
            advance(a, want, active=act)
            assert torch.equal(sample_advance(logits, b, active=act), want)
            assert torch.equal(a.output_counts, b.output_counts) and torch.equal(a.step, b.step)


def test_op_off_cuda_is_the_reference_and_checks_its_arguments(monkeypatch):
    y, cut, seeds, steps = _rows(777)
    assert torch.equal(gumbel_argmax_op(y, cut, seeds, steps), gumbel_argmax_reference(y, cut, seeds, steps))
    monkeypatch.setenv("FLARE_GUMBEL_KERNEL", "1")  # CUDA only: the CPU sampler keeps the traced draw
    assert torch.equal(sampling.gumbel_argmax(y, cut, seeds, steps), gumbel_argmax_reference(y, cut, seeds, steps))
    with pytest.raises(ValueError, match="scaled"):
        gumbel_argmax_op(y.double(), cut, seeds, steps)
    with pytest.raises(ValueError, match="cut"):
        gumbel_argmax_op(y, cut[:2], seeds, steps)
    with pytest.raises(ValueError, match="seed"):
        gumbel_argmax_op(y, cut, seeds.int(), steps)
    with pytest.raises(ValueError, match="step"):
        gumbel_argmax_op(y, cut, seeds, steps[:3])


def test_sample_draws_from_the_cut_as_the_filtered_logits_do():
    """``sample`` now draws from (scaled, cut) where it drew from ``filter_logits``'s masked logits: the same tokens
    (the reference cuts with the same masked_fill) over mixed rows -- greedy, top-k, top-p, min-p, penalties."""
    from ignition.components.sampling import SamplingTensors, argmax_last, filter_logits, sample

    v = 3000
    rows = [{"temperature": t, "top_k": k, "top_p": p, "min_p": m, "presence_penalty": 0.4, "seed": 11 + i}
            for i, (t, k, p, m) in enumerate([(0.0, 0, 1.0, 0.0), (0.7, 20, 0.9, 0.0), (1.2, 0, 0.8, 0.05),
                                              (1.0, 5, 1.0, 0.0), (0.6, 0, 1.0, 0.1)])]
    params = SamplingTensors.from_resolved(rows, 6, vocab_size=v, prompt_token_ids=[[1, 2, i] for i in range(5)])
    gen = torch.Generator().manual_seed(4)
    for _ in range(5):
        logits = torch.randn(6, v, generator=gen) * 4
        penalized, filtered = filter_logits(logits, params, skip=params.temperature < sampling.GREEDY_EPS)
        u = uniform_noise(params.seed, params.step, v)
        drawn = argmax_last(filtered - torch.log(-torch.log(u)))
        want = torch.where(params.active, torch.where(params.temperature < sampling.GREEDY_EPS,
                                                      argmax_last(penalized), drawn), -1)
        assert torch.equal(sample(logits, params), want)
        params.step += 1


def test_count_buffers_grow_and_keep_the_ones_they_replace():
    """``launch.zeroed_counts`` (the tickets' and the handoff's counts): one buffer per device of at least
    ``COUNT_SLOTS_MIN`` slots, reused while it is large enough; a larger request replaces it and the replaced one stays
    alive (a captured graph may still launch on its address)."""
    from ignition.components.kernels import launch

    store: dict = {}
    dev = torch.device("cpu")
    first = launch.zeroed_counts(store, dev, 8)
    assert first.dtype == torch.int32 and first.numel() == launch.COUNT_SLOTS_MIN and not first.any()
    assert launch.zeroed_counts(store, dev, launch.COUNT_SLOTS_MIN) is first
    bigger = launch.zeroed_counts(store, dev, launch.COUNT_SLOTS_MIN + 1)
    assert bigger.numel() == launch.COUNT_SLOTS_MIN + 1 and store[launch.device_key(dev)] is bigger
    assert any(t is first for t in launch._RETIRED)
    assert launch.zeroed_counts(store, dev, 8) is bigger
