"""Triton kernels behind the opaque ops (CUDA only; imported lazily by the op's CUDA branch).

Validated on CPU with ``TRITON_INTERPRET=1`` (``tests/components/test_triton_kernels.py``, skipped when
Triton is not installed) and on the H200 by the GPU conformance matrix.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(X, W, Y, rows, stride_x, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / N
    rstd = tl.math.rsqrt(var + eps)
    y = (x * rstd).to(Y.dtype.element_ty)
    w = tl.load(W + cols, mask=mask, other=0.0)
    out = (w.to(tl.float32) * y.to(tl.float32)).to(Y.dtype.element_ty)
    tl.store(Y + row * N + cols, out, mask=mask)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows:
        _rms_norm_kernel[(rows,)](x2, weight, out, rows, x2.stride(0), n, eps, BLOCK=triton.next_power_of_2(n),
                                  num_warps=4 if n <= 1024 else 8)
    return out


# ------------------------------------------------------------------------------------------------------------
# Paged decode attention (flash-decoding): one query token per row, reads only each row's seq_lens[b] keys.
#
# Pass 1, grid (B, KV heads, splits): program (b, kvh, s) takes the G = H / KV query heads that share K/V
# head kvh, and the s-th share of the row's n_pages = ceil(seq_lens[b] / page) pages (the share is computed on
# the device from seq_lens, so the loop bound is data-dependent while every shape stays static: no host sync,
# capturable).  Scores are a G x page x D broadcast multiply + sum in fp32 (G can be 2..8, below tl.dot's 16),
# softmax is online in fp32 in the log2 domain, P @ V is fp32 (probabilities are *not* rounded to bf16).  The
# split writes its partial (max, sum, acc) to fp32 workspaces; an empty split writes (-inf, 0, 0).
# Pass 2, grid (B, H): combine the splits, divide, round to the output dtype once; a row without keys
# (seq_lens 0: inactive) writes zeros.

_LOG2E = 1.4426950408889634


@triton.jit
def _paged_decode_split_kernel(Q, K, V, BT, SL, M_ws, L_ws, ACC_ws,
                               stride_qb, stride_qh,
                               stride_kp, stride_kt, stride_kh,
                               stride_vp, stride_vt, stride_vh,
                               stride_bt, max_pages, qk_scale_log2,
                               KVH: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                               DP: tl.constexpr, PAGE: tl.constexpr, SPLITS: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, GP)
    offs_d = tl.arange(0, DP)
    offs_n = tl.arange(0, PAGE)
    g_mask = offs_g < G
    d_mask = offs_d < D

    seq_len = tl.maximum(tl.load(SL + b).to(tl.int32), 0)
    n_pages = tl.minimum((seq_len + PAGE - 1) // PAGE, max_pages)
    per_split = (n_pages + SPLITS - 1) // SPLITS
    start = split * per_split
    end = tl.minimum(start + per_split, n_pages)

    b64 = b.to(tl.int64)
    heads = kvh * G + offs_g
    q = tl.load(Q + b64 * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)  # [GP, DP]

    m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, DP], dtype=tl.float32)
    # A while loop: the bound is a device value.  (Triton 3.6's interpreter cannot take a tensor bound in
    # range() under NumPy 2.4 -- its __index__ calls int() on a 1-element array -- so the loop the interpreter
    # tests is the loop the GPU runs.  The compiler does not software-pipeline a while loop.)
    p = start
    while p < end:
        page = tl.load(BT + b64 * stride_bt + p).to(tl.int64)
        tok = p * PAGE + offs_n
        n_mask = tok < seq_len
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(K + page * stride_kp + offs_n[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)  # [PAGE, DP]
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * qk_scale_log2  # [GP, PAGE], log2 units
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: page p < n_pages holds at least one key
        alpha = tl.math.exp2(m_i - m_new)
        prob = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(prob, axis=1)
        v = tl.load(V + page * stride_vp + offs_n[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)  # [PAGE, DP]
        acc = acc * alpha[:, None] + tl.sum(prob[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
        p += 1

    row = ((b64 * KVH + kvh) * SPLITS + split) * GP + offs_g  # workspace [B, KV, SPLITS, GP(, D)]
    tl.store(M_ws + row, m_i)
    tl.store(L_ws + row, l_i)
    tl.store(ACC_ws + row[:, None] * D + offs_d[None, :], acc, mask=d_mask[None, :])


@triton.jit
def _paged_decode_reduce_kernel(M_ws, L_ws, ACC_ws, Out,
                                H: tl.constexpr, KVH: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
                                D: tl.constexpr, DP: tl.constexpr, SPLITS: tl.constexpr, SP: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // G
    g = h % G
    offs_s = tl.arange(0, SP)
    offs_d = tl.arange(0, DP)
    s_mask = offs_s < SPLITS
    d_mask = offs_d < D
    b64 = b.to(tl.int64)
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
    tl.store(Out + b64 * (H * D) + h * D + offs_d, out.to(Out.dtype.element_ty), mask=d_mask)


def paged_decode_num_splits(batch: int, kv_heads: int, max_pages: int, target_programs: int = 256,
                            max_splits: int = 32) -> int:
    """Splits per (row, KV head), from static shapes only (capturable): enough programs to fill a GPU of ~132
    SMs twice over, never more than the block-table width (a split covers at least one page at full width)."""
    return max(1, min(max_pages, max_splits, triton.cdiv(target_programs, max(1, batch * kv_heads))))


def paged_decode_attention_triton(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                                  block_tables: torch.Tensor, seq_lens: torch.Tensor, scaling: float, *,
                                  num_splits: int | None = None,
                                  workspace: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                                  ) -> torch.Tensor:
    """``q [B, 1, H, D]``, one layer's pools ``[pages + 1, page, KV, D]``, ``block_tables [B, P]`` int32,
    ``seq_lens [B]`` (keys ``0 .. seq_lens[b] - 1`` of row b are attended, 0: the row writes zeros) ->
    ``[B, 1, H * D]`` in q's dtype.  ``workspace``: optional caller-owned fp32 ``(m [B, KV, S, GP],
    l [B, KV, S, GP], acc [B, KV, S, GP, D])`` (S = ``num_splits``, GP = next power of two >= H / KV);
    allocated here when omitted."""
    b, t, h, d = q.shape
    if t != 1:
        raise ValueError(f"paged_decode_attention_triton: one query token per row, got T={t}")
    _, page, kvh, dk = k_pool.shape
    if h % kvh or dk != d or v_pool.shape != k_pool.shape:
        raise ValueError(f"paged_decode_attention_triton: q {tuple(q.shape)} vs pools {tuple(k_pool.shape)}, "
                         f"{tuple(v_pool.shape)}")
    if page & (page - 1):
        raise ValueError(f"paged_decode_attention_triton: page size {page} must be a power of two")
    g = h // kvh
    gp, dp = triton.next_power_of_2(g), triton.next_power_of_2(d)
    p = block_tables.shape[1]
    splits = num_splits or paged_decode_num_splits(b, kvh, p)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError("paged_decode_attention_triton: pools must be contiguous in head_dim")
    out = torch.empty((b, 1, h * d), dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    if workspace is None:
        m_ws = torch.empty((b, kvh, splits, gp), dtype=torch.float32, device=q.device)
        l_ws = torch.empty_like(m_ws)
        acc_ws = torch.empty((b, kvh, splits, gp, d), dtype=torch.float32, device=q.device)
    else:
        m_ws, l_ws, acc_ws = workspace
        if (tuple(m_ws.shape) != (b, kvh, splits, gp) or tuple(l_ws.shape) != (b, kvh, splits, gp)
                or tuple(acc_ws.shape) != (b, kvh, splits, gp, d)
                or any(w.dtype != torch.float32 or not w.is_contiguous() for w in workspace)):
            raise ValueError("paged_decode_attention_triton: workspace shapes/dtypes do not match")
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    num_warps = 4 if gp * dp <= 512 else 8
    _paged_decode_split_kernel[(b, kvh, splits)](
        q, k_pool, v_pool, block_tables, seq_lens, m_ws, l_ws, acc_ws,
        q.stride(0), q.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        block_tables.stride(0), p, float(scaling) * _LOG2E,
        KVH=kvh, G=g, GP=gp, D=d, DP=dp, PAGE=page, SPLITS=splits, num_warps=num_warps)
    _paged_decode_reduce_kernel[(b, h)](
        m_ws, l_ws, acc_ws, out, H=h, KVH=kvh, G=g, GP=gp, D=d, DP=dp, SPLITS=splits,
        SP=triton.next_power_of_2(splits), num_warps=4)
    return out
