"""Paged decode attention (flash-decoding): the split kernel, its reduce, and the two-kernel launcher
(``paged_decode_attention_triton``).  Their launch plan is :mod:`.decode_plan`'s."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ignition.components.kernels.decode_plan import (_decode_geometry, _decode_workspace, decode_pipelined,
                                                     decode_pv_split)
from ignition.components.kernels.launch import _interpreting, _pdl, _pdl_enter, _prefetch_l2, _probe_smid, _probe_stamp


# ------------------------------------------------------------------------------------------------------------
# Paged decode attention (flash-decoding): one query token per row, reads only each row's seq_lens[b] keys.
#
# Pass 1, grid (B, KV heads, splits): program (b, kvh, s) takes the G = H / KV query heads that share K/V
# head kvh, and the s-th share of the row's n_blocks = ceil(seq_lens[b] / BLOCK_N) key blocks (the share is computed on
# the device from seq_lens, so the loop bound is data-dependent while every shape stays static: no host sync,
# capturable).  The G query heads are the rows of a [QR >= 16, D] tile (zero rows past G: tl.dot's minimum), keys
# come in blocks of BLOCK_N = max(16, page) gathered through the block table.  Scores by tl.dot on the bf16 inputs
# (exact products, fp32 accumulation), softmax online in fp32 in the log2 domain, P @ V by tl.dot in tf32x3 on the
# fp32 probabilities (three tf32 products: fp32-level accuracy; probabilities are *not* rounded to bf16).  Tensor
# cores instead of broadcast multiply + cross-warp sums (22 barriers per page before: ~12 us per layer on the
# H200 for a 1024-token row, ``results/20261130T211410Z-sm90-run3``).  The split writes its partial (max, sum,
# acc) to fp32 workspaces; an empty split writes (-inf, 0, 0).
# Pass 2, grid (B, H): combine the splits, divide, round to the output dtype once; a row without keys
# (seq_lens 0: inactive) writes zeros.  Tried and removed: a head's columns over several programs (grid B x H x
# D / 16..64) -- not bitwise on sm90 (the sums over the splits of a narrower tile reduce in another order) and within
# noise (Qwen3-8B 0.997x, Qwen3-0.6B 0.999-1.011x, ``results/20261201T170000Z-sm90-run55``).

_LOG2E = 1.4426950408889634


@triton.jit
def _decode_pages(BT, b64, tok, n_mask, stride_bt, PAGE: tl.constexpr):
    """The page ids of keys ``tok``, one per key (0 where ``n_mask`` is off), int64."""
    return tl.load(BT + b64 * stride_bt + tok // PAGE, mask=n_mask, other=0).to(tl.int64)


@triton.jit
def _decode_block(blk, q, m_i, l_i, acc, K, V, BT, b64, kvh, seq_len, offs_n, offs_d, d_mask,
                  stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_bt, qk_scale_log2,
                  PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr, PROBE=None, prog=0,
                  HAS_PROBE: tl.constexpr = False, LAST_ONLY: tl.constexpr = False, PV_SPLIT: tl.constexpr = False,
                  PAGES=None, HAS_PAGES: tl.constexpr = False):
    """One key block (keys blk * BLOCK_N ..) of the online softmax for the program's query rows: ``(m, l, acc)``;
    ``LAST_ONLY``: of the block's keys only the row's last, ``seq_len - 1`` (:data:`DECODE_NEW_KEY_APART`);
    ``PV_SPLIT``: P V as three bf16 products of P's bf16 pieces (:data:`DECODE_PV_SPLIT`); ``HAS_PAGES``: the block's
    page ids already loaded, ``PAGES`` (:func:`_decode_pages`)."""
    tok = blk * BLOCK_N + offs_n
    n_mask = tok < seq_len
    if LAST_ONLY:
        n_mask = n_mask & (tok >= seq_len - 1)
    _probe_stamp(PROBE, prog, 8, blk, HAS_PROBE)  # the probe's block stamps: the program's last block
    if HAS_PAGES:
        page = PAGES
    else:
        page = _decode_pages(BT, b64, tok, n_mask, stride_bt, PAGE)  # one id per key
    _probe_stamp(PROBE, prog, 9, tl.sum(page, axis=0).to(tl.int32), HAS_PROBE)
    in_page = (tok % PAGE).to(tl.int64)
    # K (transposed, [DP, BLOCK_N]) and V ([BLOCK_N, DP]) both issued before any use: one latency per block
    kt = tl.load(K + page[None, :] * stride_kp + in_page[None, :] * stride_kt + kvh * stride_kh + offs_d[:, None],
                 mask=n_mask[None, :] & d_mask[:, None], other=0.0)
    v = tl.load(V + page[:, None] * stride_vp + in_page[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],
                mask=n_mask[:, None] & d_mask[None, :], other=0.0)
    _probe_stamp(PROBE, prog, 10, (tl.sum(tl.sum(kt.to(tl.float32), axis=1), axis=0)
                                   + tl.sum(tl.sum(v.to(tl.float32), axis=1), axis=0)).to(tl.int32, bitcast=True),
                 HAS_PROBE)
    if DOT_F32:  # interpreter: its bf16 dot is not exact; fp32 products of the bf16 values are
        s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
    else:
        s = tl.dot(q, kt)  # bf16 x bf16 products are exact in fp32; fp32 accumulation
    s = tl.where(n_mask[None, :], s * qk_scale_log2, float("-inf"))  # [QR, BLOCK_N], log2 units
    m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: a block below n_blocks holds at least one key
    alpha = tl.math.exp2(m_i - m_new)
    prob = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(prob, axis=1)
    _probe_stamp(PROBE, prog, 11, tl.sum(l_i, axis=0).to(tl.int32, bitcast=True), HAS_PROBE)
    if PV_SPLIT:  # P = p1 + p2 + p3 exactly (:func:`_decode_p_pieces`); bf16 x bf16 products exact in fp32; the
        # smallest piece first, into one fp32 accumulator
        p1, p2, p3 = _decode_p_pieces(prob)
        if DOT_F32:  # interpreter: fp32 operands of the bf16 values (its bf16 dot is not exact)
            p1, p2, p3, v = p1.to(tl.float32), p2.to(tl.float32), p3.to(tl.float32), v.to(tl.float32)
        pv = tl.dot(p1, v, tl.dot(p2, v, tl.dot(p3, v, input_precision="ieee"), input_precision="ieee"),
                    input_precision="ieee")
    elif DOT_F32:
        pv = tl.dot(prob, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(prob, v.to(tl.float32), input_precision="tf32x3")  # fp32 P (3 tf32 products: ~fp32 exact)
    acc = acc * alpha[:, None] + pv
    _probe_stamp(PROBE, prog, 12, tl.sum(tl.sum(acc, axis=1), axis=0).to(tl.int32, bitcast=True), HAS_PROBE)
    return m_new, l_i, acc


@triton.jit
def _decode_p_pieces(prob):
    """fp32 probabilities as three bf16 pieces, ``prob == p1 + p2 + p3`` exactly: each piece is the rounded rest of
    the ones before (the rests are exact in fp32; 8 + 8 + 8 significant bits cover fp32's 24 -- down to bf16's
    normal range, 2^-126, far below any probability that moves a sum of them)."""
    p1 = prob.to(tl.bfloat16)
    r1 = prob - p1.to(tl.float32)
    p2 = r1.to(tl.bfloat16)
    p3 = (r1 - p2.to(tl.float32)).to(tl.bfloat16)
    return p1, p2, p3


@triton.jit
def _decode_len(SL, b, max_pages, PAGE: tl.constexpr):
    """Row ``b``'s keys, clamped to ``0 .. max_pages * PAGE`` (read through L2: see the PDL rules in :mod:`.launch`)."""
    return tl.minimum(tl.maximum(tl.load(SL + b, cache_modifier=".cg").to(tl.int32), 0), max_pages * PAGE)


