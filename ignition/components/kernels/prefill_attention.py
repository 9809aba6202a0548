"""Paged prefill attention (``flare::paged_prefill_attention``): the FlashAttention-2 forward over the paged KV
cache."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignition.components.kernels.decode_plan import _check_pools
from ignition.components.kernels.launch import _interpreting, _pdl, _pdl_enter
from ignition.components.kernels.paged_decode import _LOG2E


# ------------------------------------------------------------------------------------------------------------
# Paged prefill attention (FlashAttention-2 forward over the paged KV cache): T >= 1 query tokens per row
# (prefill chunks, chunked prefill after earlier context, speculative verification), ``flare::paged_prefill_attention``.
#
# Grid (cdiv(T * G, BLOCK_M), B * KV): the G = H / KV query heads that share K/V head kvh are packed token-major
# into one axis of T * G rows (row r: token r // G, head kvh * G + r % G), so a K/V tile is loaded once for the
# whole group and a BLOCK_M tile still covers BLOCK_M / G consecutive tokens (causal skipping stays effective).
# Program (mb, b * KV + kvh) loops over key blocks of BLOCK_N keys (a multiple of the page size: the block's
# keys are gathered through the block table, one page id per key, i.e. BLOCK_N / PAGE distinct ids) from key 0
# up to min(max position in the tile + 1, seq_lens[b], P * PAGE): the work follows the real context, never the
# padded block-table width; a row with seq_lens 0 runs no iteration and writes zeros.  Key j is visible to the
# query at position p iff j <= p and j < seq_lens[b].
# Numerics (FlashAttention-2): S = Q K^T by tl.dot on bf16 inputs with fp32 accumulation, scaled into the log2
# domain; online softmax in fp32 (running max m, running sum l of the fp32 probabilities); P = exp2(S - m) is
# rounded to bf16 before the P V tl.dot (fp32 accumulation); the accumulator is divided by l and rounded to the
# output dtype once at the end.  A query row that sees no key (padding, inactive row) writes zeros.
# Deterministic: a fixed config per shape (``paged_prefill_config``), no atomics, no split-K, no autotune.


@triton.jit
def _prefill_block(n0, q, pos, hi, m_i, l_i, acc, K, V, BT, b64, kvh, offs_n, offs_d, d_mask,
                   stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_bt, qk_scale_log2,
                   PAGE: tl.constexpr, DOT_F32: tl.constexpr, MASKED: tl.constexpr):
    """One key block (keys n0 .. n0 + BLOCK_N - 1) of the online softmax: the updated ``(m_i, l_i, acc)``.
    ``MASKED=False``: every key of the block is below ``hi`` and visible to every row of the tile (no masks, no
    guard for rows that saw no key yet: the same values as the masked body, fewer instructions)."""
    tok = n0 + offs_n  # [BLOCK_N] key indices
    if MASKED:
        n_mask = tok < hi
        page = tl.load(BT + b64 * stride_bt + tok // PAGE, mask=n_mask, other=0).to(tl.int64)
    else:
        page = tl.load(BT + b64 * stride_bt + tok // PAGE).to(tl.int64)
    in_page = (tok % PAGE).to(tl.int64)
    k_ptrs = K + page[None, :] * stride_kp + in_page[None, :] * stride_kt + kvh * stride_kh + offs_d[:, None]
    v_ptrs = V + page[:, None] * stride_vp + in_page[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :]
    if MASKED:
        kt = tl.load(k_ptrs, mask=n_mask[None, :] & d_mask[:, None], other=0.0)  # [DP, BLOCK_N]
    else:
        kt = tl.load(k_ptrs, mask=d_mask[:, None], other=0.0)
    if DOT_F32:  # interpreter only: exact fp32 products of the bf16 values (see paged_prefill_attention_triton)
        s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    s = s * qk_scale_log2  # [BLOCK_M, BLOCK_N] fp32, log2 units
    if MASKED:
        vis = (tok[None, :] <= pos[:, None]) & n_mask[None, :]
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen no key yet
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: every row sees every key of the block
        m_safe = m_new
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if MASKED:
        v = tl.load(v_ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_N, DP]
    else:
        v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
    if DOT_F32:
        pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)  # probabilities rounded to bf16 (FlashAttention), fp32 accumulation
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _paged_prefill_kernel(Q, K, V, BT, POS, SL, Out,
                          T, stride_qb, stride_qt, stride_qh,
                          stride_kp, stride_kt, stride_kh,
                          stride_vp, stride_vt, stride_vh,
                          stride_bt, stride_pb, stride_ob, stride_ot,
                          max_pages, qk_scale_log2,
                          KVH: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                          PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          DOT_F32: tl.constexpr, PIPELINE: tl.constexpr, USE_PDL: tl.constexpr):
    _pdl_enter(USE_PDL)
    mb = tl.num_programs(0) - 1 - tl.program_id(0)  # the longest (last, causal) query tiles launch first
    bk = tl.program_id(1)
    b = bk // KVH
    kvh = bk % KVH
    b64 = b.to(tl.int64)

    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # packed (token, head-in-group) rows
    r_mask = rows < T * G
    tok_q = rows // G
    heads = kvh * G + rows % G
    offs_d = tl.arange(0, DP)
    d_mask = offs_d < D
    offs_n = tl.arange(0, BLOCK_N)

    seq_len = tl.minimum(tl.maximum(tl.load(SL + b).to(tl.int32), 0), max_pages * PAGE)
    pos = tl.load(POS + b64 * stride_pb + tok_q, mask=r_mask, other=-1)  # int64 [BLOCK_M]
    pos = tl.minimum(tl.maximum(pos, -1), max_pages * PAGE).to(tl.int32)  # any padding value: no OOB, no overflow
    hi = tl.minimum(tl.max(pos, axis=0) + 1, seq_len)  # keys 0 .. hi - 1 can be visible to this tile
    # keys 0 .. lo - 1 are visible to every row of the tile; whole blocks below lo run the unmasked body
    lo = tl.minimum(tl.min(tl.where(r_mask, pos, max_pages * PAGE), axis=0) + 1, seq_len)
    full = tl.maximum(lo, 0) // BLOCK_N * BLOCK_N

    q_ptrs = (Q + b64 * stride_qb + tok_q.to(tl.int64)[:, None] * stride_qt + heads[:, None] * stride_qh
              + offs_d[None, :])
    q = tl.load(q_ptrs, mask=r_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_M, DP] bf16

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DP], dtype=tl.float32)
    # The key-block loops, bounds device values: the fully visible blocks, then the rest (the causal diagonal and
    # the context's end).  Compiled: range() loops, software-pipelined (the next block's page ids and K/V tiles load
    # while this block's dots run).  The interpreter (Triton 3.6 under NumPy 2.4) cannot take a tensor bound in
    # range(): while loops over the same block bodies there -- same blocks, same order, same bits.
    if PIPELINE:
        for n0 in range(0, full, BLOCK_N):
            m_i, l_i, acc = _prefill_block(n0, q, pos, hi, m_i, l_i, acc, K, V, BT, b64, kvh, offs_n, offs_d, d_mask,
                                           stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
                                           stride_bt, qk_scale_log2, PAGE, DOT_F32, False)
        for n0 in range(full, hi, BLOCK_N):
            m_i, l_i, acc = _prefill_block(n0, q, pos, hi, m_i, l_i, acc, K, V, BT, b64, kvh, offs_n, offs_d, d_mask,
                                           stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
                                           stride_bt, qk_scale_log2, PAGE, DOT_F32, True)
    else:
        n0 = 0
        while n0 < full:
            m_i, l_i, acc = _prefill_block(n0, q, pos, hi, m_i, l_i, acc, K, V, BT, b64, kvh, offs_n, offs_d, d_mask,
                                           stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
                                           stride_bt, qk_scale_log2, PAGE, DOT_F32, False)
            n0 += BLOCK_N
        while n0 < hi:
            m_i, l_i, acc = _prefill_block(n0, q, pos, hi, m_i, l_i, acc, K, V, BT, b64, kvh, offs_n, offs_d, d_mask,
                                           stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
                                           stride_bt, qk_scale_log2, PAGE, DOT_F32, True)
            n0 += BLOCK_N

    out = tl.where(l_i[:, None] > 0.0, acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None], 0.0)
    o_ptrs = (Out + b64 * stride_ob + tok_q.to(tl.int64)[:, None] * stride_ot + heads[:, None] * D
              + offs_d[None, :])
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=r_mask[:, None] & d_mask[None, :])


def paged_prefill_config(t: int, groups: int, head_dim: int, page: int) -> dict:
    """The launch config, a pure function of the static shapes (deterministic, no autotuning).  BLOCK_M = 128
    packed query rows (64 when head_dim > 128, fewer for short chunks: never below 16, tl.dot's minimum); BLOCK_N =
    128 keys with 128-row tiles of head_dim <= 128 (8 warps, 3 stages), else 64 (at least one page; 4 warps below
    128 rows).  Measured on the H200 for a 4096-token Qwen3-8B chunk (``scripts/bench_prefill_parts.py``,
    ``results/20261201T025351Z-sm90-run8``): 128x128 w8 s3 0.467 ms (294 TFLOP/s) against 128x64 w8 s2 0.567 ms."""
    rows = t * groups
    block_m = 128 if head_dim <= 128 else 64
    block_m = max(16, min(block_m, triton.next_power_of_2(rows)))
    wide = block_m >= 128 and head_dim <= 128
    block_n = max(128 if wide else (64 if head_dim <= 128 else 32), page)
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 8 if block_m >= 128 else 4,
            "num_stages": 3 if wide else 2}


def paged_prefill_attention_triton(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                                   block_tables: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor,
                                   scaling: float, *, config: dict | None = None) -> torch.Tensor:
    """``q [B, T, H, D]`` bf16, one layer's pools ``[pages + 1, page, KV, D]``, ``block_tables [B, P]`` int32,
    ``positions [B, T]`` (absolute position of each query), ``seq_lens [B]`` -> ``[B, T, H * D]`` in q's dtype.
    Query i of row b attends keys ``j <= positions[b, i]`` and ``j < seq_lens[b]`` (the chunk's own K/V already
    in the pool).  Numerics: bf16 Q K^T and P V dots with fp32 accumulation, online softmax in fp32 (exp2),
    probabilities rounded to bf16 before P V (as FlashAttention), one final rounding.  Queries that see no key
    (padding, rows with seq_lens 0) write zeros.  ``config``: override of :func:`paged_prefill_config` (tests)."""
    b, t, h, d = q.shape
    page, kvh = _check_pools("paged_prefill_attention_triton", q, k_pool, v_pool)
    if positions.shape != (b, t):
        raise ValueError(f"paged_prefill_attention_triton: positions {tuple(positions.shape)}, expected {(b, t)}")
    g = h // kvh
    cfg = {**paged_prefill_config(t, g, d, page), **(config or {})}
    block_m, block_n = int(cfg["BLOCK_M"]), int(cfg["BLOCK_N"])
    if block_n % page or block_n & (block_n - 1) or block_m & (block_m - 1):
        raise ValueError(f"paged_prefill_attention_triton: BLOCK_N {block_n} must be a power-of-two multiple of "
                         f"the page size {page}; BLOCK_M {block_m} a power of two")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError("paged_prefill_attention_triton: pools must be contiguous in head_dim")
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    positions = positions.to(torch.int64)
    if positions.stride(-1) != 1:
        positions = positions.contiguous()
    out = torch.empty((b, t, h * d), dtype=q.dtype, device=q.device)
    if b == 0 or t == 0:
        return out
    grid = (triton.cdiv(t * g, block_m), b * kvh)
    _paged_prefill_kernel[grid](
        q, k_pool, v_pool, block_tables, positions, seq_lens, out,
        t, q.stride(0), q.stride(1), q.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        block_tables.stride(0), positions.stride(0), out.stride(0), out.stride(1),
        block_tables.shape[1], float(scaling) * _LOG2E,
        KVH=kvh, G=g, D=d, DP=triton.next_power_of_2(d), PAGE=page, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_F32=_interpreting(), PIPELINE=not _interpreting(),
        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), **_pdl(q.device))
    return out
