"""Per-head norms, the rotary embedding and the paged K/V write (``flare::rope_write_``); the row helpers serve the
fused decode kernel too (:mod:`.fused_decode`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignition.components.kernels.launch import _interpreting, _pdl, _pdl_enter


# ------------------------------------------------------------------------------------------------------------
# Per-head norms + rotary + paged K/V write (``flare::rope_write_``, ``ignition/components/rope_write.py`` states the
# rounding points).  One program per token: its H query heads and KV key heads as [heads, D/2] halves (rotate_half
# pairs element i with i + D/2), each head's RMSNorm statistics in fp32, every product rounded where the canonical modules
# round; the rotated queries to a new [N, H, D], the rotated keys and the values to the pools at the token's slot.
# The same helpers serve the fused decode kernel (:mod:`.fused_decode`) (``flare::rope_decode_attention_``).


@triton.jit
def _norm_rope_halves(src, mask, NW, offs, cos1, cos2, sin1, sin2, eps, D: tl.constexpr, HALF: tl.constexpr,
                      NORM: tl.constexpr, ADD_RN: tl.constexpr, NW_FIRST: tl.constexpr = False):
    """One token's heads (``src``: ``[R, 1]`` pointers to each head's first element) as halves ``(out1, out2)``,
    ``[R, HALF]`` each (rotate_half pairs element i with i + HALF; ``offs`` = 0 .. HALF - 1), RMSNorm'ed when
    ``NORM`` and rotated (``cos*, sin* [1, HALF]`` fp32); see the module comment for the rounding points.  Two
    contiguous loads per row (a gather of each element's partner, ``i ^ HALF``, loses vectorized loads: 112 us per
    layer for a 4096-token Qwen3-8B chunk on the H200, ``results/20261201T033941Z-sm90-run11``).  ``NW_FIRST``: the
    norm weights loaded with the rows, before the statistics -- after them, where the sums cross warps (one row over
    a program's threads: the decode writer's new key), a CTA barrier keeps their loads back, one more round trip; the
    same values, the same bits."""
    x1 = tl.load(src + offs[None, :], mask=mask, other=0.0)
    x2 = tl.load(src + HALF + offs[None, :], mask=mask, other=0.0)
    nw1, nw2 = x1, x2  # the norm weights when loaded here (else unused)
    if NORM and NW_FIRST:
        nw1, nw2 = tl.load(NW + offs), tl.load(NW + HALF + offs)
    return _norm_rope_rows(x1, x2, NW, nw1, nw2, offs, cos1, cos2, sin1, sin2, eps, D, HALF, NORM, NW_FIRST, ADD_RN)


@triton.jit
def _sum_rounded(a, b, dt: tl.constexpr, ADD_RN: tl.constexpr):
    """``dt(dt(a) + dt(b))`` for fp32 ``a, b``: all three roundings kept.  ``ADD_RN`` (every compiled launch,
    :func:`rope_add_rn`): the sum by an ``add.rn.f32`` of its own (inline PTX, opaque to LLVM; ``.rn`` keeps ptxas from
    fusing it) -- with a plain add, LLVM narrows a product's rounding and the sum to bf16 operations and contracts them
    into one ``fma.rn.bf16`` (one rounding instead of two), and which of the two products it fuses follows the
    instruction order: the decode writer's keys differed in bits between ``FLARE_DECODE_V_FIRST`` 0 and 1 or 2 on the
    GPU (run 185; their sm90 PTX fused ``h1 * sin2`` or ``h2 * cos2``).  Not libdevice's ``add_rn``: Triton links its
    flush-to-zero form.  Off in the interpreter, which fuses nothing."""
    ra = a.to(dt).to(tl.float32)
    rb = b.to(dt).to(tl.float32)
    if ADD_RN:
        s = tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=r,r,r", [ra, rb], dtype=tl.float32, is_pure=True,
                                      pack=1)
    else:
        s = ra + rb
    return s.to(dt)


@triton.jit
def _norm_rope_rows(x1, x2, NW, nw1, nw2, offs, cos1, cos2, sin1, sin2, eps, D: tl.constexpr, HALF: tl.constexpr,
                    NORM: tl.constexpr, NW_LOADED: tl.constexpr, ADD_RN: tl.constexpr):
    """:func:`_norm_rope_halves`'s arithmetic on the loaded halves ``x1, x2``: the norm weights ``nw1, nw2`` when
    ``NW_LOADED``, else loaded from ``NW`` after the statistics; the rotation's sums by :func:`_sum_rounded`."""
    dt = x1.dtype
    if NORM:
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        rstd = tl.math.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / D + eps)[:, None]
        if not NW_LOADED:  # each weight half loaded where it is used (rope_write's PTX as before these switches)
            nw1 = tl.load(NW + offs)
        x1 = (nw1.to(tl.float32)[None, :] * (f1 * rstd).to(dt).to(tl.float32)).to(dt)
        if not NW_LOADED:
            nw2 = tl.load(NW + HALF + offs)
        x2 = (nw2.to(tl.float32)[None, :] * (f2 * rstd).to(dt).to(tl.float32)).to(dt)
    h1, h2 = x1.to(tl.float32), x2.to(tl.float32)
    out1 = _sum_rounded(h1 * cos1, -h2 * sin1, dt, ADD_RN)  # rotate_half: -x2
    out2 = _sum_rounded(h2 * cos2, h1 * sin2, dt, ADD_RN)  # then x1
    return out1, out2