@triton.jit
def _decode_init(QR: tl.constexpr, DP: tl.constexpr):
    """The online softmax before any key: ``(m = -inf, l = 0, acc = 0)`` for ``QR`` query rows of ``DP`` columns."""
    return (tl.full([QR], float("-inf"), dtype=tl.float32), tl.zeros([QR], dtype=tl.float32),
            tl.zeros([QR, DP], dtype=tl.float32))


@triton.jit
def _decode_share(SL, b, split, max_pages, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                  DROP_LAST: tl.constexpr = False):
    """``(seq_len, n_blocks, per_split, start, end)``: row ``b``'s keys and split ``split``'s key blocks;
    ``DROP_LAST``: the keys before the row's last (:data:`DECODE_NEW_KEY_APART`)."""
    seq_len = _decode_len(SL, b, max_pages, PAGE)
    if DROP_LAST:
        seq_len = tl.maximum(seq_len - 1, 0)
    n_blocks = (seq_len + BLOCK_N - 1) // BLOCK_N
    per_split = (n_blocks + SPLITS - 1) // SPLITS
    start = split * per_split
    return seq_len, n_blocks, per_split, start, tl.minimum(start + per_split, n_blocks)


@triton.jit
def _decode_blocks(q, start, end, K, V, BT, b64, kvh, seq_len, offs_n, offs_d, d_mask,
                   stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_bt, qk_scale_log2,
                   QR: tl.constexpr, DP: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                   DOT_F32: tl.constexpr, PIPELINE: tl.constexpr, PROBE=None, prog=0,
                   HAS_PROBE: tl.constexpr = False, PV_SPLIT: tl.constexpr = False, PAGES0=None,
                   HAS_PAGES0: tl.constexpr = False):
    """The online softmax of the query tile ``q [QR, DP]`` over key blocks ``start .. end - 1``: ``(m, l, acc)``;
    ``HAS_PAGES0`` (the plain loop only): block ``start``'s page ids already loaded, ``PAGES0``."""
    tl.static_assert(not (HAS_PAGES0 and PIPELINE), "the first block's page ids: the plain loop only")
    m_i, l_i, acc = _decode_init(QR, DP)
    # Compiled: a range() loop (software-pipelined).  The interpreter (Triton 3.6 under NumPy 2.4) cannot take a
    # tensor bound in range(): a while loop over the same block body there -- same blocks, same order.
    if PIPELINE:
        for blk in range(start, end):
            m_i, l_i, acc = _decode_block(blk, q, m_i, l_i, acc, K, V, BT, b64, kvh, seq_len, offs_n, offs_d, d_mask,
                                          stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
                                          stride_bt, qk_scale_log2, PAGE, BLOCK_N, DOT_F32, PROBE, prog, HAS_PROBE,
                                          PV_SPLIT=PV_SPLIT)
    else:
        blk = start
        if HAS_PAGES0:
            if blk < end:
                m_i, l_i, acc = _decode_block(blk, q, m_i, l_i, acc, K, V, BT, b64, kvh, seq_len, offs_n, offs_d,
                                              d_mask, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
                                              stride_bt, qk_scale_log2, PAGE, BLOCK_N, DOT_F32, PROBE, prog, HAS_PROBE,
                                              PV_SPLIT=PV_SPLIT, PAGES=PAGES0, HAS_PAGES=True)
            blk += 1
        while blk < end:
            m_i, l_i, acc = _decode_block(blk, q, m_i, l_i, acc, K, V, BT, b64, kvh, seq_len, offs_n, offs_d, d_mask,
                                          stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
                                          stride_bt, qk_scale_log2, PAGE, BLOCK_N, DOT_F32, PROBE, prog, HAS_PROBE,
                                          PV_SPLIT=PV_SPLIT)
            blk += 1
    return m_i, l_i, acc


