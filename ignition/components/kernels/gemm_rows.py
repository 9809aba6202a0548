"""The few-rows projection on tensor cores (``flare::fused_linear`` at 2..16 rows) and the published norms its
epilogue can write for the next launch.  Configurations and the launcher are :mod:`.linear`'s."""

from __future__ import annotations

import triton
import triton.language as tl

from ignition.components.kernels.gemv import (_gemv_epilogue, _gemv_masks, _gemv_normed_tile, _gemv_prefetch,
                                              _gemv_program, _gemv_residual, _gemv_rstd, _gemv_x_tile)
from ignition.components.kernels.launch import _pdl_enter


# The few-rows variant (2..16 rows: decode batches, speculative rounds): the same prologues and epilogues, but each
# weight tile meets the rows through the tensor cores, ``tl.dot`` of the row tile ``[MP, BK]`` (rows padded to 16,
# tl.dot's minimum) and the weight tile transposed ``[BK, BN]`` (BN >= 16), accumulated in fp32 ``[MP, BN]`` across K in
# order -- bf16 products are exact in fp32; the sum order within a tile is the MMA's, fixed by the config, so the same
# shapes give the same bits.  The elementwise kernel (:mod:`.gemv`) costs MP fp32 FMAs per weight element on the CUDA
# cores, which is why it lost to cuBLAS from 4 rows on (``fused_linear.prefers_fused``).  The step takes it for plain
# inputs only (``fused_linear.uses_dot_kernel``; ``FLARE_GEMV_DOT=0`` turns it off): where the input
# tile goes through a prologue (norm, gated input) its loads are not pipelined -- one latency per K tile, far slower
# than cuBLAS on the H200 (``results/20261201T102332Z-sm90-run23``).  Tried and removed: the prologue computed on
# the real rows only (rows rounded to a power of two, spread over the 16-row tile by joins) and qkv with its norm,
# down with the gated input taken through it -- bitwise in the interpreter but not compiled for sm90 at 4 rows, and
# the step 1.41x slower at batch 4 (Qwen3-8B side by side in one process, ``results/20261201T141644Z-sm90-run37``).

@triton.jit
def _prenorm_load_stats(S_IN, offs_m, m_mask, PARTS: tl.constexpr, PP: tl.constexpr):
    """The row statistics the launch that wrote x published (:func:`_prenorm_store`: ``S_IN [rows, PARTS]`` fp32 sums
    of x^2 over its column blocks), ``[MP, PP]`` -- loaded before the main loop, summed after it
    (:func:`_prenorm_rstd`): summed before, the loop's first copies waited for them (offline sm90 PTX)."""
    offs_p = tl.arange(0, PP)
    return tl.load(S_IN + offs_m[:, None] * PARTS + offs_p[None, :], mask=m_mask[:, None] & (offs_p < PARTS)[None, :],
                   other=0.0)


@triton.jit
def _prenorm_rstd(part, eps, K: tl.constexpr):
    """``rstd [MP]`` of the input's RMSNorm from its published statistics (:func:`_prenorm_load_stats`), in block
    order."""
    return tl.math.rsqrt(tl.sum(part, axis=1) / K + eps)


@triton.jit
def _prenorm_store(nw, XW, S_OUT, y, offs_m, offs_n, m_mask, n_mask, stride_xw, PARTS: tl.constexpr):
    """The next projection's normed input, published from this program's stored output tile ``y [MP, BN]`` (bf16)
    with the next norm's weights ``nw [BN]`` (loaded before the wait): ``bf16(nw * y)`` to ``XW`` (the norm's weights
    applied, its rstd not: the next launch scales its fp32 sums by rstd, :func:`_prenorm_rstd`) and the fp32 sum of
    ``y ** 2`` over the tile's columns to ``S_OUT [rows, PARTS]`` at column ``program_id(0)``."""
    yf = tl.where(n_mask[None, :], y.to(tl.float32), 0.0)
    xw = (nw.to(tl.float32)[None, :] * yf).to(y.dtype)
    tl.store(XW + offs_m.to(tl.int64)[:, None] * stride_xw + offs_n[None, :], xw,
             mask=m_mask[:, None] & n_mask[None, :])
    tl.store(S_OUT + offs_m * PARTS + tl.program_id(0), tl.sum(yf * yf, axis=1), mask=m_mask)


