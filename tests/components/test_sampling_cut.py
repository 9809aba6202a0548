"""``flare::sampling_cut`` (``ignition/components/sampling_cut.py``): the general sampler's top-k / top-p cut.

Checked against :func:`_cut64`, written here: the definition in float64 on Python lists (sorted, the mass strictly
above each value, no torch).  Where the top-p boundary lies within ``TIE`` of ``top_p`` (the mass above a value is
that close to it, so fp32 rounding may decide either way) the case is reported as a near tie and either neighbour
is accepted; the top-k part and every other case must be exact.

- CPU: the op's reference (the sort) against ``_cut64`` and against the sampler's full-sort path; the sampler's CUDA
  route (top ``n`` values, the op for the other rows) run on CPU against the full sort; arguments checked by name.
- Interpreter (CPU machines with Triton): the sort-free kernel against ``_cut64`` -- ties, ``-inf`` (min-p), signed
  zeros, a constant row, ``top_k`` at and beyond the row length, skipped rows, blocks that do not divide the row; the
  compacted pipeline (``flare::sampling_cut_compact``) the same way, each of its three ends.
- The vocabulary-sized rows on the H200 are in ``test_components_gpu.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from ignition.components.sampling import SamplingTensors, filter_logits
from ignition.components.sampling_cut import (sampling_cut, sampling_cut_reference, sorted_cut, sorted_cut_op,
                                              sorted_cut_reference)
from test_triton_attention import interpreter  # sets TRITON_INTERPRET on CPU machines before triton is imported

TIE = 1e-5


def _cut64(row: list[float], k: int, p: float) -> tuple[float, bool]:
    """``(cut, near_tie)``: the definition in float64 -- K the k-th largest (``1 <= k < V``, else -inf), P the
    smallest value whose mass strictly above it (over the values >= K) is < p (``p < 1``, else -inf); cut
    ``max(K, P)``.  ``near_tie``: a value's mass above lies within TIE of p."""
    v = len(row)
    s = sorted(row, reverse=True)
    kth = s[k - 1] if 1 <= k < v else -math.inf
    if p >= 1.0:
        return kth, False
    kept = [x for x in s if x >= kth]
    m = kept[0] if kept[0] != -math.inf else 0.0
    w = [math.exp(x - m) for x in kept]
    z = sum(w)
    above, cut, near = 0.0, -math.inf, False
    for i, (x, wx) in enumerate(zip(kept, w)):
        if i == 0 or x != kept[i - 1]:  # the mass strictly above a distinct value
            near |= abs(above / z - p) < TIE
            if above / z < p:
                cut = x
        above += wx
    return max(kth, cut), near


def _top_p_cut_ok(row: list[float], cut: float, p: float) -> bool:
    """Whether ``cut`` is a top-p cut of ``row`` (top_k off) up to TIE, in float64: the mass strictly above it is
    below ``p + TIE`` and the mass of the values ``>= cut`` reaches ``p - TIE`` -- what a near tie may return."""
    m = max(row)
    w = [(x, math.exp(x - m)) for x in row]
    z = sum(e for _, e in w)
    above = sum(e for x, e in w if x > cut) / z
    return above < p + TIE and above + sum(e for x, e in w if x == cut) / z >= p - TIE