@triton.jit
def _rope_cos_sin(COS, SIN, offs, HALF: tl.constexpr):
    """``(cos1, cos2, sin1, sin2)``: one token's cos/sin halves as ``[1, HALF]`` fp32 (``COS``/``SIN``: its row)."""
    return (tl.load(COS + offs).to(tl.float32)[None, :], tl.load(COS + HALF + offs).to(tl.float32)[None, :],
            tl.load(SIN + offs).to(tl.float32)[None, :], tl.load(SIN + HALF + offs).to(tl.float32)[None, :])


@triton.jit
def _rope_write_kv(K, V, KP, VP, KW, offs, cos1, cos2, sin1, sin2, eps, kmask, D: tl.constexpr, HALF: tl.constexpr,
                   K_NORM: tl.constexpr, ADD_RN: tl.constexpr, V_FIRST: tl.constexpr = False):
    """The new keys (normed, rotated) and values of one token from ``K, V`` (``[R, 1]`` row pointers) to the pool
    rows ``KP, VP`` (``[R, 1]`` pointers at the token's slot).  ``V_FIRST``: the values and the key norm's weights
    loaded with the keys, before the keys' statistics and stores (:data:`decode_plan.DECODE_V_FIRST`, and
    :func:`_rope_kv_rows` for loading them earlier still) -- after them, the values' loads stay behind the key stores
    (they might alias) and the weights' behind the statistics' CTA barrier: two more round trips in the writer's
    chain; the same values, the same bits."""
    if V_FIRST:
        _rope_store_kv(_rope_kv_rows(K, V, KW, offs, kmask, HALF, K_NORM), KP, VP, KW, offs, cos1, cos2, sin1, sin2,
                       eps, kmask, D, HALF, K_NORM, ADD_RN)
    else:
        k1, k2 = _norm_rope_halves(K, kmask, KW, offs, cos1, cos2, sin1, sin2, eps, D, HALF, K_NORM, ADD_RN)
        tl.store(KP + offs[None, :], k1, mask=kmask)
        tl.store(KP + HALF + offs[None, :], k2, mask=kmask)
        tl.store(VP + offs[None, :], tl.load(V + offs[None, :], mask=kmask, other=0.0), mask=kmask)
        tl.store(VP + HALF + offs[None, :], tl.load(V + HALF + offs[None, :], mask=kmask, other=0.0), mask=kmask)


@triton.jit
def _rope_kv_rows(K, V, KW, offs, kmask, HALF: tl.constexpr, K_NORM: tl.constexpr):
    """The loads of :func:`_rope_write_kv`, together: ``(k1, k2, v1, v2, nw1, nw2)`` -- the new key's and value's
    halves (``kmask``: which rows; masked off, nothing is read) and the key norm's weights (read where a row is;
    without ``K_NORM`` the key halves again, unused)."""
    k1 = tl.load(K + offs[None, :], mask=kmask, other=0.0)
    k2 = tl.load(K + HALF + offs[None, :], mask=kmask, other=0.0)
    v1 = tl.load(V + offs[None, :], mask=kmask, other=0.0)
    v2 = tl.load(V + HALF + offs[None, :], mask=kmask, other=0.0)
    nw1, nw2 = k1, k2
    if K_NORM:
        any_row = tl.max(kmask.to(tl.int32), axis=0) > 0  # [HALF]: a row of this launch reads them
        nw1 = tl.load(KW + offs, mask=any_row, other=0.0)
        nw2 = tl.load(KW + HALF + offs, mask=any_row, other=0.0)
    return k1, k2, v1, v2, nw1, nw2


@triton.jit
def _rope_store_kv(rows, KP, VP, KW, offs, cos1, cos2, sin1, sin2, eps, kmask, D: tl.constexpr, HALF: tl.constexpr,
                   K_NORM: tl.constexpr, ADD_RN: tl.constexpr):
    """The arithmetic and stores of :func:`_rope_write_kv` on its loads ``rows`` (:func:`_rope_kv_rows`)."""
    k1, k2, v1, v2, nw1, nw2 = rows
    k1, k2 = _norm_rope_rows(k1, k2, KW, nw1, nw2, offs, cos1, cos2, sin1, sin2, eps, D, HALF, K_NORM, True, ADD_RN)
    tl.store(KP + offs[None, :], k1, mask=kmask)
    tl.store(KP + HALF + offs[None, :], k2, mask=kmask)
    tl.store(VP + offs[None, :], v1, mask=kmask)
    tl.store(VP + HALF + offs[None, :], v2, mask=kmask)


