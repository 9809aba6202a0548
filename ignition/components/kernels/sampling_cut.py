"""The sampler's cut without a sort (``flare::sampling_cut``, ``ignition/components/sampling_cut.py``): one
program per row, the compacted many-programs variant, and the cut of rows already sorted."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignition.components.kernels.launch import SAMPLER_PDL, _interpreting, _pdl_enter, pdl_if
from ignition.components.kernels.sampler_done import _all_rows_done


# ------------------------------------------------------------------------------------------------------------
# The sampler's cut without a sort (``flare::sampling_cut``, ``ignition/components/sampling_cut.py``, which states
# the semantics).  One program per row.  Values become 32-bit order-preserving keys (uint32: a
# non-negative float's bits with the sign bit set, a negative float's bits inverted; -0.0 keyed as +0.0, so key
# order is float order).  ``_cut_search`` finds the largest key ``t`` whose statistic over the keys ``>= t`` (and
# ``>= lo``) reaches ``target`` -- the count (top-k) or the mass ``exp(y - m)`` (top-p) -- two bits per pass from
# the top: a pass reads the values whose keys share the bits chosen so far and sums the statistic of those whose
# next two bits are >= j (j = 1, 2, 3); the largest j whose sum plus the statistic of the values already known to
# lie above reaches the target is chosen, and the values above it join those above.  A pass whose values are at
# most half of the previous pass's copies them (compacted, in read order) into the row's workspace as it reads, and
# later passes read only those; a copy never overtakes the reads of its own pass (a value's new position is at most
# its old one), and a CTA barrier after each pass orders its copies before the next pass's reads.  Every sum runs
# over the same values in the same order in every process: the result is a pure function of the row.
# Measured on the H200 (``scripts/bench_sampler.py``; one 151,936-value row, top-p 0.95 without top-k): one bit per
# pass with CTA-wide sums after every block took 647 us (run 43), two bits per pass 605 us (run 44), sums per thread
# reduced once per pass 480 us (run 45), range() loops 447 us (run 46; top_k 1000: 339 us) -- the sort it replaces
# takes 92 us, so the sampler leaves this route off by default (``sampling_cut.GENERAL_PREFIX``).  Not found yet:
# where those ~25 us per pass go (a full-row pass should take ~4 us on one SM).


@triton.jit
def _cut_key(x):
    """The order-preserving key (uint32) of fp32 ``x`` (no NaN); -0.0 keyed as +0.0."""
    i = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return ((i ^ ((i >> 31) & 0x7FFFFFFF)) ^ -2147483648).to(tl.uint32, bitcast=True)


@triton.jit
def _cut_value(t):
    """The fp32 value of key ``t`` (``_cut_key``'s inverse)."""
    s = t.to(tl.int32, bitcast=True) ^ -2147483648
    return (s ^ ((s >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _cut_block(src, offs, n, lo, prefix, shift, jj):
    """One block of a search pass: ``(x, match [BLOCK], ge [BLOCK, 4])`` -- the values, those in play (keys ``>= lo``
    sharing ``prefix`` above bit ``shift + 2``), and those of them whose next two key bits are ``>= j``."""
    x = tl.load(src + offs, mask=offs < n, other=float("-inf"))
    key = _cut_key(x)
    match = (offs < n) & (key >= lo) & ((key >> (shift + 2)) == prefix)
    return x, match, match[:, None] & (((key >> shift) & 3)[:, None] >= jj[None, :])


@triton.jit
def _cut_add(acc_stat, acc_count, x, ge, m, MASS: tl.constexpr):
    """A block's share of a pass's per-thread sums: the mass ``exp(x - m)`` (``MASS``) and the count of ``ge``."""
    if MASS:
        acc_stat += tl.where(ge, tl.exp(x - m)[:, None], 0.0)
    return acc_stat, acc_count + ge.to(tl.int32)


@triton.jit
def _cut_search(Y, WS, V, lo, m, target, MASS: tl.constexpr, BLOCK: tl.constexpr, PIPELINE: tl.constexpr):
    """The largest key ``t`` whose statistic over the values with key ``>= max(t, lo)`` reaches ``target``: their
    count (``MASS`` False, int32 ``target``) or the sum of ``exp(y - m)`` (``MASS``, fp32).  ``Y``: the row,
    ``WS``: its workspace (``V`` fp32).  Two bits per pass: the statistic of the values in play whose next two key
    bits are ``>= j`` for j = 0..3, and the largest ``j`` whose sum with ``above`` reaches the target."""
    offs0 = tl.arange(0, BLOCK)
    jj = tl.arange(0, 4)
    t = lo * 0
    above = target * 0  # the statistic of the values whose keys lie above every key still in play
    src = Y
    n = V  # values in play: src[0 .. n-1] (those sharing t's chosen bits and >= lo among them)
    expect = V  # of which share the bits chosen so far (the previous pass's side)
    for step in range(16):
        shift = 30 - 2 * step
        prefix = t >> (shift + 2)
        compact = expect * 2 <= n
        # per-thread sums over the pass, one CTA-wide reduction after it (none per block: they were the pass's cost)
        acc_stat = tl.zeros([BLOCK, 4], dtype=target.dtype)
        acc_count = tl.zeros([BLOCK, 4], dtype=tl.int32)
        base = 0
        if compact | (not PIPELINE):  # a while loop: copies (a scan per block) or the interpreter (no tensor range)
            start = 0
            while start < n:
                x, match, ge = _cut_block(src, start + offs0, n, lo, prefix, shift, jj)
                if compact:  # the values in play, after those this pass has matched so far
                    tl.store(WS + base + tl.cumsum(match.to(tl.int32), axis=0) - 1, x, mask=match)
                    base += tl.sum(match.to(tl.int32), axis=0)
                acc_stat, acc_count = _cut_add(acc_stat, acc_count, x, ge, m, MASS)
                start += BLOCK
        else:  # compiled, no copies: a range() loop, software-pipelined (a while loop waits for each block's loads)
            for start in range(0, n, BLOCK):
                x, match, ge = _cut_block(src, start + offs0, n, lo, prefix, shift, jj)
                acc_stat, acc_count = _cut_add(acc_stat, acc_count, x, ge, m, MASS)
        count = tl.sum(acc_count, axis=0)
        if MASS:
            stat = tl.sum(acc_stat, axis=0)
        else:
            stat = count
        if compact:
            src = WS
            n = tl.sum(tl.where(jj == 0, count, 0), axis=0)
        tl.debug_barrier()  # this pass's copies before the next pass's reads
        j = tl.max(tl.where((jj >= 1) & (above + stat >= target), jj, 0), axis=0)
        above += tl.sum(tl.where(jj == j + 1, stat, 0), axis=0)
        expect = tl.sum(tl.where(jj == j, count, 0), axis=0) - tl.sum(tl.where(jj == j + 1, count, 0), axis=0)
        t += j.to(tl.uint32) << shift
    return t


@triton.jit
def _cut_row_needs(TOPK, TOPP, SKIP, b, V, SKIP_BELOW: tl.constexpr = None):
    """``(k, p, need_k, need_p)`` of row ``b``: whether it cuts by top-k (``1 <= k < V``) and by top-p (``p < 1``);
    both False for a skipped row: ``SKIP`` nonzero, or with ``SKIP_BELOW`` (``SKIP`` float32) below it."""
    k = tl.load(TOPK + b)
    p = tl.load(TOPP + b)
    if SKIP_BELOW is None:
        live = tl.load(SKIP + b).to(tl.int32) == 0
    else:
        live = (tl.load(SKIP + b) < SKIP_BELOW).to(tl.int32) == 0
    return k, p, live & (k >= 1) & (k < V), live & (p < 1.0)


@triton.jit
def _cut_mass(src, n, lo, m, BLOCK: tl.constexpr, PIPELINE: tl.constexpr):
    """``sum exp(x - m)`` over the ``n`` values of ``src`` whose keys are ``>= lo``, in blocks of BLOCK (compiled: a
    pipelined ``range`` loop; the interpreter: a ``while`` loop over the same blocks)."""
    offs0 = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    if PIPELINE:
        for start in range(0, n, BLOCK):
            x = tl.load(src + start + offs0, mask=start + offs0 < n, other=float("-inf"))
            acc += tl.where((start + offs0 < n) & (_cut_key(x) >= lo), tl.exp(x - m), 0.0)
    else:
        start = 0
        while start < n:
            x = tl.load(src + start + offs0, mask=start + offs0 < n, other=float("-inf"))
            acc += tl.where((start + offs0 < n) & (_cut_key(x) >= lo), tl.exp(x - m), 0.0)
            start += BLOCK
    return tl.sum(acc, axis=0)


@triton.jit
def _cut_row_search(row, ws, V, k, p, need_k, need_p, BLOCK: tl.constexpr, PIPELINE: tl.constexpr,
                    NB: tl.constexpr):
    """The cut of one row by the bit searches above (``-inf`` when neither is needed): ``K`` by count, then the row
    max, ``Z`` over the values ``>= K`` and ``P`` by mass."""
    offs0 = tl.arange(0, BLOCK)
    cut = float("-inf")
    lo = tl.full((), 0, tl.uint32)
    if need_k:
        lo = _cut_search(row, ws, V, lo, 0.0, k, False, BLOCK, PIPELINE)
        cut = _cut_value(lo)
    if need_p:
        m_acc = tl.full([BLOCK], float("-inf"), tl.float32)
        for i in range(0, tl.cdiv(V, BLOCK) if PIPELINE else NB):  # the interpreter: NB, the same trip count
            offs = i * BLOCK + offs0
            m_acc = tl.maximum(m_acc, tl.load(row + offs, mask=offs < V, other=float("-inf")))
        m = tl.max(m_acc, axis=0)
        m = tl.where(m == float("-inf"), 0.0, m)
        z = _cut_mass(row, V, lo, m, BLOCK, PIPELINE)
        tl.debug_barrier()  # the top-k search's workspace copies are read no more
        cut = _cut_value(_cut_search(row, ws, V, lo, m, p * z, True, BLOCK, PIPELINE))
    return cut


@triton.jit
def _sampling_cut_kernel(Y, TOPK, TOPP, SKIP, CUT, WS, V, stride_y, BLOCK: tl.constexpr, PIPELINE: tl.constexpr,
                         NB: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    k, p, need_k, need_p = _cut_row_needs(TOPK, TOPP, SKIP, b, V)
    tl.store(CUT + b, _cut_row_search(Y + b * stride_y, WS + b * V, V, k, p, need_k, need_p, BLOCK, PIPELINE, NB))


#: Values per block of :func:`sampling_cut_triton`'s passes and its warps: 4 values per thread, 128 registers and 12
#: bytes spilled (offline sm90 ptxas); run 46 timed 8 warps (227 registers, none spilled) within 3 % of it.
SAMPLING_CUT_BLOCK = 2048
SAMPLING_CUT_WARPS = 16


def sampling_cut_triton(y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, skip: torch.Tensor,
                        block: int = SAMPLING_CUT_BLOCK, num_warps: int = SAMPLING_CUT_WARPS) -> torch.Tensor:
    """``flare::sampling_cut`` on the GPU (or the interpreter): one program per row (see above).  Shapes are checked
    by the op (``sampling_cut.py``)."""
    y, cut, loop = _row_cut_setup(y, block)
    b, v = y.shape
    if b:
        ws = torch.empty((b, v), dtype=torch.float32, device=y.device)
        _sampling_cut_kernel[(b,)](y, top_k.contiguous(), top_p.contiguous(), skip.contiguous(), cut, ws, v,
                                   y.stride(0), **loop, num_warps=num_warps)
    return cut


def _row_cut_setup(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """For the one-program-per-row cut kernels: ``x [B, n]`` with contiguous rows, the ``[B]`` fp32 output, and the
    loop's launch constants (``BLOCK``; compiled, a ``range`` over the row; the interpreter, ``NB`` blocks)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    blk = min(block, triton.next_power_of_2(x.shape[1]))
    loop = dict(BLOCK=blk, PIPELINE=not _interpreting(), NB=triton.cdiv(x.shape[1], blk) if _interpreting() else 0)
    return x, torch.empty((x.shape[0],), dtype=torch.float32, device=x.device), loop


# ------------------------------------------------------------------------------------------------------------
# The same cut over many programs per row, compacted (``sampling_cut_compact_triton``: ``flare::sampling_cut_compact``,
# the general sampler's cut on CUDA unless ``FLARE_SAMPLER_SORT_FREE=0``).  The one-program searches above are
# compute-bound on one SM (each pass touches every value of the row).  Here five launches, each skipping the rows
# without a cut:
#
# 1. grid (B, C chunks of CHUNK values): each chunk's max ``m_c`` and ``z_c = sum exp(y - m_c)``;
# 2. grid (B, C): the row max ``m`` (from the C maxima) and each chunk's count histogram of the bins
#    ``min(floor((m - y) * INV_W), NBINS - 1)`` (``tl.histogram``: exact counts; bin 0 holds the largest values);
# 3. grid (B,): the plan -- the histograms summed over chunks.  Top-k rows: the bin ``j`` that holds the k-th largest
#    value; the window is bins ``0 .. j`` (the row's largest values, ties included).  Top-p rows without top-k: each
#    bin's mass lies between count * exp(-(j + 1 + MARGIN) / INV_W) and count * exp(-(j - MARGIN) / INV_W)
#    (relative to the row max m; MARGIN of a bin each way for rounding), so bounds of the mass through each bin and
#    below it, against ``top_p * Z`` and ``(1 - top_p) * Z`` (``Z = sum z_c exp(m_c - m)``), give the first and the
#    last bin that can hold the cut -- the window, whose values are a run of the row sorted (the bounds differ by
#    ``(1 + 2 MARGIN) / INV_W`` nats: a few percent of a flat row's values, not its whole nucleus); and each chunk's
#    offset among the window's values;
# 4. grid (B, C): each chunk copies its window values in order to the row's buffer and stores the mass of its values
#    above the window;
# 5. grid (B,): up to CAP window values sorted (``tl.sort``), the k-th value read at k - 1, and the top-p threshold the
#    first value where the mass above the window (the chunks' sums in chunk order) plus the cumulative mass reaches
#    ``top_p * Z`` (top-k rows: Z over the values ``>= K``, from the buffer; else the row's Z); up to BUFFER of them,
#    the one-program searches above over them (the mass target less the mass above).  Rows whose window exceeds
#    BUFFER, or whose window does not hold the cut (rounding), take the searches on the whole row -- the same cut,
#    slower.
#
# Counts are exact, so K is the definition's; the masses are fp32 sums in this pipeline's own fixed order (the same
# every run), so P can differ from the sorted reference's only where the mass above a value is within rounding of
# ``top_p``.  Measured on the H200: ``sampling_cut.SORT_FREE``.


@triton.jit
def _cut_row_m_z(MC, ZC, b, C: tl.constexpr, CP: tl.constexpr):
    """``(m, Z)`` of row ``b`` from its C chunks' ``(m_c, z_c)``: the max (0 for a row of -inf) and
    ``sum z_c exp(m_c - m)`` in chunk order's tree."""
    offs = tl.arange(0, CP)
    mc = tl.load(MC + b * C + offs, mask=offs < C, other=float("-inf"))
    zc = tl.load(ZC + b * C + offs, mask=offs < C, other=0.0)
    m = tl.max(mc, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)
    return m, tl.sum(tl.where(offs < C, zc * tl.exp(mc - m), 0.0), axis=0)


@triton.jit
def _cut_bins(x, m, INV_W: tl.constexpr, NBINS: tl.constexpr):
    """The bin of each value: ``floor((m - x) * INV_W)``, at most ``NBINS - 1`` (-inf: the last); monotone in x."""
    return tl.minimum((m - x) * INV_W, NBINS - 1.0).to(tl.int32)


# Loads first: each launch of the compacted cut reads its row's parameters (top-k, top-p, the skip or temperature)
# together with its data -- the chunk, the chunk statistics, the plan, the window -- and a row that needs no cut
# computes from what it read and stores nothing (the stores masked; a skipped row's statistics, histogram and offsets,
# not its own, zeroed or replaced where a sum or a bin would use them).  Offline sm90 PTX before: every launch loaded
# its data only after a branch on those parameters, two L2 round trips in series after its PDL wait (the compact
# launch three: the plan's count too) -- five launches one after another on the sampler's critical path.  The same
# values, the same bits for every row that cuts.


@triton.jit
def _cut_chunk_stats_kernel(Y, TOPK, TOPP, SKIP, MC, ZC, V, stride_y, C: tl.constexpr, CHUNK: tl.constexpr,
                            USE_PDL: tl.constexpr = False, SKIP_BELOW: tl.constexpr = None,
                            MINP=None, B=1, BP: tl.constexpr = 1, SKIP_DONE: tl.constexpr = False):
    if SKIP_DONE:  # every row done after the front (sampler_done): return before the wait
        if _all_rows_done(SKIP, TOPK, TOPP, MINP, B, V, SKIP_BELOW, BP):
            return
    _pdl_enter(USE_PDL)  # kernels.launch.SAMPLER_PDL
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    _, _, need_k, need_p = _cut_row_needs(TOPK, TOPP, SKIP, b, V, SKIP_BELOW)
    need = need_k | need_p
    offs = c * CHUNK + tl.arange(0, CHUNK)  # every load with the row's needs, the stores theirs (loads first, above)
    x = tl.load(Y + b * stride_y + offs, mask=offs < V, other=float("-inf"))
    mc = tl.max(x, axis=0)
    tl.store(MC + b * C + c, mc, mask=need)
    tl.store(ZC + b * C + c, tl.sum(tl.exp(x - tl.where(mc == float("-inf"), 0.0, mc)), axis=0), mask=need)


@triton.jit
def _cut_chunk_hist_kernel(Y, TOPK, TOPP, SKIP, MC, ZC, H, V, stride_y, C: tl.constexpr, CP: tl.constexpr,
                           CHUNK: tl.constexpr, NBINS: tl.constexpr, INV_W: tl.constexpr,
                           USE_PDL: tl.constexpr = False, SKIP_BELOW: tl.constexpr = None,
                           MINP=None, B=1, BP: tl.constexpr = 1, SKIP_DONE: tl.constexpr = False):
    if SKIP_DONE:  # every row done after the front (sampler_done): return before the wait
        if _all_rows_done(SKIP, TOPK, TOPP, MINP, B, V, SKIP_BELOW, BP):
            return
    _pdl_enter(USE_PDL)  # kernels.launch.SAMPLER_PDL
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    _, _, need_k, need_p = _cut_row_needs(TOPK, TOPP, SKIP, b, V, SKIP_BELOW)
    need = need_k | need_p
    m, _ = _cut_row_m_z(MC, ZC, b, C, CP)  # (loads first, above; a skipped row's are not its own: +inf, every bin 511)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(Y + b * stride_y + offs, mask=offs < V, other=float("-inf"))
    hist = tl.histogram(_cut_bins(x, tl.where(need, m, float("inf")), INV_W, NBINS), NBINS, mask=(offs < V) & need)
    tl.store(H + (b * C + c) * NBINS + tl.arange(0, NBINS), hist, mask=need)


@triton.jit
def _cut_plan_kernel(TOPK, TOPP, SKIP, MC, ZC, H, PLAN, OFF, V, C: tl.constexpr, CP: tl.constexpr,
                     NBINS: tl.constexpr, INV_W: tl.constexpr, MARGIN: tl.constexpr,
                     USE_PDL: tl.constexpr = False, SKIP_BELOW: tl.constexpr = None,
                     MINP=None, B=1, BP: tl.constexpr = 1, SKIP_DONE: tl.constexpr = False):
    if SKIP_DONE:  # every row done after the front (sampler_done): return before the wait
        if _all_rows_done(SKIP, TOPK, TOPP, MINP, B, V, SKIP_BELOW, BP):
            return
    _pdl_enter(USE_PDL)  # kernels.launch.SAMPLER_PDL
    b = tl.program_id(0).to(tl.int64)
    k, p, need_k, need_p = _cut_row_needs(TOPK, TOPP, SKIP, b, V, SKIP_BELOW)
    need = need_k | need_p  # (loads first, above) a row that needs no cut computes from what it reads, stores nothing
    m, z = _cut_row_m_z(MC, ZC, b, C, CP)
    offs_c = tl.arange(0, CP)
    j = tl.arange(0, NBINS)
    hist = tl.load(H + (b * C + offs_c[:, None]) * NBINS + j[None, :], mask=(offs_c < C)[:, None], other=0)
    hist = tl.where(need, hist, 0)  # a skipped row's counts are not its own (the sums stay in range)
    total = tl.sum(hist, axis=0)  # [NBINS]
    cum = tl.cumsum(total, axis=0)
    bin_k = tl.min(tl.where(cum >= k, j, NBINS - 1), axis=0)
    # Top-p: the bin j* of the first value (largest first) at which the mass reaches p Z.  Bin j's values lie in
    # (m - (j + 1) / INV_W, m - j / INV_W] (the last bin: anything below), so its mass lies between count *
    # exp(-(j + 1 + MARGIN) / INV_W) and count * exp(-(j - MARGIN) / INV_W) -- MARGIN of a bin each way for the
    # rounding of the bins and of exp.  Those bounds of the mass through j and below j bound j* from both sides:
    # the window [first, last] (the final kernel checks that it holds the cut; else the whole row decides).
    jf = j.to(tl.float32)
    high = total.to(tl.float32) * tl.exp(-(jf - MARGIN) / INV_W)
    low = tl.where(j < NBINS - 1, total.to(tl.float32) * tl.exp(-(jf + 1.0 + MARGIN) / INV_W), 0.0)
    high_to, low_to = tl.cumsum(high, axis=0), tl.cumsum(low, axis=0)  # through bin j
    high_below, low_below = tl.sum(high, axis=0) - high_to, tl.sum(low, axis=0) - low_to  # below bin j
    tail = (1.0 - p) * z
    first_p = tl.maximum(tl.min(tl.where(high_to >= p * z, j, NBINS - 1), axis=0),
                         tl.min(tl.where(low_below <= tail, j, NBINS - 1), axis=0))
    last_p = tl.minimum(tl.min(tl.where(low_to >= p * z, j, NBINS - 1), axis=0),
                        tl.min(tl.where(high_below <= tail, j, NBINS - 1), axis=0))
    # top-k rows: every value down to the k-th's bin (their top-p mass is over the values >= the k-th)
    first = tl.where(need_k, 0, tl.minimum(first_p, last_p))
    last = tl.where(need_k, bin_k, last_p)
    window = (j[None, :] >= first) & (j[None, :] <= last)
    per_chunk = tl.sum(tl.where(window, hist, 0), axis=1)  # [CP] window values per chunk
    tl.store(PLAN + b * 4, last, mask=need)
    tl.store(PLAN + b * 4 + 1, tl.sum(per_chunk, axis=0), mask=need)
    tl.store(PLAN + b * 4 + 2, first, mask=need)
    tl.store(PLAN + b * 4 + 3, tl.sum(tl.where(j < first, total, 0), axis=0), mask=need)
    tl.store(OFF + b * C + offs_c, tl.cumsum(per_chunk, axis=0) - per_chunk, mask=need & (offs_c < C))


@triton.jit
def _cut_compact_kernel(Y, TOPK, TOPP, SKIP, MC, ZC, PLAN, OFF, BUF, MA, V, stride_y, C: tl.constexpr,
                        CP: tl.constexpr, CHUNK: tl.constexpr, NBINS: tl.constexpr, INV_W: tl.constexpr,
                        BUFN: tl.constexpr, USE_PDL: tl.constexpr = False, SKIP_BELOW: tl.constexpr = None,
                        MINP=None, B=1, BP: tl.constexpr = 1, SKIP_DONE: tl.constexpr = False):
    if SKIP_DONE:  # every row done after the front (sampler_done): return before the wait
        if _all_rows_done(SKIP, TOPK, TOPP, MINP, B, V, SKIP_BELOW, BP):
            return
    _pdl_enter(USE_PDL)  # kernels.launch.SAMPLER_PDL
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    _, _, need_k, need_p = _cut_row_needs(TOPK, TOPP, SKIP, b, V, SKIP_BELOW)
    # (loads first, above) a row that needs no cut, or whose window exceeds the buffer, stores nothing
    held = (need_k | need_p) & (tl.load(PLAN + b * 4 + 1) <= BUFN)
    m, _ = _cut_row_m_z(MC, ZC, b, C, CP)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(Y + b * stride_y + offs, mask=offs < V, other=float("-inf"))
    bins = _cut_bins(x, m, INV_W, NBINS)
    first = tl.load(PLAN + b * 4 + 2)
    keep = held & (offs < V) & (bins >= first) & (bins <= tl.load(PLAN + b * 4))
    at = tl.where(held, tl.load(OFF + b * C + c), 0) + tl.cumsum(keep.to(tl.int32), axis=0) - 1
    tl.store(BUF + b * BUFN + at, x, mask=keep)
    tl.store(MA + b * C + c, tl.sum(tl.where((offs < V) & (bins < first), tl.exp(x - m), 0.0), axis=0), mask=held)


@triton.jit
def _cut_final_kernel(Y, TOPK, TOPP, SKIP, MC, ZC, PLAN, BUF, MA, CUT, WS, V, stride_y, C: tl.constexpr,
                      CP: tl.constexpr, CAP: tl.constexpr, BUFN: tl.constexpr, BLOCK: tl.constexpr,
                      PIPELINE: tl.constexpr, NB: tl.constexpr, USE_PDL: tl.constexpr = False,
                      SKIP_BELOW: tl.constexpr = None,
                      MINP=None, B=1, BP: tl.constexpr = 1, SKIP_DONE: tl.constexpr = False):
    if SKIP_DONE:  # every row done after the front (sampler_done): return before the wait
        if _all_rows_done(SKIP, TOPK, TOPP, MINP, B, V, SKIP_BELOW, BP):
            return
    _pdl_enter(USE_PDL)  # kernels.launch.SAMPLER_PDL
    b = tl.program_id(0).to(tl.int64)
    k, p, need_k, need_p = _cut_row_needs(TOPK, TOPP, SKIP, b, V, SKIP_BELOW)
    cut = float("-inf")
    done = tl.full((), True, tl.int1)
    # (loads first, above) the window's count and values, the chunk statistics and the masses above the window: loaded
    # with the row's needs, used only where it cuts
    n = tl.load(PLAN + b * 4 + 1)
    m, z_row = _cut_row_m_z(MC, ZC, b, C, CP)
    src = BUF + b * BUFN
    offs_c = tl.arange(0, CP)
    mass_above = tl.load(MA + b * C + offs_c, mask=offs_c < C, other=0.0)
    i = tl.arange(0, CAP)
    window = tl.load(src + i)  # CAP <= BUFN: inside the row's buffer
    if need_k | need_p:
        done = n <= BUFN
        # the mass above the window (0 for top-k rows: their window starts at the row max), summed in chunk order
        above = tl.where(done, tl.sum(mass_above, axis=0), 0.0)
        if n <= CAP:  # a small window: sorted in registers
            s = tl.sort(tl.where(i < n, window, float("-inf")), descending=True)
            kth = tl.max(tl.where(need_k & (i == k - 1), s, float("-inf")), axis=0)
            cut = kth
            if need_p:
                w = tl.where((i < n) & (s >= kth), tl.exp(s - m), 0.0)
                z = tl.where(need_k, tl.sum(w, axis=0), z_row)
                first = tl.min(tl.where(above + tl.cumsum(w, axis=0) >= p * z, i, CAP), axis=0)
                # else the cut lies outside the window (rounding): the whole row decides
                done = (first < n) & (above < p * z)
                cut = tl.maximum(kth, tl.max(tl.where(i == first, s, float("-inf")), axis=0))
        elif done:  # more: the searches over the window (the values above it count in ``above``)
            lo = tl.full((), 0, tl.uint32)
            if need_k:
                lo = _cut_search(src, WS + b * V, n, lo, 0.0, k, False, BLOCK, PIPELINE)
                cut = _cut_value(lo)
            if need_p:
                held = _cut_mass(src, n, lo, m, BLOCK, PIPELINE)
                z = tl.where(need_k, held, z_row)
                done = (above + held >= p * z) & (above < p * z)
                if done:
                    tl.debug_barrier()  # the top-k search's workspace copies are read no more
                    cut = _cut_value(_cut_search(src, WS + b * V, n, lo, m, p * z - above, True, BLOCK, PIPELINE))
    if not done:
        cut = _cut_row_search(Y + b * stride_y, WS + b * V, V, k, p, need_k, need_p, BLOCK, PIPELINE, NB)
    tl.store(CUT + b, cut)


#: The compacted cut's constants (:func:`sampling_cut_compact_triton`): window values per row sorted by one program
#: at most (more: searched), window values per row compacted at most (more: the whole row searched), bins of
#: ``1 / INV_W`` nats below the row max and their count (32 nats; the last bin takes everything further down; the
#: plan holds all chunks' counts in registers, 16 warps), the fraction of a bin the top-p mass bounds allow for
#: rounding, and the largest chunk count per row (the chunk grows with the vocabulary beyond ``CHUNKS * 4096``).
SAMPLING_CUT_CAP = 2048
SAMPLING_CUT_BUFFER = 16384
SAMPLING_CUT_INV_W = 16
SAMPLING_CUT_BINS = 512
SAMPLING_CUT_MARGIN = 0.125
SAMPLING_CUT_CHUNKS = 64


def sampling_cut_compact_triton(y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, skip: torch.Tensor,
                                *, skip_below: float | None = None, chunk: int | None = None,
                                cap: int = SAMPLING_CUT_CAP, buffer: int = SAMPLING_CUT_BUFFER,
                                block: int = SAMPLING_CUT_BLOCK, plan: torch.Tensor | None = None,
                                min_p: torch.Tensor | None = None) -> torch.Tensor:
    """``flare::sampling_cut_compact`` on the GPU (or the interpreter): the cut of :func:`sampling_cut_triton` over
    many programs per row (see above).
    ``chunk`` / ``cap`` / ``buffer`` (powers of two): values per chunk (default: at least 4096, at most
    :data:`SAMPLING_CUT_CHUNKS` chunks), the window values sorted at most and compacted at most; ``plan``: an
    optional ``[B, 4]`` int32 that receives each row's last bin, window count, first bin and count of values above
    the window (tests: which rows took the buffer, and what it held); ``block``: the searches' block (rows whose
    window exceeds ``cap``); ``skip_below``: ``skip`` is float32, and the rows below it are skipped (the op's);
    ``min_p`` (``[B]`` float32, with ``skip_below``): the launches return before their PDL wait when every row is
    done after the sampler's front (``sampler_done``; ``flare::sample_advance_into_``) -- the cut then not written.
    Shapes are checked by the op."""
    y, cut, loop = _row_cut_setup(y, block)
    b, v = y.shape
    chunk = chunk or max(4096, triton.next_power_of_2(triton.cdiv(v, SAMPLING_CUT_CHUNKS)))
    if chunk & (chunk - 1) or cap & (cap - 1) or buffer & (buffer - 1) or cap > buffer:
        raise ValueError(f"sampling_cut_compact_triton: chunk {chunk}, cap {cap} and buffer {buffer} must be powers "
                         "of two, cap <= buffer")
    c = triton.cdiv(v, chunk)
    plan = torch.empty((b, 4), dtype=torch.int32, device=y.device) if plan is None else plan  # rows with a cut only
    if b == 0:
        return cut
    f32 = dict(dtype=torch.float32, device=y.device)
    mc, zc, ma, buf, ws = (torch.empty((b, c), **f32), torch.empty((b, c), **f32), torch.empty((b, c), **f32),
                           torch.empty((b, buffer), **f32), torch.empty((b, v), **f32))
    hist = torch.empty((b, c, SAMPLING_CUT_BINS), dtype=torch.int32, device=y.device)
    off = torch.empty((b, c), dtype=torch.int32, device=y.device)
    rows = (y, top_k.contiguous(), top_p.contiguous(), skip.contiguous())
    bins = dict(NBINS=SAMPLING_CUT_BINS, INV_W=SAMPLING_CUT_INV_W)
    cp = triton.next_power_of_2(c)
    each = {**pdl_if(y.device, "FLARE_SAMPLER_PDL", SAMPLER_PDL), "SKIP_BELOW": skip_below}  # every launch's
    if min_p is not None:
        if skip_below is None:
            raise ValueError("sampling_cut_compact_triton: min_p (the done rows' skip) needs skip_below")
        each.update(MINP=min_p, B=b, BP=triton.next_power_of_2(b), SKIP_DONE=True)
    _cut_chunk_stats_kernel[(b, c)](*rows, mc, zc, v, y.stride(0), C=c, CHUNK=chunk, num_warps=8, **each)
    _cut_chunk_hist_kernel[(b, c)](*rows, mc, zc, hist, v, y.stride(0), C=c, CP=cp, CHUNK=chunk, **bins,
                                   num_warps=8, **each)
    _cut_plan_kernel[(b,)](*rows[1:], mc, zc, hist, plan, off, v, C=c, CP=cp, **bins, MARGIN=SAMPLING_CUT_MARGIN,
                           num_warps=16, **each)
    _cut_compact_kernel[(b, c)](*rows, mc, zc, plan, off, buf, ma, v, y.stride(0), C=c, CP=cp, CHUNK=chunk,
                                BUFN=buffer, **bins, num_warps=8, **each)
    _cut_final_kernel[(b,)](*rows, mc, zc, plan, buf, ma, cut, ws, v, y.stride(0), C=c, CP=cp, CAP=cap, BUFN=buffer,
                            **loop, num_warps=SAMPLING_CUT_WARPS, **each)
    return cut


# ------------------------------------------------------------------------------------------------------------
# The cut of rows already sorted (``flare::sorted_cut``, ``sampling_cut.py``): what ``sampling_cut.sorted_cut`` computes
# with about a dozen launches after the sampler's sort (the k-th value, a masked softmax, a blocked cumsum, a count, two
# gathers -- ~25 us of Qwen3's decode step on the H200, run 74's trace), as one program per row: the k-th value and the
# row's first (largest) value by index, one pass (blocks of ``BLOCK``) for the masked mass ``Z = sum exp(s - s[0])``
# over the values >= the k-th -- a prefix of the row: the blocks up to the k-th, then any holding values tied with it
# (top_k off: the whole row) -- then blocks of ``SCAN`` of that prefix in order (the next block's load in flight during
# each block's math), each value's mass strictly above it (``carry`` + the block's exclusive prefix) against ``top_p``
# -- stopping at the first block whose start already reaches it (the mass above only grows down a descending row), then
# the value at the count (the mass pass and the scan only for rows that cut by top-p).  Deterministic; the reference's
# softmax and scan round in their own order, so a cut may differ only where the mass above a value is within rounding of
# ``top_p``.


@triton.jit
def _sorted_cut_mass(row, offs, n, kth, m, z_acc):
    """``z_acc`` plus one block's masses ``exp(s - m)`` of the values ``>= kth`` (positions ``offs``)."""
    x = tl.load(row + offs, mask=offs < n, other=float("-inf"))
    return z_acc + tl.where(x >= kth, tl.exp(x - m), 0.0)


@triton.jit
def _sorted_cut_kernel(S, TOPK, TOPP, CUT, n, stride_s, BLOCK: tl.constexpr, PIPELINE: tl.constexpr,
                       SCAN: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    row = S + r * stride_s
    k = tl.load(TOPK + r)
    p = tl.load(TOPP + r)
    k = tl.where((k <= 0) | (k > n), n, k)  # top_k off or beyond the row: the n-th value
    kth = tl.load(row + k - 1)
    m = tl.load(row)  # the row's largest value
    offs0 = tl.arange(0, BLOCK)
    z = tl.full((), 1.0, tl.float32)
    hi = n  # the values >= the k-th lie before hi (a descending row: a prefix)
    if p < 1.0:  # the mass only where top-p cuts, over the blocks that hold the k-th value and those above it
        nb = tl.cdiv(k, BLOCK)
        z_acc = tl.zeros([BLOCK], tl.float32)
        if PIPELINE:  # compiled: a range() loop; the interpreter cannot take a tensor bound there -- the same blocks
            for j in range(0, nb):
                z_acc = _sorted_cut_mass(row, j * BLOCK + offs0, n, kth, m, z_acc)
        else:
            j = 0
            while j < nb:
                z_acc = _sorted_cut_mass(row, j * BLOCK + offs0, n, kth, m, z_acc)
                j += 1
        hi = nb * BLOCK
        while (hi < n) & (tl.load(row + tl.minimum(hi, n - 1)) >= kth):  # values tied with the k-th past the blocks
            z_acc = _sorted_cut_mass(row, hi + offs0, n, kth, m, z_acc)
            hi += BLOCK
        z = tl.sum(z_acc, axis=0)
    keep = tl.full((), 0, tl.int32)
    carry = tl.full((), 0.0, tl.float32)
    offs1 = tl.arange(0, SCAN)
    i = 0
    x = tl.load(row + offs1, mask=offs1 < tl.where(p < 1.0, n, 0), other=float("-inf"))  # the scan's first block
    while (i < tl.minimum(hi, n)) & (carry < p) & (p < 1.0):  # p >= 1 keeps every value: no scan
        offs = i + offs1
        x_next = tl.load(row + offs + SCAN, mask=offs + SCAN < n, other=float("-inf"))  # in flight during the math
        prob = tl.where(x >= kth, tl.exp(x - m), 0.0) / z
        incl = tl.cumsum(prob, axis=0)
        keep += tl.sum(((offs < n) & (carry + (incl - prob) < p)).to(tl.int32), axis=0)
        carry += tl.sum(tl.where(offs1 == SCAN - 1, incl, 0.0), axis=0)
        x = x_next
        i += SCAN
    n_keep = tl.where(p >= 1.0, n, tl.maximum(keep, 1))
    last = tl.load(row + n_keep - 1)
    tl.store(CUT + r, tl.maximum(kth, tl.where(last >= kth, last, float("-inf"))))


#: Values per block of :func:`sorted_cut_triton`'s mass pass and of its scan (more loads in flight, fewer steps of the
#: sequential scan: a row with top_k off and top_p 0.95 took 112.7 us with 1024-value scan blocks against the traced
#: cut's 94.5, run 80; 96.0 against 93.9 with 4096, ``results/20261201T204400Z-sm90-gpu-replay-0.6B``), and its warps.
SORTED_CUT_BLOCK = 4096
SORTED_CUT_SCAN = 4096
SORTED_CUT_WARPS = 8


def sorted_cut_triton(top_k: torch.Tensor, top_p: torch.Tensor, sorted_desc: torch.Tensor,
                      block: int = SORTED_CUT_BLOCK, scan: int = SORTED_CUT_SCAN) -> torch.Tensor:
    """``flare::sorted_cut`` on the GPU (or the interpreter): one program per row (see above; ``block`` / ``scan``:
    values per block of the mass pass and of the scan, for tests).  Shapes are checked by the op
    (``sampling_cut.py``)."""
    s, cut, loop = _row_cut_setup(sorted_desc, block)
    if s.shape[0]:
        _sorted_cut_kernel[(s.shape[0],)](s, top_k.contiguous(), top_p.contiguous(), cut, s.shape[1], s.stride(0),
                                          BLOCK=loop["BLOCK"], PIPELINE=loop["PIPELINE"],
                                          SCAN=min(scan, loop["BLOCK"]), num_warps=SORTED_CUT_WARPS)
    return cut