@triton.jit
def _decode_prefetch_kv(start, end, K, V, BT, b64, kvh, seq_len, stride_kp, stride_kt, stride_kh,
                        stride_vp, stride_vt, stride_vh, stride_bt, D: tl.constexpr, PAGE: tl.constexpr,
                        BLOCK_N: tl.constexpr, LINES: tl.constexpr, KEYS: tl.constexpr, LAST: tl.constexpr = False):
    """L2 prefetch of the first ``KEYS`` keys of key blocks ``start .. end - 1`` in K and V (``LINES`` 128-byte lines
    per key row): one block-table load through L2, one prefetch per line -- no loop, so no chain of dependent loads;
    ``LAST``: with the evict-last L2 priority."""
    lines = tl.arange(0, LINES) * (D // LINES)
    tok = start * BLOCK_N + tl.arange(0, KEYS)
    keep = (tok < end * BLOCK_N) & (tok < seq_len)
    page = tl.load(BT + b64 * stride_bt + tok // PAGE, mask=keep, other=0, cache_modifier=".cg").to(tl.int64)
    in_page = (tok % PAGE).to(tl.int64)
    row_k = page * stride_kp + in_page * stride_kt + kvh * stride_kh
    row_v = page * stride_vp + in_page * stride_vt + kvh * stride_vh
    _prefetch_l2(K + tl.where(keep, row_k, 0)[:, None] + lines[None, :], LAST)  # dropped keys: page 0's first row
    _prefetch_l2(V + tl.where(keep, row_v, 0)[:, None] + lines[None, :], LAST)


@triton.jit
def _decode_store_partial(M_ws, L_ws, ACC_ws, m_i, l_i, acc, b64, kvh, split, offs_g, offs_d, d_mask,
                          KVH: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    """A split's partial ``(max, sum, acc)`` of its GP padded heads to the workspaces ``[B, KV, SPLITS, GP(, D)]``."""
    keep = offs_g < GP
    row = ((b64 * KVH + kvh) * SPLITS + split) * GP + offs_g
    tl.store(M_ws + row, m_i, mask=keep)
    tl.store(L_ws + row, l_i, mask=keep)
    tl.store(ACC_ws + row[:, None] * D + offs_d[None, :], acc, mask=keep[:, None] & d_mask[None, :])


@triton.jit
def _decode_combine(M_ws, L_ws, ACC_ws, Out, b64, kvh, g, offs_d, d_mask,
                    H: tl.constexpr, KVH: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
                    SP: tl.constexpr, G: tl.constexpr):
    """Head ``kvh * G + g`` of row b: combine the splits' partials in split order, divide, round once, store."""
    offs_s = tl.arange(0, SP)
    s_mask = offs_s < SPLITS
    row = ((b64 * KVH + kvh) * SPLITS + offs_s) * GP + g  # [SP]
    m = tl.load(M_ws + row, mask=s_mask, other=float("-inf"))
    l = tl.load(L_ws + row, mask=s_mask, other=0.0)
    acc = tl.load(ACC_ws + row[:, None] * D + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # a row without keys: every weight below is 0
    w = tl.math.exp2(m - m_max)  # empty splits (m = -inf) weigh 0
    denom = tl.sum(w * l, axis=0)
    num = tl.sum(w[:, None] * acc, axis=0)  # [DP]
    out = tl.where(denom > 0.0, num / tl.where(denom > 0.0, denom, 1.0), 0.0)
    tl.store(Out + b64 * (H * D) + (kvh * G + g) * D + offs_d, out.to(Out.dtype.element_ty), mask=d_mask)


@triton.jit
def _decode_combine_group(M_ws, L_ws, ACC_ws, Out, b64, kvh, offs_d, d_mask,
                          H: tl.constexpr, KVH: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                          DP: tl.constexpr, SPLITS: tl.constexpr):
    """The ``G`` heads of (row b, KV head ``kvh``) at once, tiles ``[GP, DP]`` (``offs_d [DP]``): the
    splits' partials combined as :func:`_decode_combine` does (the same weights; the sums in split order, one after
    another), divided, rounded once, stored.  Every tile in one layout -- each partial's max and sum loaded broadcast
    over the columns -- so nothing crosses threads and no CTA barrier stands between the loads: every split's maximum
    is loaded at once, then every split's sum, accumulator and maximum again (two round trips; the maxima kept from
    the first pass held 9 registers more offline).  Loads through L2: the partials come from other programs of the
    same launch (:func:`_decode_combine_last`)."""
    offs_g = tl.arange(0, GP)
    keep = (offs_g < G)[:, None] & d_mask[None, :]
    cols = tl.zeros_like(offs_d)[None, :]  # a partial's max and sum, broadcast over the columns
    base = (b64 * KVH + kvh) * SPLITS * GP + offs_g[:, None]
    m_max = tl.full([GP, DP], float("-inf"), dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        m_max = tl.maximum(m_max, tl.load(M_ws + base + s * GP + cols, mask=keep, other=float("-inf"),
                                          cache_modifier=".cg"))
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # a row without keys: every weight below is 0
    denom = tl.zeros_like(m_max)
    num = tl.zeros_like(m_max)
    for s in tl.static_range(SPLITS):
        row = base + s * GP
        l_s = tl.load(L_ws + row + cols, mask=keep, other=0.0, cache_modifier=".cg")
        acc_s = tl.load(ACC_ws + row * D + offs_d[None, :], mask=keep, other=0.0, cache_modifier=".cg")
        m_s = tl.load(M_ws + row + cols, mask=keep, other=float("-inf"), cache_modifier=".cg")
        w = tl.math.exp2(m_s - m_max)  # an empty split (m = -inf) weighs 0
        denom += w * l_s
        num += w * acc_s
    out = tl.where(denom > 0.0, num / tl.where(denom > 0.0, denom, 1.0), 0.0)
    tl.store(Out + b64 * (H * D) + (kvh * G + offs_g)[:, None] * D + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=keep)


@triton.jit
def _decode_combine_last(CNT, M_ws, L_ws, ACC_ws, Out, b64, kvh, offs_d, d_mask,
                         H: tl.constexpr, KVH: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                         DP: tl.constexpr, SPLITS: tl.constexpr, PROGRAMS):
    """After a program stored its partial: its ticket of (row b, KV head ``kvh``) -- a CTA barrier, then one acq_rel
    add at GPU scope to the group's count in ``CNT [B * KVH]`` (CUTLASS's semaphore pattern: the group's other
    programs' stores are visible to the program that draws the last ticket); that program (of ``PROGRAMS``) puts the
    count back to zero for the next launch and combines the group (:func:`_decode_combine_group`)."""
    tl.debug_barrier()
    slot = CNT + b64 * KVH + kvh
    ticket = tl.atomic_add(slot, 1, sem="acq_rel", scope="gpu")
    if ticket == PROGRAMS - 1:
        tl.store(slot, 0)
        _decode_combine_group(M_ws, L_ws, ACC_ws, Out, b64, kvh, offs_d, d_mask, H, KVH, G, GP, D, DP, SPLITS)


@triton.jit
def _paged_decode_split_kernel(Q, K, V, BT, SL, M_ws, L_ws, ACC_ws,
                               stride_qb, stride_qh,
                               stride_kp, stride_kt, stride_kh,
                               stride_vp, stride_vt, stride_vh,
                               stride_bt, max_pages, qk_scale_log2,
                               KVH: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, QR: tl.constexpr,
                               D: tl.constexpr, DP: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                               SPLITS: tl.constexpr, DOT_F32: tl.constexpr, PIPELINE: tl.constexpr,
                               USE_PDL: tl.constexpr, PV_SPLIT: tl.constexpr = False):
    _pdl_enter(USE_PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, QR)  # the group's G query heads, zero rows up to QR (>= 16: tl.dot's minimum)
    offs_d = tl.arange(0, DP)
    d_mask = offs_d < D
    seq_len, n_blocks, per_split, start, end = _decode_share(SL, b, split, max_pages, PAGE, BLOCK_N, SPLITS)
    b64 = b.to(tl.int64)
    q = tl.load(Q + b64 * stride_qb + (kvh * G + offs_g)[:, None] * stride_qh + offs_d[None, :],
                mask=(offs_g < G)[:, None] & d_mask[None, :], other=0.0)  # [QR, DP] bf16
    m_i, l_i, acc = _decode_blocks(q, start, end, K, V, BT, b64, kvh, seq_len, tl.arange(0, BLOCK_N), offs_d, d_mask,
                                   stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_bt,
                                   qk_scale_log2, QR, DP, PAGE, BLOCK_N, DOT_F32, PIPELINE, PV_SPLIT=PV_SPLIT)
    _decode_store_partial(M_ws, L_ws, ACC_ws, m_i, l_i, acc, b64, kvh, split, offs_g, offs_d, d_mask, KVH, GP, D,
                          SPLITS)


@triton.jit
def _bulk_prefetch_l2(W, first, n_lines, prog, programs, STEP: tl.constexpr, LANES: tl.constexpr):
    """L2 prefetch by the TMA unit of program ``prog``'s share (of ``programs`` equal shares) of the 128-byte lines
    ``first .. first + n_lines - 1`` of ``W`` (``STEP`` elements per line): each of ``LANES`` lanes hands one
    ``cp.async.bulk.prefetch.L2`` of its slice to the copy engine (a lane without lines: line ``first`` again)."""
    per = (n_lines + programs - 1) // programs
    chunk = (per + LANES - 1) // LANES  # lines per lane
    start = prog * per + tl.arange(0, LANES) * chunk
    lines = tl.minimum(chunk, tl.minimum(prog * per + per, n_lines) - start)
    keep = lines > 0
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                              [W + (first + tl.where(keep, start, 0)).to(tl.int64) * STEP,
                               tl.where(keep, lines, 1) * 128],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _paged_decode_reduce_kernel(M_ws, L_ws, ACC_ws, Out,
                                H: tl.constexpr, KVH: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
                                D: tl.constexpr, DP: tl.constexpr, SPLITS: tl.constexpr, SP: tl.constexpr,
                                USE_PDL: tl.constexpr, EARLY: tl.constexpr, PROBE=None,
                                HAS_PROBE: tl.constexpr = False, PF=None, PF_FIRST=0, PF_LINES=0,
                                PF_STEP: tl.constexpr = 64, HAS_PF: tl.constexpr = False):
    prog = tl.program_id(0) * H + tl.program_id(1)  # the timing probe's row (HAS_PROBE: diagnostics only)
    _probe_stamp(PROBE, prog, 0, prog, HAS_PROBE)
    _probe_smid(PROBE, prog, HAS_PROBE)
    # EARLY: the output projection after it starts streaming its weight meanwhile.  Tried and removed: these programs
    # (after the trigger, before the wait, while the attention runs) prefetching the head of every row of the layer's
    # gate/up weight into L2 for the cuBLAS GEMV after the output projection -- Qwen3-8B side by side in one process
    # (``results/20261202T020400Z-sm90-run101``): 8 lines (24 MiB) 1.0053x at batch 1 (within noise), 16 lines 1.033x
    # slower, 8 lines with the evict-last priority 1.0055x; batch 4 (no prefetch there) within noise.
    # HAS_PF: the output projection's last rows into L2 in the same window, after the early trigger and before the
    # wait (:data:`decode_attention.DECODE_REDUCE_PREFETCH_MB`)
    if HAS_PF:
        if USE_PDL and EARLY:
            gdc_launch_dependents()
        _bulk_prefetch_l2(PF, PF_FIRST, PF_LINES, prog, tl.num_programs(0) * H, PF_STEP, 128)
        if USE_PDL:
            gdc_wait()
            if not EARLY:
                gdc_launch_dependents()
    else:
        _pdl_enter(USE_PDL, EARLY)
    h = tl.program_id(1)
    _probe_stamp(PROBE, prog, 2, h, HAS_PROBE)
    offs_d = tl.arange(0, DP)
    _decode_combine(M_ws, L_ws, ACC_ws, Out, tl.program_id(0).to(tl.int64), h // G, h % G, offs_d, offs_d < D,
                    H, KVH, GP, D, SPLITS, SP, G)
    _probe_stamp(PROBE, prog, 6, h, HAS_PROBE)


def paged_decode_attention_triton(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                                  block_tables: torch.Tensor, seq_lens: torch.Tensor, scaling: float, *,
                                  num_splits: int | None = None,
                                  workspace: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                                  block_n: int | None = None) -> torch.Tensor:
    """``q [B, 1, H, D]``, one layer's pools ``[pages + 1, page, KV, D]``, ``block_tables [B, P]`` int32,
    ``seq_lens [B]`` (keys ``0 .. seq_lens[b] - 1`` of row b are attended, 0: the row writes zeros) ->
    ``[B, 1, H * D]`` in q's dtype.  ``workspace``: optional caller-owned fp32 ``(m [B, KV, S, GP],
    l [B, KV, S, GP], acc [B, KV, S, GP, D])`` (S = ``num_splits``, GP = next power of two >= H / KV);
    allocated here when omitted.  ``block_n``: keys per block (:func:`decode_block_n`)."""
    geo = _decode_geometry("paged_decode_attention_triton", q, k_pool, v_pool, block_tables, num_splits,
                           block_n=block_n)
    b, h, d = geo["B"], geo["H"], geo["D"]
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty((b, 1, h * d), dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    m_ws, l_ws, acc_ws = _decode_workspace(geo, q.device, workspace)
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    dp = triton.next_power_of_2(d)
    _paged_decode_split_kernel[(b, geo["KVH"], geo["SPLITS"])](
        q, k_pool, v_pool, block_tables, seq_lens, m_ws, l_ws, acc_ws,
        q.stride(0), q.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        block_tables.stride(0), block_tables.shape[1], float(scaling) * _LOG2E,
        KVH=geo["KVH"], G=geo["G"], GP=geo["GP"], QR=geo["QR"], D=d, DP=dp, PAGE=geo["PAGE"],
        BLOCK_N=geo["BLOCK_N"], SPLITS=geo["SPLITS"], DOT_F32=_interpreting(), PIPELINE=decode_pipelined(),
        PV_SPLIT=decode_pv_split(), num_warps=4, **_pdl(q.device))
    _paged_decode_reduce_kernel[(b, h)](
        m_ws, l_ws, acc_ws, out, H=h, KVH=geo["KVH"], G=geo["G"], GP=geo["GP"], D=d, DP=dp, SPLITS=geo["SPLITS"],
        SP=geo["SP"], num_warps=4, **_pdl(q.device, early_rows=b))
    return out