@triton.jit
def _rope_write_kernel(Q, K, V, QW, KW, COS, SIN, KP, VP, SLOTS, QO, T,
                       stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                       stride_vb, stride_vt, stride_vh, stride_cb, stride_ct, stride_sb, stride_st,
                       stride_kpp, stride_kps, stride_kph, stride_vpp, stride_vps, stride_vph, eps,
                       H: tl.constexpr, KVH: tl.constexpr, HP: tl.constexpr, KVP: tl.constexpr,
                       D: tl.constexpr, HALF: tl.constexpr, PAGE: tl.constexpr,
                       Q_NORM: tl.constexpr, K_NORM: tl.constexpr, USE_PDL: tl.constexpr, ADD_RN: tl.constexpr):
    _pdl_enter(USE_PDL)
    n = tl.program_id(0)
    b = (n // T).to(tl.int64)
    t = (n % T).to(tl.int64)
    offs = tl.arange(0, HALF)
    cos1, cos2, sin1, sin2 = _rope_cos_sin(COS + b * stride_cb + t * stride_ct, SIN + b * stride_sb + t * stride_st,
                                           offs, HALF)

    hq = tl.arange(0, HP)
    qm = (hq < H)[:, None]
    q1, q2 = _norm_rope_halves(Q + b * stride_qb + t * stride_qt + hq[:, None] * stride_qh, qm, QW, offs,
                               cos1, cos2, sin1, sin2, eps, D, HALF, Q_NORM, ADD_RN)
    q_out = QO + n.to(tl.int64) * (H * D) + hq[:, None] * D + offs[None, :]
    tl.store(q_out, q1, mask=qm)
    tl.store(q_out + HALF, q2, mask=qm)

    slot = tl.load(SLOTS + n).to(tl.int64)
    page = slot // PAGE
    within = slot % PAGE
    hk = tl.arange(0, KVP)[:, None]
    _rope_write_kv(K + b * stride_kb + t * stride_kt + hk * stride_kh, V + b * stride_vb + t * stride_vt + hk * stride_vh,
                   KP + page * stride_kpp + within * stride_kps + hk * stride_kph,
                   VP + page * stride_vpp + within * stride_vps + hk * stride_vph,
                   KW, offs, cos1, cos2, sin1, sin2, eps, hk < KVH, D, HALF, K_NORM, ADD_RN)


def rope_add_rn() -> bool:
    """The rope kernels' ``ADD_RN`` (:func:`_sum_rounded`): on for every compiled launch, off in the interpreter."""
    return not _interpreting()


def _check_rope_inputs(what: str, d: int, tensors, norms) -> None:
    """The rope kernels' layout: head_dim a power of two (the halves), the last axis of every tensor contiguous."""
    if d & (d - 1) or d < 4:
        raise ValueError(f"{what}: head_dim {d} must be a power of two (>= 4)")
    if any(x.stride(-1) != 1 for x in tensors) or any(w is not None and not w.is_contiguous() for w in norms):
        raise ValueError(f"{what}: head_dim (the last axis) must be contiguous")


def rope_write_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: torch.Tensor | None,
                      k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                      k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``q [B, T, H, D]``, ``k, v [B, T, KV, D]`` (any strides with contiguous head_dim), norm weights ``[D]`` or
    None, ``cos, sin [B, T, D]``, one layer's pools ``[pages + 1, page, KV, D]``, sanitized ``slots [B * T]`` ->
    the rotated queries ``[B, T, H, D]`` (new, contiguous); the rotated keys and the values written to the pools.
    Shapes are checked by the op (``rope_write.py``)."""
    b, t, h, d = q.shape
    kvh = k.shape[2]
    _check_rope_inputs("rope_write_triton", d, (q, k, v, cos, sin, k_pool, v_pool), (q_norm, k_norm))
    out = torch.empty((b, t, h, d), dtype=q.dtype, device=q.device)
    if b * t == 0:
        return out
    slots = slots if slots.is_contiguous() else slots.contiguous()
    _rope_write_kernel[(b * t,)](
        q, k, v, q_norm if q_norm is not None else q, k_norm if k_norm is not None else k, cos, sin, k_pool, v_pool,
        slots, out, t,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        float(eps), H=h, KVH=kvh, HP=triton.next_power_of_2(h), KVP=triton.next_power_of_2(kvh), D=d, HALF=d // 2,
        PAGE=k_pool.shape[1], Q_NORM=q_norm is not None, K_NORM=k_norm is not None,
        num_warps=4 if h * d <= 4096 else 8, **_pdl(q.device), ADD_RN=rope_add_rn())
    return out