@triton.jit
def _fused_gemm_rows_kernel(X, W, NW, R, Y, M, N_OUT, stride_x, stride_w, stride_r, stride_y, eps,
                            K: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                            HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr, GATED: tl.constexpr,
                            EVEN_K: tl.constexpr, GATED_IN: tl.constexpr, USE_PDL: tl.constexpr,
                            PREFETCH: tl.constexpr, PF_LINES: tl.constexpr, DOT_F32: tl.constexpr,
                            NORM_STAGES: tl.constexpr = 0, S_IN=None, IN_PARTS: tl.constexpr = 0,
                            IN_PP: tl.constexpr = 1, NW_OUT=None, XW=None, S_OUT=None, stride_xw=0,
                            OUT_PARTS: tl.constexpr = 0, RES_FIRST: tl.constexpr = False):
    offs_m, offs_n, offs_k, m_mask, n_mask, x_rows, w_rows = _gemv_program(X, W, M, N_OUT, stride_x, stride_w, MP,
                                                                            BN, BK)
    if GATED:
        u_rows = W + (offs_n + N_OUT).to(tl.int64)[:, None] * stride_w
    if OUT_PARTS > 0:  # the next norm's weights (weights: before the wait)
        nw_out = tl.load(NW_OUT + offs_n, mask=n_mask, other=0.0)
    if USE_PDL:  # before the wait: L2 prefetch of this program's first weight tiles
        _gemv_prefetch(W, offs_n, N_OUT, stride_w, K, BK, PF_LINES, 0, PREFETCH, GATED)
    _pdl_enter(USE_PDL)
    rstd = _gemv_rstd(x_rows, m_mask, offs_k, eps, K, MP, BK, HAS_NORM, NORM_STAGES)
    if IN_PARTS > 0:  # x is a published normed input (its norm weights applied): rstd from the published statistics
        part_in = _prenorm_load_stats(S_IN, offs_m, m_mask, IN_PARTS, IN_PP)
    if RES_FIRST:  # the residual's load in flight during the main loop (:data:`GEMM_ROWS_RES_FIRST`)
        res = _gemv_residual(R, offs_m, offs_n, m_mask, n_mask, stride_r, HAS_RES)

    acc = tl.zeros([MP, BN], dtype=tl.float32)
    if GATED:
        acc_u = tl.zeros([MP, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + offs_k
        xm, wm = _gemv_masks(kk, m_mask, n_mask, K, EVEN_K)
        if HAS_NORM and NORM_STAGES > 0:  # the norm weights as an [MP, BK] tile (every row the same addresses) --
            #   the software pipeliner then copies them asynchronously with x; as a [BK] vector they were one
            #   synchronous load per chunk (offline sm90 TTGIR).  The same values: bf16(nw * bf16(x * rstd)).
            xr = tl.load(x_rows + kk[None, :], mask=xm, other=0.0)
            nw2 = tl.load(NW + (offs_m * 0)[:, None] + kk[None, :], mask=(kk < K)[None, :], other=0.0)
            xv = _gemv_normed_tile(xr, nw2, rstd)
        else:
            xv = _gemv_x_tile(x_rows, NW, kk, xm, rstd, K, HAS_NORM, GATED_IN, EVEN_K)  # [MP, BK]
        w = tl.load(w_rows + kk[None, :], mask=wm, other=0.0, eviction_policy="evict_first")  # [BN, BK]
        if DOT_F32:  # interpreter: its bf16 dot is not exact; fp32 products of the bf16 values are
            acc += tl.dot(xv.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc = tl.dot(xv, tl.trans(w), acc)
        if GATED:
            wu = tl.load(u_rows + kk[None, :], mask=wm, other=0.0, eviction_policy="evict_first")
            if DOT_F32:
                acc_u += tl.dot(xv.to(tl.float32), tl.trans(wu.to(tl.float32)), input_precision="ieee")
            else:
                acc_u = tl.dot(xv, tl.trans(wu), acc_u)

    if IN_PARTS > 0:  # the norm's rstd, a per-row factor of the sums: applied once, before the rounding
        rstd_in = _prenorm_rstd(part_in, eps, K)
        acc = acc * rstd_in[:, None]
        if GATED:
            acc_u = acc_u * rstd_in[:, None]
    if not RES_FIRST:
        res = _gemv_residual(R, offs_m, offs_n, m_mask, n_mask, stride_r, HAS_RES)
    if GATED:
        y = _gemv_epilogue(acc, acc_u, res, Y, offs_m, offs_n, m_mask, n_mask, stride_y, GATED, HAS_RES)
    else:
        y = _gemv_epilogue(acc, None, res, Y, offs_m, offs_n, m_mask, n_mask, stride_y, GATED, HAS_RES)
    if OUT_PARTS > 0:
        _prenorm_store(nw_out, XW, S_OUT, y, offs_m, offs_n, m_mask, n_mask, stride_xw, OUT_PARTS)


@triton.jit
def _published_norm_kernel(H, NW, XW, S, M, N, stride_h, stride_xw, PARTS: tl.constexpr, WIDTH: tl.constexpr,
                           MP: tl.constexpr, BW: tl.constexpr):
    """Program (part, row block): what a publishing launch's program writes for its output tile
    (:func:`_prenorm_store`, the same code), here for the part's ``WIDTH`` columns of an input no launch wrote (the
    embeddings)."""
    offs_m = tl.program_id(1) * MP + tl.arange(0, MP)
    offs_n = tl.program_id(0) * WIDTH + tl.arange(0, BW)
    m_mask = offs_m < M
    n_mask = (tl.arange(0, BW) < WIDTH) & (offs_n < N)
    h = tl.load(H + offs_m.to(tl.int64)[:, None] * stride_h + offs_n[None, :], mask=m_mask[:, None] & n_mask[None, :],
                other=0.0)
    nw = tl.load(NW + offs_n, mask=n_mask, other=0.0)
    _prenorm_store(nw, XW, S, h, offs_m, offs_n, m_mask, n_mask, stride_xw, PARTS)