def _rows(b: int, v: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(b, v, generator=g) * 3
    if b > 0:
        y[0, : v // 2] = float("-inf")  # min-p masks half the row
    if b > 1:
        y[1] = torch.round(y[1])  # many ties
    if b > 2:
        y[2, :: 5] = 0.0
        y[2, 1:: 5] = -0.0  # signed zeros compare equal
    if b > 3:
        y[3] = 1.5  # one value everywhere
    return y


def _params(v: int, b: int):
    ks = [0, 1, 2, 20, 64, 65, 300, v - 1, v, v + 7]
    ps = [1.0, 0.95, 0.5, 0.01, 0.999, 0.8]
    top_k = torch.tensor([ks[(i * 3) % len(ks)] for i in range(b)], dtype=torch.int32)
    top_p = torch.tensor([ps[(i * 5 + 1) % len(ps)] for i in range(b)], dtype=torch.float32)
    return top_k, top_p


def _assert_cuts(y, top_k, top_p, skip, got):
    near_ties = 0
    for i in range(y.shape[0]):
        if skip[i]:
            assert got[i].item() == -math.inf, i
            continue
        want, near = _cut64(y[i].double().tolist(), int(top_k[i]), float(top_p[i]))
        near_ties += near
        if not near:
            assert got[i].item() == want, (i, int(top_k[i]), float(top_p[i]), got[i].item(), want)
    assert near_ties <= 1, f"{near_ties} near ties: the data no longer tests the cut"


def test_reference_is_the_definition_and_the_full_sort_sampler():
    y = _rows(24, 700, 0)
    top_k, top_p = _params(700, 24)
    skip = torch.zeros(24, dtype=torch.bool)
    skip[5] = True
    cut = sampling_cut_reference(y, top_k, top_p, skip)
    _assert_cuts(y, top_k, top_p, skip, cut)
    rows = [{"temperature": 1.0, "top_k": int(top_k[i]), "top_p": float(top_p[i]), "seed": i} for i in range(24)]
    _, filtered = filter_logits(y, SamplingTensors.from_resolved(rows, 24))  # CPU: the full sort
    live = ~skip
    assert torch.equal(filtered[live], y.masked_fill(y < cut[:, None], float("-inf"))[live])


def test_prefix_route_equals_the_full_sort(monkeypatch):
    """The CUDA route (top ``n`` values, the op for the rows they do not decide) run on CPU."""
    from ignition.components import sampling

    y = _rows(24, 700, 1)
    top_k, top_p = _params(700, 24)
    rows = [{"temperature": 1.0, "top_k": int(top_k[i]), "top_p": float(top_p[i]), "seed": i} for i in range(24)]
    params = SamplingTensors.from_resolved(rows, 24)
    full = sampling_cut_reference(y, top_k, top_p, torch.zeros(24, dtype=torch.bool))
    for n in (64, 1, 700):
        routed = sampling._prefix_cut(y, params, n, torch.zeros(24, dtype=torch.bool))
        for i in range(24):
            if routed[i] != full[i]:
                assert _cut64(y[i].double().tolist(), int(top_k[i]), float(top_p[i]))[1], (n, i)


def test_op_checks_arguments_and_compiles():
    y = _rows(3, 300, 2)
    top_k, top_p = _params(300, 3)
    skip = torch.zeros(3, dtype=torch.bool)
    with pytest.raises(ValueError, match="y must be"):
        sampling_cut(y.double(), top_k, top_p, skip)
    with pytest.raises(ValueError, match="top_k"):
        sampling_cut(y, top_k.long(), top_p, skip)
    with pytest.raises(ValueError, match="top_p"):
        sampling_cut(y, top_k, top_p[:2], skip)
    with pytest.raises(ValueError, match="skip"):
        sampling_cut(y, top_k, top_p, skip.int())
    fn = torch.compile(lambda *a: sampling_cut(*a) * 2.0, backend="aot_eager", fullgraph=True)
    assert torch.equal(fn(y, top_k, top_p, skip), sampling_cut(y, top_k, top_p, skip) * 2.0)


@interpreter
@pytest.mark.parametrize("b,v,block", [(12, 2000, 512), (5, 777, 256), (1, 64, 64), (0, 100, 64)])
def test_triton_kernel_is_the_definition(b, v, block):
    from ignition.components.kernels.sampling_cut import sampling_cut_triton

    y = _rows(b, v, v + block)
    top_k, top_p = _params(v, b)
    skip = torch.zeros(b, dtype=torch.bool)
    if b > 6:
        skip[6] = True
    got = sampling_cut_triton(y, top_k, top_p, skip, block=block)
    assert got.shape == (b,) and got.dtype == torch.float32
    _assert_cuts(y, top_k, top_p, skip, got)
    ref = sampling_cut_reference(y, top_k, top_p, skip)
    exact = (top_p >= 1.0) | skip  # top-k alone: counts, no rounding
    assert torch.equal(got[exact], ref[exact])


@interpreter
@pytest.mark.parametrize("b,v,chunk,cap,buffer,ends", [(12, 2000, 256, 2048, 2048, False),
                                                       (12, 2000, 256, 64, 512, True), (12, 2000, 256, 16, 64, True),
                                                       (5, 777, 128, 256, 256, False), (1, 64, 64, 64, 64, False),
                                                       (0, 100, 64, 64, 64, False)])
def test_compact_kernels_are_the_definition(b, v, chunk, cap, buffer, ends):
    """``flare::sampling_cut_compact``'s five launches against the definition (the rows and mixes above), with
    chunks that do not divide the row and caps small enough that each of its three ends runs: survivors sorted (at
    most ``cap``), searched in the buffer (at most ``buffer``), the whole row searched (more)."""
    from ignition.components.kernels.sampling_cut import sampling_cut_compact_triton

    y = _rows(b, v, v + chunk)
    top_k, top_p = _params(v, b)
    skip = torch.zeros(b, dtype=torch.bool)
    if b > 6:
        skip[6] = True
    plan = torch.zeros((b, 4), dtype=torch.int32)
    got = sampling_cut_compact_triton(y, top_k, top_p, skip, chunk=chunk, cap=cap, buffer=buffer, block=256,
                                      plan=plan)
    assert got.shape == (b,) and got.dtype == torch.float32
    _assert_cuts(y, top_k, top_p, skip, got)
    ref = sampling_cut_reference(y, top_k, top_p, skip)
    exact = (top_p >= 1.0) | skip  # top-k alone: counts, no rounding
    assert torch.equal(got[exact], ref[exact])
    cuts = (((top_k >= 1) & (top_k < v)) | (top_p < 1.0)) & ~skip
    survivors = plan[:, 1][cuts].tolist()
    if ends:  # every end runs
        assert min(survivors) <= cap and any(cap < n <= buffer for n in survivors) and max(survivors) > buffer
    for i in range(b):
        if cuts[i]:
            _assert_window(y[i], plan[i], int(top_k[i]))


def _assert_window(row: torch.Tensor, plan: torch.Tensor, k: int) -> None:
    """A row's plan ``(last bin, window count, first bin, count above)``: the window is a run of the row sorted
    (ties never split), the count above it is its values in earlier bins, a top-k row's window starts at the row max
    and reaches the k-th."""
    from ignition.components.kernels.sampling_cut import SAMPLING_CUT_BINS, SAMPLING_CUT_INV_W

    last, n, first, above = plan.tolist()
    v = row.numel()
    s = torch.sort(row, descending=True).values
    assert first <= last and n + above <= v, plan.tolist()
    assert above == 0 or s[above - 1] > s[above], plan.tolist()
    assert above + n == v or s[above + n - 1] > s[above + n], plan.tolist()
    m = row.max() if row.max() > float("-inf") else torch.tensor(0.0)
    bins = torch.clamp((m - row) * SAMPLING_CUT_INV_W, max=SAMPLING_CUT_BINS - 1.0).to(torch.int32)
    assert int((bins < first).sum()) == above and int(((bins >= first) & (bins <= last)).sum()) == n, plan.tolist()
    if 1 <= k < v:
        assert first == 0 and n >= k, plan.tolist()


@interpreter
def test_compact_kernels_on_peaked_and_flat_rows():
    """Rows shaped like a language model's (a few logits far above a flat bulk, at several temperatures) and flat
    ones, random top_k / top_p: the compacted cut is the definition up to top-p near ties, whichever end decides."""
    from ignition.components.kernels.sampling_cut import sampling_cut_compact_triton

    g = torch.Generator().manual_seed(11)
    b, v = 16, 1500
    y = torch.randn(b, v, generator=g)
    for r in range(b):
        head = torch.randint(0, v, (1 + r % 7,), generator=g)
        y[r, head] += torch.rand(len(head), generator=g) * 12  # a few values far above the rest
        y[r] /= [0.3, 0.7, 1.0, 2.0][r % 4]  # temperatures
    top_k = torch.randint(0, 80, (b,), generator=g, dtype=torch.int32) * (torch.arange(b) % 3 != 0)
    top_p = torch.tensor([0.5, 0.9, 0.95, 0.99, 1.0, 0.8, 0.3, 0.999] * 2)
    skip = torch.zeros(b, dtype=torch.bool)
    plan = torch.zeros((b, 4), dtype=torch.int32)
    got = sampling_cut_compact_triton(y, top_k.to(torch.int32), top_p, skip, chunk=256, cap=16, buffer=64,
                                      block=256, plan=plan)
    _assert_cuts(y, top_k, top_p, skip, got)
    cuts = ((top_k >= 1) | (top_p < 1.0)).tolist()
    ends = {0 if n <= 16 else 1 if n <= 64 else 2 for n, c in zip(plan[:, 1].tolist(), cuts) if c}
    assert ends == {0, 1, 2}, plan[:, 1].tolist()
    for i in range(b):
        if cuts[i]:
            _assert_window(y[i], plan[i], int(top_k[i]))


@interpreter
def test_compact_kernels_skip_the_rows_below_skip_below_as_the_mask_does():
    """``skip_below``: ``skip`` float32 (the sampler's temperatures) and the rows below it skipped by the kernels
    themselves -- the same cuts, bit for bit, as the launch given the mask ``skip < skip_below`` (a NaN is not below:
    cut), and the op's CPU path the reference of that mask; a bool ``skip`` with ``skip_below`` names itself."""
    from ignition.components.kernels.sampling_cut import sampling_cut_compact_triton
    from ignition.components.sampling import GREEDY_EPS
    from ignition.components.sampling_cut import sampling_cut_compact

    b, v = 6, 900
    y = _rows(b, v, 5)
    top_k, top_p = _params(v, b)
    temperature = torch.tensor([0.0, 0.7, 1e-7, float("nan"), 1.0, GREEDY_EPS])
    mask = temperature < GREEDY_EPS
    assert mask.tolist() == [True, False, True, False, False, False]
    want = sampling_cut_compact_triton(y, top_k, top_p, mask, chunk=256)
    got = sampling_cut_compact_triton(y, top_k, top_p, temperature, skip_below=GREEDY_EPS, chunk=256)
    assert torch.equal(got, want) and torch.isinf(got[mask]).all() and got[~mask].isfinite().any()
    assert torch.equal(sampling_cut_compact(y, top_k, top_p, temperature, GREEDY_EPS),
                       sampling_cut_reference(y, top_k, top_p, mask))
    with pytest.raises(ValueError, match="skip must be a .*float32"):
        sampling_cut_compact(y, top_k, top_p, mask, GREEDY_EPS)


def test_compact_op_checks_arguments_compiles_and_routes(monkeypatch):
    """``flare::sampling_cut_compact``: its CPU path is the reference, bad arguments name themselves, it traces, and
    the sampler takes it on CUDA by default, ``FLARE_SAMPLER_SORT_FREE=0`` the full sort (CPU rows: the full sort
    either way)."""
    from ignition.components.sampling_cut import SORT_FREE, sampling_cut_compact, sort_free

    y = _rows(3, 300, 2)
    top_k, top_p = _params(300, 3)
    skip = torch.zeros(3, dtype=torch.bool)
    assert torch.equal(sampling_cut_compact(y, top_k, top_p, skip), sampling_cut_reference(y, top_k, top_p, skip))
    with pytest.raises(ValueError, match="top_p"):
        sampling_cut_compact(y, top_k, top_p[:2], skip)
    fn = torch.compile(lambda *a: sampling_cut_compact(*a) * 2.0, backend="aot_eager", fullgraph=True)
    assert torch.equal(fn(y, top_k, top_p, skip), sampling_cut_reference(y, top_k, top_p, skip) * 2.0)
    assert SORT_FREE and sort_free()
    monkeypatch.setenv("FLARE_SAMPLER_SORT_FREE", "0")
    assert not sort_free()
    monkeypatch.setenv("FLARE_SAMPLER_SORT_FREE", "1")
    assert sort_free()
    rows = [{"temperature": 1.0, "top_k": int(top_k[i]), "top_p": float(top_p[i]), "seed": i} for i in range(3)]
    _, filtered = filter_logits(y, SamplingTensors.from_resolved(rows, 3))
    from ignition.components.sampling import cut_of

    with pytest.raises(ValueError, match="skip or skip_greedy"):
        cut_of(y, SamplingTensors.from_resolved(rows, 3), skip, skip_greedy=True)
    cut = sampling_cut_reference(y, top_k, top_p, skip)
    assert torch.equal(filtered, y.masked_fill(y < cut[:, None], float("-inf")))


def _sorted_cases(b: int, v: int, seed: int):
    """Rows of :func:`_rows` sorted descending, with top_k / top_p mixes: the full-sort route's input."""
    y = _rows(b, v, seed)
    top_k, top_p = _params(v, b)
    return y, torch.sort(y, dim=-1, descending=True).values, top_k, top_p


def test_sorted_cut_op_checks_arguments_compiles_and_routes(monkeypatch):
    """``flare::sorted_cut``: its CPU path is the reference; bad arguments name themselves; it traces under
    torch.compile; ``sorted_cut`` takes it only on CUDA (by default; the reference otherwise)."""
    y, s, top_k, top_p = _sorted_cases(6, 300, 3)
    assert torch.equal(sorted_cut_op(top_k, top_p, s), sorted_cut_reference(top_k, top_p, s))
    with pytest.raises(ValueError, match="sorted_desc must be"):
        sorted_cut_op(top_k, top_p, s.double())
    with pytest.raises(ValueError, match="sorted_desc must be"):
        sorted_cut_op(top_k, top_p, s[:, :0])
    with pytest.raises(ValueError, match="top_k"):
        sorted_cut_op(top_k.long(), top_p, s)
    with pytest.raises(ValueError, match="top_p"):
        sorted_cut_op(top_k, top_p[:3], s)
    fn = torch.compile(lambda *a: sorted_cut_op(*a) * 2.0, backend="aot_eager", fullgraph=True)
    assert torch.equal(fn(top_k, top_p, s), sorted_cut_reference(top_k, top_p, s) * 2.0)
    monkeypatch.setenv("FLARE_SORTED_CUT_KERNEL", "1")  # CPU tensors: still the reference, traced inline
    assert torch.equal(sorted_cut(top_k, top_p, s), sorted_cut_reference(top_k, top_p, s))


@interpreter
@pytest.mark.parametrize("block", [64, 128])
def test_sorted_cut_kernel_takes_the_values_tied_with_the_kth_past_its_blocks(block):
    """The mass pass reads the blocks up to the k-th value, then every block holding values tied with it: here 150
    values tie at the k-th (top_k 50) and run past those blocks; without them the mass would be too small and top_p
    0.7 would cut at 4.0 instead of keeping every tie (the reference's 0.0).  Rows 1-2: the same ties with top_p 1
    (no pass) and top_k off (the whole row)."""
    from ignition.components.kernels.sampling_cut import sorted_cut_triton

    row = torch.tensor([5.0, 4.0, 3.0] + [0.0] * 150 + [-1.0] * 300)
    s = row.repeat(3, 1)
    top_k = torch.tensor([50, 50, 0], dtype=torch.int32)
    top_p = torch.tensor([0.7, 1.0, 0.7])
    ref = sorted_cut_reference(top_k, top_p, s)
    assert ref.tolist() == [0.0, 0.0, 0.0]
    assert torch.equal(sorted_cut_triton(top_k, top_p, s, block=block, scan=32), ref)


@interpreter
@pytest.mark.parametrize("b,v,block", [(12, 2000, 256), (5, 777, 128), (24, 700, 1024), (3, 64, 64), (0, 50, 64)])
def test_sorted_cut_kernel_is_the_reference_up_to_top_p_near_ties(b, v, block):
    """The one-program-per-row kernel on sorted rows (several blocks, a masked tail, ties, -inf, signed zeros, a
    constant row, top_k off / at / beyond the row, top_p 1 and below): the reference's cut, except where the mass
    above a value is within rounding of top_p (``_cut64``'s near ties); top-k alone exact."""
    from ignition.components.kernels.sampling_cut import sorted_cut_triton

    y, s, top_k, top_p = _sorted_cases(b, v, v + block)
    got = sorted_cut_triton(top_k, top_p, s, block=block, scan=max(16, block // 4))
    ref = sorted_cut_reference(top_k, top_p, s)
    assert got.shape == (b,) and got.dtype == torch.float32
    for i in range(b):
        if got[i] != ref[i]:
            assert _cut64(y[i].double().tolist(), int(top_k[i]), float(top_p[i]))[1], (i, got[i], ref[i])
    exact = top_p >= 1.0
    assert torch.equal(got[exact], ref[exact])
    if b:  # the bounded route's input: each row's top 64 values with 1 <= top_k <= 64
        k64 = top_k.clamp(1, 64)
        got64 = sorted_cut_triton(k64, top_p, s[:, :64], block=min(block, 32), scan=16)
        ref64 = sorted_cut_reference(k64, top_p, s[:, :64])
        for i in range(b):
            if got64[i] != ref64[i]:
                assert _cut64(s[i, :64].double().tolist(), int(k64[i]), float(top_p[i]))[1], (i, got64[i], ref64[i])


@interpreter
def test_compact_window_of_flat_rows():
    """Flat rows (high temperatures), top_k off: the nucleus holds most of the row, far more than the buffer, yet the
    plan's window of possible cut values fits it -- no row falls back to the whole-row search -- and the cut is the
    definition up to top-p near ties."""
    from ignition.components.kernels.sampling_cut import sampling_cut_compact_triton

    g = torch.Generator().manual_seed(5)
    b, v, buffer = 9, 4096, 512
    y = torch.randn(b, v, generator=g) * torch.tensor([0.5, 1.0, 2.0] * 3)[:, None]
    top_k = torch.zeros(b, dtype=torch.int32)
    top_p = torch.tensor([0.9] * 3 + [0.95] * 3 + [0.99] * 3)
    skip = torch.zeros(b, dtype=torch.bool)
    plan = torch.zeros((b, 4), dtype=torch.int32)
    got = sampling_cut_compact_triton(y, top_k, top_p, skip, chunk=256, cap=64, buffer=buffer, block=256, plan=plan)
    ref = sampling_cut_reference(y, top_k, top_p, skip)
    exact = 0
    for i in range(b):
        # deep in a flat row's tail many values' masses above lie within TIE of top_p (fp32 decides): those rows
        # are checked for their window only
        want, near = _cut64(y[i].double().tolist(), 0, float(top_p[i]))
        if not near:
            assert got[i].item() == want, (i, got[i].item(), want)
            exact += 1
        assert _top_p_cut_ok(y[i].double().tolist(), got[i].item(), float(top_p[i])), (i, got[i].item(), want)
        _assert_window(y[i], plan[i], 0)
        nucleus = int((y[i] >= ref[i]).sum())
        assert int(plan[i, 1]) <= buffer < nucleus, (i, plan[i].tolist(), nucleus)
    assert exact >= 5, exact
