"""Triton kernels behind the opaque ops (CUDA only; imported lazily by the op's CUDA branch).

Validated on CPU with ``TRITON_INTERPRET=1`` (``tests/components/test_triton_kernels.py``, skipped when
Triton is not installed) and on the H200 by the GPU conformance matrix.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ignition.components.fused_linear import DOT_ROWS, uses_dot_kernel
from ignition.components.switches import mebibytes, number, rows as switch_rows, switch, whole


# ------------------------------------------------------------------------------------------------------------
# Programmatic dependent launch (PDL, sm90+).  Launched with ``launch_pdl=True``, a kernel may start while the
# kernel before it on the stream is still finishing; the ``USE_PDL`` kernels below then run ``gdc_wait()`` (wait
# for the previous kernel's completion and memory) before they read anything a kernel wrote, and let their own
# dependents launch early (``gdc_launch_dependents()``).  Captured into a CUDA graph as programmatic edges.  Every
# write happens after the wait, and a kernel completes only after its wait returned, so the stream order of every
# earlier kernel is kept.  What a kernel may do before its wait:
#
# - read weights (nothing in a step writes them): the decode GEMV prefetches its weight tiles into L2 there -- the
#   whole weight when it fits the L2 budget (``GEMV_PREFETCH_FULL_BYTES``), else its first tiles;
# - read what was written before the kernel two back on the stream, when that kernel ("the predecessor's
#   predecessor") is known complete: a kernel lets its dependents launch only once it passed its own wait, so when
#   a kernel starts, the one before its predecessor has completed -- EXCEPT after an ``EARLY`` kernel, which lets
#   its dependents launch before its wait.  Such reads go through L2 (``cache_modifier=".cg"``).  The fused decode
#   kernel reads the step's metadata (sequence lengths, block table) and prefetches its K/V blocks this way: its
#   predecessor is the qkv projection, never an ``EARLY`` kernel.
# - ``EARLY`` (at one row, :data:`PDL_EARLY_ROWS`, and the reduce at up to :data:`PDL_EARLY_LARGE_ROWS` behind a large
#   QKV stream; ``FLARE_PDL_EARLY=0`` turns it off): the decode attention's reduce kernel, so the output projection
#   after it launches while the attention runs and streams its weight into L2 during the attention's latency-bound
#   span.  The kernel after an ``EARLY`` one may read nothing but weights before its wait.  Measured on the H200
#   (Qwen3-8B batch 1, one machine, ``results/20261201T050909Z-sm90-run18``): EARLY without the whole-weight o_proj
#   prefetch 4.748 ms, the prefetch without EARLY 4.805, both 4.771 (run 17); Qwen3-0.6B batch 1 with both 1.1090
#   against 1.1217 (``results/20261201T045516Z-sm90-run15``).  At batch 4 it stalled Qwen3-0.6B's output projection
#   (``PDL_EARLY_ROWS``), not Qwen3-8B's (``PDL_EARLY_LARGE_ROWS``).  The one-row GEMVs their callers mark ``early``
#   (the output projection and the MLP's, :data:`GEMV_EARLY`) are ``EARLY`` too: their successors are GEMVs or
#   norms; the qkv projection, whose successor is the fused decode kernel, never is.
#
# ``FLARE_PDL=0`` turns PDL off (side-by-side measurements); off in the interpreter and before sm90.


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _sm90_or_newer(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_enabled(device: torch.device) -> bool:
    """Whether the kernels below launch with programmatic dependent launch on ``device`` (``FLARE_PDL`` is read at
    each launch, so side-by-side runs may switch it; the device capability is queried once per device)."""
    if not switch("FLARE_PDL", True) or _interpreting() or device.type != "cuda":
        return False
    return _sm90_or_newer(device.index if device.index is not None else torch.cuda.current_device())


def _pdl(device: torch.device, early_rows: int | None = None, overlap_bytes: int | None = None) -> dict:
    """Launch options and the ``USE_PDL`` constexpr of one launch (nothing extra when PDL is off); ``early_rows``:
    the kernel takes an ``EARLY`` constexpr too, on when :func:`pdl_early_enabled` for that many rows (and
    ``overlap_bytes``)."""
    opts = {"USE_PDL": True, "launch_pdl": True} if pdl_enabled(device) else {"USE_PDL": False}
    if early_rows is not None:
        opts["EARLY"] = opts["USE_PDL"] and pdl_early_enabled(early_rows, overlap_bytes)
    return opts


#: The largest batch whose decode reduce kernel is ``EARLY`` (``FLARE_PDL_EARLY_ROWS=N`` sets it).  Measured at one
#: row (see the rules above); at 4 rows it stalled the output projection after it: Qwen3-0.6B batch 4, side by side
#: in one process (``results/20261201T131618Z-sm90-run34``), 2.02 ms with EARLY against 0.7457x that without -- the
#: o_proj's critical-path share went from 5.4 to 24.0 us per layer once the qkv before it ran run 31's 32x128 w4 s5
#: config (``results/20261201T130837Z-sm90-run33``; either change alone undoes it).
#: Again at 4 rows with the tensor-core o_proj, side by side in one process with the null (``FLARE_PDL_EARLY_ROWS=4``):
#: Qwen3-8B batch 4 0.9926x (paired blocks 10/10 faster against A and A2; the reduce 2.59 -> 1.82 us per layer in the
#: critical path; ``results/20261204T162300Z-sm90-run150``), but Qwen3-0.6B batch 4 1.4114x slower (its o_proj 5.34 ->
#: 23.90 us; ``results/20261204T163100Z-sm90-run151``) -- not adopted, the cause of the loss not diagnosed.  On top of
#: the published norms (carried, ``fused_linear.GEMM_ROWS_PRENORM``) at Qwen3-8B batch 4 no gain: 1.0324x against
#: 1.0325x without it (``results/20261204T174600Z-sm90-run154``).
PDL_EARLY_ROWS = 1

#: The largest batch whose decode reduce kernel is ``EARLY`` behind a large stream: when the projection before the
#: attention (``overlap_bytes``, the QKV weight) reaches :data:`PDL_EARLY_LARGE_MIN_BYTES`
#: (``FLARE_PDL_EARLY_LARGE_ROWS=N``, ``FLARE_PDL_EARLY_LARGE_MIN_MB=N`` set them) -- Qwen3-8B's 48 MiB, not
#: Qwen3-0.6B's 8 MiB, whose o_proj stalled with it (above); 1: no more than :data:`PDL_EARLY_ROWS`.  4 since run 157:
#: Qwen3-8B batch 4 0.9949x side by side in one process with the null, on top of the published norms
#: (``results/20261204T185500Z-sm90-run157``; paired blocks 10/10 faster against A and A2; per layer 114.53 -> 113.92
#: us, the reduce 2.56 -> 1.86), batch 1 0.9989x.
PDL_EARLY_LARGE_ROWS = 4
PDL_EARLY_LARGE_MIN_BYTES = 24 << 20


def pdl_early_rows(overlap_bytes: int | None = None) -> int:
    """The largest batch whose ``EARLY`` kernels let their dependents launch before their wait:
    :data:`PDL_EARLY_ROWS`, or :data:`PDL_EARLY_LARGE_ROWS` when larger and ``overlap_bytes`` (the stream before the
    attention; None: unknown) reaches :data:`PDL_EARLY_LARGE_MIN_BYTES`.  Read at each launch."""
    rows = switch_rows("FLARE_PDL_EARLY_ROWS", PDL_EARLY_ROWS)
    if overlap_bytes is not None and overlap_bytes >= mebibytes("FLARE_PDL_EARLY_LARGE_MIN_MB",
                                                                PDL_EARLY_LARGE_MIN_BYTES):
        rows = max(rows, switch_rows("FLARE_PDL_EARLY_LARGE_ROWS", PDL_EARLY_LARGE_ROWS))
    return rows


def pdl_early_enabled(rows: int = 1, overlap_bytes: int | None = None) -> bool:
    """Whether the kernels that may let their dependents launch before their own wait do so for ``rows`` rows: up to
    :func:`pdl_early_rows` (``overlap_bytes``: the stream before the attention, for its reduce kernel) unless
    ``FLARE_PDL_EARLY=0``; read at each launch, for side-by-side runs."""
    return rows <= pdl_early_rows(overlap_bytes) and switch("FLARE_PDL_EARLY", True)


@triton.jit
def _pdl_enter(USE_PDL: tl.constexpr, EARLY: tl.constexpr = False):
    """Wait for the previous kernel (its writes visible after this) and let the next kernel launch -- after the wait,
    or with ``EARLY`` before it (see the rules above)."""
    if USE_PDL:
        if EARLY:
            gdc_launch_dependents()
        gdc_wait()
        if not EARLY:
            gdc_launch_dependents()


@triton.jit
def _prefetch_l2(ptrs, LAST: tl.constexpr = False):
    """L2 prefetch of the lines at ``ptrs`` (no registers written, nothing returned to the program); ``LAST``: with
    the evict-last L2 priority."""
    asm: tl.constexpr = f"prefetch.global.L2{'::evict_last' if LAST else ''} [$1]; mov.u32 $0, 0;"
    tl.inline_asm_elementwise(asm, "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


#: Stamps per program of the decode kernels' timing probe (``scripts/probe_decode_attention.py``): the first half
#: %globaltimer (ns, one clock for every SM), the second %clock64 (this SM's cycles) at the same points.
PROBE_STAMPS = tl.constexpr(16)


@triton.jit
def _probe_stamp(P, program, point, dep, HAS_PROBE: tl.constexpr):
    """Diagnostics only (off: nothing compiled): both clocks at probe ``point`` of ``program``, read once ``dep`` (an
    int32 scalar the point's work produced) is computed -- the asm takes it as an input, so it cannot be hoisted above
    that work."""
    if HAS_PROBE:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep], dtype=tl.int64, is_pure=False,
                                      pack=1)
        c = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [dep], dtype=tl.int64, is_pure=False, pack=1)
        row = P + program.to(tl.int64) * (2 * PROBE_STAMPS)
        tl.store(row + point, t)
        tl.store(row + PROBE_STAMPS + point, c)


@triton.jit
def _probe_smid(P, program, HAS_PROBE: tl.constexpr):
    """Diagnostics only (off: nothing compiled): the SM ``program`` runs on, in the last %globaltimer slot of its
    probe row (which programs shared an SM)."""
    if HAS_PROBE:
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [program], dtype=tl.int32, is_pure=False,
                                       pack=1)
        tl.store(P + program.to(tl.int64) * (2 * PROBE_STAMPS) + PROBE_STAMPS - 1, sm.to(tl.int64))


@triton.jit
def _rms_norm_kernel(X, W, Y, rows, stride_x, N, eps, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    _pdl_enter(USE_PDL)
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
                                  num_warps=4 if n <= 1024 else 8, **_pdl(x.device))
    return out


# ------------------------------------------------------------------------------------------------------------
# Per-head norms + rotary + paged K/V write (``flare::rope_write_``, ``ignition/components/rope_write.py`` states the
# rounding points).  One program per token: its H query heads and KV key heads as [heads, D/2] halves (rotate_half
# pairs element i with i + D/2), each head's RMSNorm statistics in fp32, every product rounded where the canonical modules
# round; the rotated queries to a new [N, H, D], the rotated keys and the values to the pools at the token's slot.
# The same helpers serve the fused decode kernel below (``flare::rope_decode_attention_``).


@triton.jit
def _norm_rope_halves(src, mask, NW, offs, cos1, cos2, sin1, sin2, eps, D: tl.constexpr, HALF: tl.constexpr,
                      NORM: tl.constexpr):
    """One token's heads (``src``: ``[R, 1]`` pointers to each head's first element) as halves ``(out1, out2)``,
    ``[R, HALF]`` each (rotate_half pairs element i with i + HALF; ``offs`` = 0 .. HALF - 1), RMSNorm'ed when
    ``NORM`` and rotated (``cos*, sin* [1, HALF]`` fp32); see the module comment for the rounding points.  Two
    contiguous loads per row (a gather of each element's partner, ``i ^ HALF``, loses vectorized loads: 112 us per
    layer for a 4096-token Qwen3-8B chunk on the H200, ``results/20261201T033941Z-sm90-run11``)."""
    x1 = tl.load(src + offs[None, :], mask=mask, other=0.0)
    x2 = tl.load(src + HALF + offs[None, :], mask=mask, other=0.0)
    dt = x1.dtype
    if NORM:
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        rstd = tl.math.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / D + eps)[:, None]
        x1 = (tl.load(NW + offs).to(tl.float32)[None, :] * (f1 * rstd).to(dt).to(tl.float32)).to(dt)
        x2 = (tl.load(NW + HALF + offs).to(tl.float32)[None, :] * (f2 * rstd).to(dt).to(tl.float32)).to(dt)
    h1, h2 = x1.to(tl.float32), x2.to(tl.float32)
    out1 = ((h1 * cos1).to(dt).to(tl.float32) + (-h2 * sin1).to(dt).to(tl.float32)).to(dt)  # rotate_half: -x2
    out2 = ((h2 * cos2).to(dt).to(tl.float32) + (h1 * sin2).to(dt).to(tl.float32)).to(dt)  # then x1
    return out1, out2


@triton.jit
def _rope_cos_sin(COS, SIN, offs, HALF: tl.constexpr):
    """``(cos1, cos2, sin1, sin2)``: one token's cos/sin halves as ``[1, HALF]`` fp32 (``COS``/``SIN``: its row)."""
    return (tl.load(COS + offs).to(tl.float32)[None, :], tl.load(COS + HALF + offs).to(tl.float32)[None, :],
            tl.load(SIN + offs).to(tl.float32)[None, :], tl.load(SIN + HALF + offs).to(tl.float32)[None, :])


@triton.jit
def _rope_write_kv(K, V, KP, VP, KW, offs, cos1, cos2, sin1, sin2, eps, kmask, D: tl.constexpr, HALF: tl.constexpr,
                   K_NORM: tl.constexpr):
    """The new keys (normed, rotated) and values of one token from ``K, V`` (``[R, 1]`` row pointers) to the pool
    rows ``KP, VP`` (``[R, 1]`` pointers at the token's slot)."""
    k1, k2 = _norm_rope_halves(K, kmask, KW, offs, cos1, cos2, sin1, sin2, eps, D, HALF, K_NORM)
    tl.store(KP + offs[None, :], k1, mask=kmask)
    tl.store(KP + HALF + offs[None, :], k2, mask=kmask)
    tl.store(VP + offs[None, :], tl.load(V + offs[None, :], mask=kmask, other=0.0), mask=kmask)
    tl.store(VP + HALF + offs[None, :], tl.load(V + HALF + offs[None, :], mask=kmask, other=0.0), mask=kmask)


@triton.jit
def _rope_write_kernel(Q, K, V, QW, KW, COS, SIN, KP, VP, SLOTS, QO, T,
                       stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                       stride_vb, stride_vt, stride_vh, stride_cb, stride_ct, stride_sb, stride_st,
                       stride_kpp, stride_kps, stride_kph, stride_vpp, stride_vps, stride_vph, eps,
                       H: tl.constexpr, KVH: tl.constexpr, HP: tl.constexpr, KVP: tl.constexpr,
                       D: tl.constexpr, HALF: tl.constexpr, PAGE: tl.constexpr,
                       Q_NORM: tl.constexpr, K_NORM: tl.constexpr, USE_PDL: tl.constexpr):
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
                               cos1, cos2, sin1, sin2, eps, D, HALF, Q_NORM)
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
                   KW, offs, cos1, cos2, sin1, sin2, eps, hk < KVH, D, HALF, K_NORM)


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
        num_warps=4 if h * d <= 4096 else 8, **_pdl(q.device))
    return out


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
def _decode_block(blk, q, m_i, l_i, acc, K, V, BT, b64, kvh, seq_len, offs_n, offs_d, d_mask,
                  stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_bt, qk_scale_log2,
                  PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr, PROBE=None, prog=0,
                  HAS_PROBE: tl.constexpr = False, LAST_ONLY: tl.constexpr = False, PV_SPLIT: tl.constexpr = False):
    """One key block (keys blk * BLOCK_N ..) of the online softmax for the program's query rows: ``(m, l, acc)``;
    ``LAST_ONLY``: of the block's keys only the row's last, ``seq_len - 1`` (:data:`DECODE_NEW_KEY_APART`);
    ``PV_SPLIT``: P V as three bf16 products of P's bf16 pieces (:data:`DECODE_PV_SPLIT`)."""
    tok = blk * BLOCK_N + offs_n
    n_mask = tok < seq_len
    if LAST_ONLY:
        n_mask = n_mask & (tok >= seq_len - 1)
    _probe_stamp(PROBE, prog, 8, blk, HAS_PROBE)  # the probe's block stamps: the program's last block
    page = tl.load(BT + b64 * stride_bt + tok // PAGE, mask=n_mask, other=0).to(tl.int64)  # one id per key
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
    """Row ``b``'s keys, clamped to ``0 .. max_pages * PAGE`` (read through L2: see the PDL rules above)."""
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
                   HAS_PROBE: tl.constexpr = False, PV_SPLIT: tl.constexpr = False):
    """The online softmax of the query tile ``q [QR, DP]`` over key blocks ``start .. end - 1``: ``(m, l, acc)``."""
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


# ------------------------------------------------------------------------------------------------------------
# Fused decode step of one layer (``flare::rope_decode_attention_``, ``ignition/components/decode_attention.py``):
# q_norm / k_norm, the rotary embedding, the paged K/V write and pass 1 of the decode attention above in ONE launch,
# grid (B, KV heads, splits); pass 2 is the reduce kernel above.  Each program forms its group's rotated query rows
# itself (the row helper of ``flare::rope_write_``), so nothing waits for another kernel's q.  The K/V write: the
# program whose share holds the row's last key block (split 0 when the row has no key) writes the new key and value
# of its KV head to the token's slot, then a CTA barrier, then reads its blocks -- the only reader of that slot in
# this launch is that program (the step's new token is its row's last key; other splits read earlier blocks; a sink
# slot is read by nobody), and a barrier orders a CTA's global writes before its later reads.
# Side by side on the H200 (``scripts/bench_decode_attention.py``, ``results/20261201T031427Z-sm90-run9``): a combine
# in the kernel by the last program of each group (atomic counter) lost to the reduce kernel at every shape (the
# last program reads all partials of its group alone), so pass 2 stays a kernel.


@triton.jit
def _rope_decode_kernel(Q, K, V, QW, KW, COS, SIN, KP, VP, SLOTS, BT, SL, M_ws, L_ws, ACC_ws, Out,
                        stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_cb, stride_sb,
                        stride_kp, stride_kt, stride_kph, stride_vp, stride_vt, stride_vph,
                        stride_bt, max_pages, qk_scale_log2, eps,
                        H: tl.constexpr, KVH: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, QR: tl.constexpr,
                        D: tl.constexpr, HALF: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                        SPLITS: tl.constexpr, Q_NORM: tl.constexpr, K_NORM: tl.constexpr,
                        DOT_F32: tl.constexpr, PIPELINE: tl.constexpr, USE_PDL: tl.constexpr,
                        KV_PREFETCH: tl.constexpr, KV_LINES: tl.constexpr, PROBE=None,
                        HAS_PROBE: tl.constexpr = False, KV_LAST: tl.constexpr = False,
                        NEW_APART: tl.constexpr = False, WS: tl.constexpr = 0, PV_SPLIT: tl.constexpr = False,
                        SMEM_PAD: tl.constexpr = 0, TRIGGER: tl.constexpr = 0):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    b64 = b.to(tl.int64)
    prog = (b * KVH + kvh) * SPLITS + split  # the timing probe's row (HAS_PROBE: diagnostics only)
    _probe_stamp(PROBE, prog, 0, split, HAS_PROBE)
    _probe_smid(PROBE, prog, HAS_PROBE)
    # Before the wait (the rules at the top of this file): the share of this split from the sequence length, and an
    # L2 prefetch of its first KV_PREFETCH keys -- the old keys come from HBM while the qkv projection finishes.
    # NEW_APART: splits 0 .. SPLITS - 1 walk the keys before the row's last; program SPLITS (its share empty) writes
    # the new key and value and forms that key's partial alone (:data:`DECODE_NEW_KEY_APART`)
    seq_len, n_blocks, per_split, start, end = _decode_share(SL, b, split, max_pages, PAGE, BLOCK_N, SPLITS,
                                                             NEW_APART)
    if USE_PDL and KV_PREFETCH > 0:
        _decode_prefetch_kv(start, end, KP, VP, BT, b64, kvh, seq_len, stride_kp, stride_kt, stride_kph, stride_vp,
                            stride_vt, stride_vph, stride_bt, D, PAGE, BLOCK_N, KV_LINES, KV_PREFETCH, KV_LAST)
    _probe_stamp(PROBE, prog, 1, seq_len, HAS_PROBE)
    # after the wait: tried and removed, the reduce (and through it o_proj and the MLP) launched before it -- within
    # noise in the one-row layer graphs (Qwen3-0.6B 1.0032x, Qwen3-8B 1.0020x, ``results/20261201T190000Z-sm90-run77``).
    # Tried and removed too: the writer's new K/V rows and the first one or two key blocks loaded before the query
    # rows' arithmetic (the new slot patched in; same bits) -- slower in both layer graphs (1 block: Qwen3-8B 1.016x,
    # Qwen3-0.6B 1.044x; 2 blocks: 1.025x, 1.076x; ``results/20261201T202700Z-sm90-run79``).
    # Tried and removed too: the trigger after the key loop instead (so that the reduce and, through the EARLY chain,
    # the projections after it stream their weights only once this kernel's K/V loads are done) -- the last block's
    # K/V load stayed 3.3 us at Qwen3-0.6B, and slower: the one-row layer graphs 1.053x (0.6B) and 1.015x (8B), the
    # Qwen3-0.6B step 1.113x side by side (``results/20261201T213000Z-sm90-run84``).
    if TRIGGER == 0:
        _pdl_enter(USE_PDL)
    elif USE_PDL:  # a later trigger (``FLARE_DECODE_TRIGGER``, :func:`fused_decode_launch_options`): the wait alone
        gdc_wait()
    _probe_stamp(PROBE, prog, 2, split, HAS_PROBE)
    offs_g = tl.arange(0, QR)
    offs_d = tl.arange(0, D)
    d_mask = offs_d < D
    offs_h = tl.arange(0, HALF)
    cos1, cos2, sin1, sin2 = _rope_cos_sin(COS + b64 * stride_cb, SIN + b64 * stride_sb, offs_h, HALF)
    q1, q2 = _norm_rope_halves(Q + b64 * stride_qb + (kvh * G + offs_g)[:, None] * stride_qh, (offs_g < G)[:, None],
                               QW, offs_h, cos1, cos2, sin1, sin2, eps, D, HALF, Q_NORM)
    q = tl.reshape(tl.permute(tl.join(q1, q2), (0, 2, 1)), (QR, D))  # [QR, D]: the halves side by side; 0 past G
    _probe_stamp(PROBE, prog, 3, tl.sum(tl.sum(q.to(tl.float32), axis=1), axis=0).to(tl.int32, bitcast=True),
                 HAS_PROBE)
    if USE_PDL and TRIGGER == 1:
        gdc_launch_dependents()

    if NEW_APART:
        writer = SPLITS
    else:
        writer = tl.where(n_blocks > 0, (n_blocks - 1) // tl.maximum(per_split, 1), 0)
    if split == writer:
        slot = tl.load(SLOTS + b).to(tl.int64)
        one = tl.arange(0, 1)[:, None]
        _rope_write_kv(K + b64 * stride_kb + kvh * stride_kh + one, V + b64 * stride_vb + kvh * stride_vh + one,
                       KP + (slot // PAGE) * stride_kp + (slot % PAGE) * stride_kt + kvh * stride_kph + one,
                       VP + (slot // PAGE) * stride_vp + (slot % PAGE) * stride_vt + kvh * stride_vph + one,
                       KW, offs_h, cos1, cos2, sin1, sin2, eps, one < 1, D, HALF, K_NORM)
        tl.debug_barrier()  # this CTA's reads of the new slot below come after its writes
    _probe_stamp(PROBE, prog, 4, split, HAS_PROBE)

    if NEW_APART and split == SPLITS:  # the new key alone, read back after this program's own write (the barrier)
        full = _decode_len(SL, b, max_pages, PAGE)
        m_i, l_i, acc = _decode_init(QR, D)
        if full > 0:
            m_i, l_i, acc = _decode_block((full - 1) // BLOCK_N, q, m_i, l_i, acc, KP, VP, BT, b64, kvh, full,
                                          tl.arange(0, BLOCK_N), offs_d, d_mask, stride_kp, stride_kt, stride_kph,
                                          stride_vp, stride_vt, stride_vph, stride_bt, qk_scale_log2, PAGE, BLOCK_N,
                                          DOT_F32, LAST_ONLY=True, PV_SPLIT=PV_SPLIT)
    else:
        m_i, l_i, acc = _decode_blocks(q, start, end, KP, VP, BT, b64, kvh, seq_len, tl.arange(0, BLOCK_N), offs_d,
                                       d_mask, stride_kp, stride_kt, stride_kph, stride_vp, stride_vt, stride_vph,
                                       stride_bt, qk_scale_log2, QR, D, PAGE, BLOCK_N, DOT_F32, PIPELINE, PROBE, prog,
                                       HAS_PROBE, PV_SPLIT=PV_SPLIT)
    _probe_stamp(PROBE, prog, 5, tl.sum(l_i, axis=0).to(tl.int32, bitcast=True), HAS_PROBE)
    if USE_PDL and TRIGGER == 2:
        gdc_launch_dependents()
    if SPLITS == 1 and not NEW_APART:
        out = tl.where(l_i[:, None] > 0.0, acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None], 0.0)
        tl.store(Out + b64 * (H * D) + (kvh * G + offs_g)[:, None] * D + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=(offs_g < G)[:, None])
    else:
        _decode_store_partial(M_ws, L_ws, ACC_ws, m_i, l_i, acc, b64, kvh, split, offs_g, offs_d, d_mask, KVH, GP, D,
                              WS if NEW_APART else SPLITS)
    _probe_stamp(PROBE, prog, 6, split, HAS_PROBE)


def _check_pools(what: str, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> tuple[int, int]:
    """``(page size, KV heads)`` of one layer's pools ``[pages + 1, page, KV, D]`` for ``q [B, T, H, D]``; raises
    naming ``what`` when heads, head_dim or the pools disagree, or the page size is not a power of two."""
    h, d = q.shape[2], q.shape[3]
    _, page, kvh, dk = k_pool.shape
    if h % kvh or dk != d or v_pool.shape != k_pool.shape:
        raise ValueError(f"{what}: q {tuple(q.shape)} vs pools {tuple(k_pool.shape)}, {tuple(v_pool.shape)}")
    if page & (page - 1):
        raise ValueError(f"{what}: page size {page} must be a power of two")
    return page, kvh


#: Tried and removed: the decode kernels' pipelined key loop with more stages (``FLARE_DECODE_STAGES=N``): by default
#: each key block waits for every copy in flight (offline sm90 TTGIR ``async_wait {num = 0}``); from 5 stages later
#: blocks' copies stay in flight (``num = 4``), the same bits -- slower side by side in one process with the null
#: (``results/20261204T053500Z-sm90-run128``): Qwen3-8B 5 and 6 stages 1.091x at batch 1, 1.020x at batch 4.


#: Whether the fused decode kernel forms the row's new key's softmax partial in a program of its own
#: (``FLARE_DECODE_NEW_KEY_APART=1`` / ``0``; read at each launch, for side-by-side runs): one more program per (row,
#: KV head) writes the new key and value, reads that one key back and stores its partial; the other splits walk the
#: keys before it and write nothing.  Without, the split holding the row's last key block writes the new key first,
#: then walks its blocks: that writer's chain -- query rows, the new key's norm and rotation, the write, then its
#: blocks -- is the launch's longest (run 123's probe: the write 0.16 us median, 3.2 us at the writer), on the step's
#: critical path.  The reduce then combines one partial more; where the context without the new key fills whole
#: blocks (1024 keys and the new one) the busiest split also walks one block less.  The sums group differently: not
#: the two-kernel path's bits (within the same fp64 bound; deterministic).  Side by side in one process with the null
#: (``results/20261204T072300Z-sm90-run132``): Qwen3-8B batch 1 1.0035x, batch 4 1.0102x (both slower by the paired
#: blocks; at one row the writer was not the longest chain: the attention 9.79 -> 9.66 us, the reduce 2.27 -> 2.99),
#: Qwen3-0.6B batch 1 1.0037x, batch 4 0.9639x (paired blocks 10/10 faster, within noise by the min-max rule; the
#: attention 14.91 -> 13.57 us per layer).  Off.
DECODE_NEW_KEY_APART = False


def decode_new_key_apart() -> bool:
    """:data:`DECODE_NEW_KEY_APART` (``FLARE_DECODE_NEW_KEY_APART``, read at each launch)."""
    return switch("FLARE_DECODE_NEW_KEY_APART", DECODE_NEW_KEY_APART)


#: Whether the decode kernels form P V as three bf16 products of P's exact bf16 pieces (:func:`_decode_p_pieces`) with
#: V as it is in the pool, instead of one tf32x3 product of fp32 P and V widened to fp32 (``FLARE_DECODE_PV_SPLIT=1``
#: / ``0``; read at each launch, for side-by-side runs).  Both are ~fp32 exact: P's pieces hold all 24 bits (tf32x3
#: 22); every bf16 product is exact in fp32.  Offline sm90 (ptxas; the widened V and its tf32 halves were what held the
#: registers): Qwen3-8B's one-row launch (64-key blocks, 17 splits, the K/V prefetch) 255 -> 154 registers, no spills;
#: Qwen3-0.6B's wide one-row launch 202 -> 126; batch 4's 16-key launch 95 -> 84.  Another fp32 sum order than
#: tf32x3: not its bits (deterministic either way; the same bound against fp64).  On since run 141: Qwen3-8B side by
#: side in one process with the null on the H200, 1024-token context (``results/20261204T133200Z-sm90-run141``):
#: batch 1 0.9961x (paired blocks 10/10 faster against A and A2; the attention 9.79 -> 9.28 us and its reduce 2.29 ->
#: 1.86 per layer in the critical path), batch 4 0.9802x (B faster by the min-max rule; the attention 14.94 -> 12.58
#: us per layer).  ``FLARE_DECODE_MAXNREG=176`` on the tf32x3 kernel instead (the same two o_proj programs per SM
#: beside it) was 1.032x / 1.042x slower there.  Except the wide one-row launch (:func:`fused_decode_wide`, Qwen3-0.6B),
#: which keeps tf32x3 unless the switch says otherwise: Qwen3-0.6B side by side in one process with the null
#: (``results/20261204T134100Z-sm90-run142``), tf32x3 against the pieces at batch 1 0.9526x against A, 0.9860x against
#: A2 (paired blocks 10/10 faster against both; the critical path per layer 21.36 -> 20.03 us, the reduce after the
#: attention 3.42 -> 1.70), at batch 4 (the pipelined launch) 1.0615x slower -- and the wide launch's cap at 4 programs
#: per SM (its 126 registers with the pieces) 1.013x slower at batch 1 (:data:`FUSED_DECODE_WIDE_PER_SM`).
DECODE_PV_SPLIT = True


def decode_pv_split(wide: bool = False) -> bool:
    """:data:`DECODE_PV_SPLIT` (``FLARE_DECODE_PV_SPLIT=1`` / ``0`` forces it for every launch, read at each launch);
    unset, off for the ``wide`` launches (:func:`fused_decode_wide`)."""
    return switch("FLARE_DECODE_PV_SPLIT", DECODE_PV_SPLIT and not wide)


def decode_pipelined() -> bool:
    """Whether the decode kernels' key loop is a software-pipelined ``range`` loop (compiled;
    ``FLARE_DECODE_PIPELINE=0`` makes it the plain ``while`` loop the interpreter runs -- same blocks, same order, same
    bits; side-by-side runs)."""
    return not _interpreting() and switch("FLARE_DECODE_PIPELINE", True)


def paged_decode_num_splits(batch: int, kv_heads: int, max_blocks: int, target_programs: int = 1024,
                            max_splits: int = 64) -> int:
    """Splits per (row, KV head), from static shapes only (capturable): ~1024 programs (about 8 per SM of a
    132-SM GPU), never more than the key blocks of the block-table width (a split covers at least one block at
    full width).
    Each program walks its pages one dependent load chain at a time, so the page loop is latency-bound: on the
    H200 (results/20261130T205344Z-sm90-run2) 256 programs took 14 us per layer at B=1 and 36 us at B=4 for
    1024-token contexts (2 and 8 pages per program); more, shorter splits keep more loads in flight."""
    return max(1, min(max_blocks, max_splits, triton.cdiv(target_programs, max(1, batch * kv_heads))))


#: Keys per block of the fused decode kernel's wide launches (:func:`fused_decode_wide`).
FUSED_DECODE_WIDE_BLOCK_N = 32

#: Whether the wide launches of :func:`fused_decode_wide` are the default (``FLARE_DECODE_WIDE=1`` / ``0`` sets it).
#: On since run 90 (``results/20261201T222600Z-sm90-run90``): in the full replay of record (``h200_run.sh``'s replay
#: stage, Qwen3-0.6B, 1024-token context) with their splits capped at one wave (:func:`fused_decode_wide_splits`)
#: the batch-1 step took 0.8137 / 0.8154 ms (seeds 0 / 1) against 0.8562 / 0.8573 without them in the same call,
#: 0.950x; the attention 8.83 -> 5.34 us per layer in the critical path, the layer 24.5 -> 22.7 us.  Before the cap
#: (runs 87, 89) the full replay showed no gain (0.8547, 0.8665 ms) while plain and side-by-side replays showed the
#: same 0.950x (runs 85-88): the wide kernel holds 201 registers per thread (sm90 ptxas; the pipelined one 95), 2
#: programs per SM, and the split count is static, from the block table's width -- the full bench's 81-page table
#: gave 41 splits, 328 programs, two waves that kept the early-launched projections from becoming resident (their
#: critical-path share grew 3.4 -> 5.5 and 2.5 -> 4.8 us); the plain bench's 65 pages gave 33 splits, one wave.
#: ``FLARE_DECODE_MAXNREG=128`` instead of the cap spills and was slower (0.9086 ms, run 90).
DECODE_WIDE = True

#: Programs per SM of the wide launch (201 registers per thread at 4 warps, offline sm90 ptxas:
#: ``scripts/sm90_kernel_check.py``): :func:`fused_decode_wide_splits` keeps its programs in one wave
#: (``FLARE_DECODE_WIDE_PER_SM=N`` sets it, read at each launch).  With P V from P's pieces the launch would hold 126
#: registers, 4 programs per SM: that cap was 1.013x slower at Qwen3-0.6B batch 1 side by side in one process
#: (``results/20261204T134100Z-sm90-run142``), and the pieces themselves slower there than tf32x3, which this launch
#: keeps (:data:`DECODE_PV_SPLIT`).
FUSED_DECODE_WIDE_PER_SM = 2

#: SMs assumed where the device has none to report (the interpreter): the H200's.
DEFAULT_SMS = 132

#: An sm90 SM's limits for resident programs: 65,536 registers, allocated per warp in units of 256 (8 per thread);
#: 228 KiB of shared memory with 1 KiB reserved per program; 64 warps; 32 programs.
SM90_REGISTERS, SM90_SHARED, SM90_WARPS, SM90_PROGRAMS = 65536, 228 << 10, 64, 32


def programs_per_sm(registers: int, warps: int, shared: int = 0) -> int:
    """Programs of a kernel resident on one sm90 SM at once, from its registers per thread (``ptxas``), warps per
    program and shared memory per program in bytes -- e.g. 255 registers at 4 warps: 2; 168: 3; 127: 4; 95 and 84: 5
    (88 after the warp's rounding)."""
    per_warp = -(-registers * 32 // 256) * 256
    return min(SM90_REGISTERS // (per_warp * warps), SM90_SHARED // (shared + 1024), SM90_WARPS // warps,
               SM90_PROGRAMS)


def fused_decode_wide_splits(batch: int, kv_heads: int, device: torch.device) -> int:
    """The wide launch's split cap: its ``batch * kv_heads * splits`` programs in one wave of
    :data:`FUSED_DECODE_WIDE_PER_SM` per SM (``device``'s SM count; :data:`DEFAULT_SMS` off CUDA) -- 33 for
    Qwen3-0.6B's 8 KV heads on the H200's 132 SMs."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else DEFAULT_SMS
    per_sm = whole("FLARE_DECODE_WIDE_PER_SM", FUSED_DECODE_WIDE_PER_SM, low=1)  # side-by-side runs
    return max(1, per_sm * sms // max(1, batch * kv_heads))


def fused_decode_wide(batch: int, groups: int) -> bool:
    """Whether a fused decode launch takes :data:`FUSED_DECODE_WIDE_BLOCK_N`-key blocks (at least a page) and the plain
    key loop instead of whole-page blocks and the software-pipelined loop: when :data:`DECODE_WIDE`
    (``FLARE_DECODE_WIDE``), at one row when the group, rounded up to a power of two, is at most 2 -- the launches
    whose split count reaches the 64 cap (:func:`fused_decode_num_splits`); their splits are then capped at one wave
    (:func:`fused_decode_wide_splits`).  An explicit ``FLARE_DECODE_BLOCK_N`` replaces it (both read at each launch,
    for side-by-side runs).  Other shapes measured on the H200, side by side in one process
    (``results/20261201T213500Z-sm90-run85``, ``...T213800Z-sm90-run86``): Qwen3-0.6B the plain loop alone 1.027x,
    32-key blocks over 32 splits 1.036x (1025 keys: 17 programs per head holding 2 blocks), 64-key blocks over 16
    splits 1.085x, batch 4 1.065x slower; Qwen3-8B (G=4, 32 splits) batch 1 1.0025x, the plain loop alone 0.9998x
    (within noise)."""
    return (batch == 1 and triton.next_power_of_2(max(1, groups)) <= 2
            and switch("FLARE_DECODE_WIDE", DECODE_WIDE) and number("FLARE_DECODE_BLOCK_N") is None)


#: Keys per block of the fused decode kernel's other one-row launches (groups above 2: Qwen3-8B's 4), so that a split
#: covers its share in one block -- one dependent round of page ids then K/V instead of one per 16-key page: at a
#: 1024-token context the 1025 keys are 17 blocks over 17 splits, where 16-key blocks were 65 over 32 splits, 3 in a
#: row for the busiest programs.  Side by side in one process with the null (``results/20261202T100100Z-sm90-run124``,
#: ``FLARE_DECODE_BLOCK_N=64``): Qwen3-8B batch 1 0.9866x (paired blocks 10/10 against A and A2; 32-key blocks
#: 0.9934x), batch 4 1.061x slower -- so at one row only.  In the replay (``results/20261202T101300Z-sm90-run126``)
#: the attention's critical path per layer went 10.82 -> 9.41 us and the reduce's 2.56 -> 2.21 (run 122).
#: ``FLARE_DECODE_ONE_ROW_BLOCKS=0`` restores whole pages; an explicit ``FLARE_DECODE_BLOCK_N`` replaces both.  Other
#: contexts not measured.
FUSED_DECODE_ONE_ROW_BLOCK_N = 64


def _large_group_blocks(groups: int, name: str) -> bool:
    """The shared part of the fused decode kernel's block rules for groups above 2 heads (rounded up to a power of
    two): the rule's switch ``name`` on (default) and no explicit ``FLARE_DECODE_BLOCK_N`` (read at each launch)."""
    return (triton.next_power_of_2(max(1, groups)) > 2 and switch(name, True)
            and number("FLARE_DECODE_BLOCK_N") is None)


def fused_decode_one_row_blocks(batch: int, groups: int) -> bool:
    """Whether a fused decode launch takes :data:`FUSED_DECODE_ONE_ROW_BLOCK_N`-key blocks: at one row, for a group
    above 2 heads (rounded up to a power of two; the smaller ones are :func:`fused_decode_wide`'s, whole pages with
    ``FLARE_DECODE_WIDE=0``), ``FLARE_DECODE_ONE_ROW_BLOCKS`` on (default) and no explicit ``FLARE_DECODE_BLOCK_N``
    (read at each launch, for side-by-side runs)."""
    return batch == 1 and _large_group_blocks(groups, "FLARE_DECODE_ONE_ROW_BLOCKS")


#: Keys per block of the fused decode kernel's launches of more rows for a group above 2 heads (Qwen3-8B's 4 at batch
#: 4: 17 splits of four 16-key pages each, the busiest split's chain of 4 dependent page rounds -> 2 rounds of 32 keys).
#: Side by side in one process with the null (``results/20261204T151200Z-sm90-run147``, ``FLARE_DECODE_BLOCK_N=32``):
#: Qwen3-8B batch 4 0.9869x (paired blocks 10/10 faster against A and A2, within noise by the min-max rule; per layer
#: 118.18 -> 116.42 us in the critical path); 64-key blocks there 1.0233x slower (``...T152000Z-sm90-run148``).
#: Off in the replay of record's side by side (``results/20261204T161200Z-sm90-run149``): 1.0117x slower at batch 4
#: (the attention 9.86 -> 11.20 us per layer).  Measured at a 1024-token context only; other contexts and batch 8 not
#: measured.  ``FLARE_DECODE_MULTI_ROW_BLOCKS=0`` restores whole pages; an explicit ``FLARE_DECODE_BLOCK_N`` replaces it.
FUSED_DECODE_MULTI_ROW_BLOCK_N = 32


def fused_decode_multi_row_blocks(batch: int, groups: int) -> bool:
    """Whether a fused decode launch takes :data:`FUSED_DECODE_MULTI_ROW_BLOCK_N`-key blocks: more than one row, a group
    above 2 heads (rounded up to a power of two), ``FLARE_DECODE_MULTI_ROW_BLOCKS`` on (default) and no explicit
    ``FLARE_DECODE_BLOCK_N`` (read at each launch, for side-by-side runs)."""
    return batch > 1 and _large_group_blocks(groups, "FLARE_DECODE_MULTI_ROW_BLOCKS")


def decode_block_n(page: int, block_n: int | None = None) -> int:
    """Keys per block of the decode kernels for pages of ``page`` keys: ``block_n`` when given (a power of two, a
    multiple of the page size and >= 16 -- a block gathers ``block_n / page`` pages, one page id per key), else
    ``FLARE_DECODE_BLOCK_N`` when set (side-by-side runs; read at each launch), else whole pages, at least 16
    (``tl.dot``'s minimum N).  Raises naming the bad value.

    Whole pages, measured on the H200 (1024-token contexts, 16-key pages, 32 splits at one row):

    - the attention alone (``scripts/bench_decode_attention.py``, ``results/20261201T065805Z-sm90-run20``): 32-key
      blocks took 8.33 us per layer for Qwen3-0.6B against 9.14 with 16-key blocks, 9.12 against 9.08 for Qwen3-8B;
      at batch 4 16-key blocks won, 64-key blocks lost everywhere;
    - but in the decode step (``results/20261201T070650Z-sm90-run21``, side by side) they did not help: Qwen3-0.6B
      batch 1 1.1216 ms against 1.1021 with 16-key blocks (within noise by the min-max rule, the median 1.8 %
      slower), Qwen3-8B 4.7312 against 4.7301;
    - Qwen3-8B batch 4 (17 splits of 4 pages, the split P V) side by side in one process with the null: 32-key blocks
      0.9869x (paired blocks 10/10 faster against A and A2, within noise by the min-max rule; per layer 118.18 -> 116.42
      us; ``results/20261204T151200Z-sm90-run147``) -- but 1.008x slower at batch 1, where they replace the 64-key
      one-row blocks --, 64-key blocks 1.0233x slower (``results/20261204T152000Z-sm90-run148``): the rule of
      :func:`fused_decode_multi_row_blocks`."""
    if block_n is None:
        env = number("FLARE_DECODE_BLOCK_N")
        if env is None:
            return max(16, page)
        block_n = int(env)
    if block_n < 16 or block_n & (block_n - 1) or block_n % page:
        raise ValueError(f"decode block_n {block_n}: must be a power of two >= 16 and a multiple of the page size "
                         f"{page}")
    return block_n


def _decode_geometry(what: str, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                     block_tables: torch.Tensor, num_splits: int | None, fused: bool = False,
                     block_n: int | None = None) -> dict:
    """The decode kernels' shape constants for ``q [B, 1, H, D]`` and one layer's pools (raises naming ``what``);
    ``num_splits`` None: :func:`fused_decode_num_splits` when ``fused``, else :func:`paged_decode_num_splits`;
    ``block_n``: keys per block (:func:`decode_block_n`)."""
    b, t, h, d = q.shape
    if t != 1:
        raise ValueError(f"{what}: one query token per row, got T={t}")
    page, kvh = _check_pools(what, q, k_pool, v_pool)
    if k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError(f"{what}: pools must be contiguous in head_dim")
    g = h // kvh
    wide = fused and block_n is None and fused_decode_wide(b, g)
    if wide:
        block_n = max(FUSED_DECODE_WIDE_BLOCK_N, page)
    elif fused and block_n is None and fused_decode_one_row_blocks(b, g):
        block_n = max(FUSED_DECODE_ONE_ROW_BLOCK_N, page)
    elif fused and block_n is None and fused_decode_multi_row_blocks(b, g):
        block_n = max(FUSED_DECODE_MULTI_ROW_BLOCK_N, page)
    block_n = decode_block_n(page, block_n)
    max_blocks = triton.cdiv(block_tables.shape[1] * page, block_n)
    splits = num_splits or (fused_decode_num_splits(b, kvh, g, max_blocks) if fused
                            else paged_decode_num_splits(b, kvh, max_blocks))
    if wide and not num_splits:  # one wave, counting the new key's own programs (:data:`DECODE_NEW_KEY_APART`)
        own = 1 if decode_new_key_apart() else 0
        splits = max(1, min(splits, fused_decode_wide_splits(b, kvh, q.device) - own))
    gp = triton.next_power_of_2(g)
    return dict(B=b, H=h, D=d, KVH=kvh, G=g, GP=gp, QR=max(16, gp), PAGE=page, BLOCK_N=block_n, SPLITS=splits,
                SP=triton.next_power_of_2(splits), WIDE=wide)


def _decode_workspace(geo: dict, device, workspace=None):
    """The fp32 split workspaces ``(m, l [B, KV, S, GP], acc [B, KV, S, GP, D])``: ``workspace`` checked, or new."""
    shape = (geo["B"], geo["KVH"], geo["SPLITS"], geo["GP"])
    if workspace is None:
        m_ws = torch.empty(shape, dtype=torch.float32, device=device)
        return m_ws, torch.empty_like(m_ws), torch.empty((*shape, geo["D"]), dtype=torch.float32, device=device)
    m_ws, l_ws, acc_ws = workspace
    if (tuple(m_ws.shape) != shape or tuple(l_ws.shape) != shape or tuple(acc_ws.shape) != (*shape, geo["D"])
            or any(w.dtype != torch.float32 or not w.is_contiguous() for w in workspace)):
        raise ValueError("paged decode attention: workspace shapes/dtypes do not match")
    return workspace


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


#: Keys per program the fused decode kernel prefetches into L2 before its PDL wait (at batch 1: see
#: :data:`DECODE_KV_PREFETCH_ROWS`).  The prefetch pays when the kernel launches early, during the qkv projection --
#: the fused GEMV, which Qwen3 runs at one row (``prefers_fused``); after cuBLAS (more rows) it only lengthens the
#: critical path.  H200, Qwen3-8B, 1024-token context (``results/20261201T044049Z-sm90-run13``): batch 1 4.846 ->
#: 4.779 ms; batch 4 5.524 -> 5.714 (slower: the first version looped over the blocks, there after cuBLAS).
#: Qwen3-0.6B batch 1 (``results/20261201T045516Z-sm90-run15``): 1.1106 -> 1.1217 ms alone, 1.1090 with the EARLY
#: reduce and the whole-weight GEMV prefetch.  Tried and removed: loading the first key blocks into registers before
#: the wait instead (new slot patched in after it) -- bitwise in the interpreter but not compiled for sm90, and
#: Qwen3-0.6B batch 1 within noise, batch 4 1.028x slower (``results/20261201T114209Z-sm90-run27``); again on this
#: kernel, in addition to the prefetch where it may read ahead, only the writer patching its tiles
#: (``results/20261202T021700Z-sm90-run102``): Qwen3-8B batch 1 1.011x (2 blocks) and 1.007x (1 block) slower, within
#: noise, and on sm90 the new keys' bits moved (not diagnosed; a likely cause: the patch's join giving the key halves
#: another layout, so the k_norm statistics sum in another order).
#: Per model it differs (``results/20261201T163000Z-sm90-attnprobe-runs48-53``, one-row layer graphs side by side):
#: off, Qwen3-8B 1.015x slower, Qwen3-0.6B 0.950x (its 8 MiB qkv projection ends ~3.6 us after the attention
#: starts prefetching 4 MiB of K/V, which competes with it); in Qwen3-0.6B's real decode step
#: (``results/20261201T164200Z-sm90-run54``, side by side in one process) 0.980x at batch 1 -- within noise by the
#: min-max rule then; since the early output/MLP projections 0.921x, faster by the rule: it now needs a long enough
#: projection before it (:data:`DECODE_KV_PREFETCH_MIN_BYTES`).
DECODE_KV_PREFETCH_KEYS = 64

#: Tried and removed: the one-row launch keeping its first key block's page ids, which that prefetch reads before the
#: wait, in registers for its key loop (``FLARE_DECODE_PRE_PAGES``; the block-table round trip out of the chain after
#: the wait, the same bits) -- Qwen3-8B batch 1 1.0123x slower side by side in one process with the null (paired blocks
#: 0/10; ``results/20261204T203500Z-sm90-run161``): 162 registers instead of 154, the attention's programs resident
#: earlier beside the qkv's last ones (its lead 1.73 -> 3.10 us), qkv 11.58 -> 13.02 and the attention 9.31 -> 10.18 us
#: per layer in the critical path.
#: Tried and removed: each layer's launch, after its partials, prefetching the next layer's K/V lines of its share
#: into L2 (evict-last, ~100 us ahead; ``FLARE_DECODE_KV_NEXT``, the backend handing each op the next layer's pools) --
#: Qwen3-8B batch 1 0.9988x side by side in one process with the null (``results/20261204T205600Z-sm90-run163``; paired
#: blocks 10/10 faster against A and A2, within noise by the min-max rule), the attention's critical path unchanged
#: (9.26 -> 9.28 us per layer): the block's 3.7 us from page ids to K and V (run 162's stamps,
#: ``results/20261204T204300Z-sm90-run162``) is not the lines' distance.  Those stamps also show the one-row launch's
#: 136 programs on 74 SMs (3 fit on one by registers) -- the open lead.


#: The largest batch whose fused decode kernel prefetches (``FLARE_DECODE_KV_PREFETCH_ROWS=N`` sets it).  1 since run
#: 13, when batch 4's qkv ran on cuBLAS (no early launch).  Since the tensor-core GEMV became the default (run 28) the
#: batch-4 qkv is a PDL kernel too, so the attention after it launches early there as well -- but the prefetch still
#: loses there: Qwen3-8B side by side in one process with the null (``results/20261201T125309Z-sm90-run32``, 4 rows
#: prefetching): batch 4 1.0211x slower (decode_topk 1.0223x; A rebuilt after B: 1.0020x), batch 1 within noise.
#: Again with the evict-last priority, the split P V, 17 splits and the gated gate/up
#: (``results/20261204T145000Z-sm90-run145``): batch 4 1.0257x slower (paired blocks 0/10; 120.06 -> 123.39 us per
#: layer).
DECODE_KV_PREFETCH_ROWS = 1


#: The smallest stream the K/V prefetch may overlap: the bytes of the kernel before the attention (the QKV
#: projection's weight, ``overlap_bytes``) must reach this, else the prefetch competes with a short projection on the
#: critical path (``FLARE_DECODE_KV_PREFETCH_MIN_MB=N`` sets it; 0: any).  Measured on the H200, 1024-token context,
#: batch 1: Qwen3-0.6B (an 8 MiB projection) without the prefetch 0.921x the step's time side by side in one process
#: (``results/20261201T184659Z-sm90-replayin-0.6B``, B faster by the min-max rule; the one-row layer graph 0.961x,
#: ``results/20261201T184100Z-sm90-run72``); Qwen3-8B (48 MiB) 1.014x slower without it (run 72's layer graph, and
#: run 53).  24 MiB lies between the two measured sizes.  With the wide one-row blocks (:data:`DECODE_WIDE`) the
#: prefetch at Qwen3-0.6B measured 0.9905x, within noise (``results/20261201T225800Z-sm90-run93``): unchanged then.
#: 0 (any stream) since run 125: with the evict-last priority (:data:`DECODE_KV_PREFETCH_LAST`) and the evict-first
#: preloads (:data:`GEMV_PRELOAD_EVICT_FIRST`) on, Qwen3-0.6B batch 1 with it 0.9906x side by side in one process
#: with the null (``results/20261202T100800Z-sm90-run125``; within noise by the min-max rule, paired blocks 10/10
#: faster against A and A2), batch 4 (no prefetch) within noise.  ``FLARE_DECODE_KV_PREFETCH_MIN_MB=24`` restores
#: the previous bound.
DECODE_KV_PREFETCH_MIN_BYTES = 0


#: Whether the decode attention's pre-wait K/V prefetch gives its lines the evict-last L2 priority
#: (``FLARE_DECODE_KV_PREFETCH_LAST=1`` / ``0``; read at each launch), so that the weights streaming between the
#: prefetch and the reads (the qkv projection's tail, o_proj's preload) evict other lines first.  On since run 121
#: (``results/20261202T094300Z-sm90-run121``, side by side in one process with the null, 1024-token context): Qwen3-8B
#: batch 1 0.9971x (paired blocks 10/10 faster against A and A2), with :data:`GEMV_PRELOAD_EVICT_FIRST` 0.9782x
#: against that one's 0.9803x alone; batch 4 (no prefetch there) within noise.
DECODE_KV_PREFETCH_LAST = True


def decode_kv_prefetch_keys(batch: int, overlap_bytes: int | None = None) -> int:
    """Keys per program of the fused decode kernel's pre-wait K/V prefetch (0: none) for ``batch`` rows: up to
    :data:`DECODE_KV_PREFETCH_ROWS` rows, and only after a stream of at least
    :data:`DECODE_KV_PREFETCH_MIN_BYTES` (``overlap_bytes``: the bytes the kernel before it streams; None: unknown,
    the rows decide -- standalone launches).  ``FLARE_DECODE_KV_PREFETCH=0`` turns it off; all read at each launch,
    for side-by-side runs."""
    if (batch > switch_rows("FLARE_DECODE_KV_PREFETCH_ROWS", DECODE_KV_PREFETCH_ROWS)
            or not switch("FLARE_DECODE_KV_PREFETCH", True)):
        return 0
    least = mebibytes("FLARE_DECODE_KV_PREFETCH_MIN_MB", DECODE_KV_PREFETCH_MIN_BYTES)
    if overlap_bytes is not None and overlap_bytes < least:
        return 0
    return DECODE_KV_PREFETCH_KEYS


#: The fused decode kernel's split cap (``FLARE_DECODE_MAX_SPLITS`` overrides it).  It matters only for Qwen3-0.6B at
#: batch 1 (Qwen3-8B's cap is its group size's 32, batch 4 takes 16).  Side by side in the whole step
#: (1024-token context): run 23 (``results/20261201T102332Z-sm90-run23``) had 64 splits at 1.0215 ms against 1.0378
#: for 32, but 32 ran first there and every later variant was ~15 us faster; run 26
#: (``results/20261201T104724Z-sm90-run26``, 64 splits with the whole-K prologue preload against 32 without, order
#: swapped) 1.0270 against 1.0264 -- within noise.  In the step's critical path the attention takes 7.34 us per layer
#: at 64 (run 25) against 8.42 at 32 (run 22), another machine.  64 stays; the difference is not shown.
FUSED_DECODE_MAX_SPLITS = 64


def fused_decode_num_splits(batch: int, kv_heads: int, groups: int, max_blocks: int) -> int:
    """Splits per (row, KV head) of the fused decode kernel, from static shapes only: about 544 programs, at most
    :data:`FUSED_DECODE_MAX_SPLITS` splits and at most ``128 / GP`` (GP: the group size rounded up to a power of two
    -- the reduce kernel reads ``splits * GP`` partial rows per group), never more than the block-table width's key
    blocks (:data:`FUSED_DECODE_PROGRAMS`).  Fit to the H200 side by side (1024-token contexts, per layer in a
    36-layer graph):

    - ``results/20261201T031427Z-sm90-run9`` (before the pre-wait K/V prefetch): Qwen3-8B (G=4) B=1: 32 splits
      10.3 us (64: 11.6), B=4: 16 splits 17.1 us (8: 20.5, 32: 21.3); Qwen3-0.6B (G=2) B=1: 64 splits 9.3 us (32:
      10.3), B=4: 16 splits 16.8 us -- the three-launch path took 13.5, 22.5, 11.3 and 20.4 us;
    - ``results/20261201T065805Z-sm90-run20`` (with it): Qwen3-0.6B B=1: 32 splits 9.14 us, 64 splits 9.94;
      Qwen3-8B B=1 32 splits 9.08, B=4 16 splits 18.40 (32: 18.84)."""
    gp = triton.next_power_of_2(max(1, groups))
    cap = max(1, int(number("FLARE_DECODE_MAX_SPLITS", FUSED_DECODE_MAX_SPLITS)))  # side-by-side runs
    programs = whole("FLARE_DECODE_PROGRAMS", FUSED_DECODE_PROGRAMS, low=1)
    return max(1, min(max_blocks, cap, max(1, 128 // gp), triton.cdiv(programs, max(1, batch * kv_heads))))


#: Programs the fused decode kernel's split count aims for (``FLARE_DECODE_PROGRAMS=N``, side-by-side runs): 512,
#: one wave on the H200 at its register count -- 95 to 104 registers per thread at 4 warps (offline sm90 ptxas,
#: ``scripts/sm90_kernel_check.py``) hold 4 to 5 programs per SM, 528 to 660 on 132 SMs; 1024 programs ran in two
#: waves (run 9: 32 splits at batch 4 21.3 us per layer against 17.1 for 16).  A register cap that fits more programs
#: lost (Qwen3-8B side by side in one process, ``results/20261201T142844Z-sm90-run38``): 64 registers and 1024
#: programs 1.090x slower at batch 1, 1.056x at batch 4; 64 registers alone 1.092x / 1.025x (the spills); 80
#: registers and 768 programs 1.039x at batch 1, within noise at batch 4.  544 since run 142 (with
#: :data:`DECODE_PV_SPLIT`'s 84 registers, 5 programs per SM, one wave up to 660): at batch 4 and a 1024-token context
#: 65 pages over 17 splits make a 4-page chain instead of 16 splits' 5 -- Qwen3-8B side by side in one process with the
#: null (``results/20261204T134100Z-sm90-run142``): batch 4 0.9939x (paired blocks 10/10 faster against A and A2, within
#: noise by the min-max rule; the attention 12.61 -> 11.36 us per layer in the critical path, the layer 121.63 ->
#: 120.19), 640 programs (20 splits) alike (0.9940x); batch 1 unchanged (its group cap, 1.0011x).
FUSED_DECODE_PROGRAMS = 544


def fused_decode_launch_options() -> dict:
    """Extra launch options of the fused decode kernel (side-by-side runs; none by default or in the interpreter):
    ``maxnreg`` from ``FLARE_DECODE_MAXNREG=N`` (a register cap of N per thread -- 64 holds 8 programs per SM, one wave
    of 1024 -- at the cost of a few spilled values); ``num_warps`` from ``FLARE_DECODE_WARPS=N`` (default 4);
    ``SMEM_PAD`` from ``FLARE_DECODE_SMEM_KB=N``: each program reserves at least N KiB of shared memory, which caps
    the programs one SM holds (:func:`pad_shared_memory`); ``TRIGGER`` from ``FLARE_DECODE_TRIGGER=N``: where the
    kernel lets the reduce (and through its early trigger the output projection) launch -- 0 after its wait, 1 once
    its query rows are ready, 2 after its key loop."""
    cap = whole("FLARE_DECODE_MAXNREG", 0, low=0)
    if cap and not 24 <= cap <= 255:
        raise ValueError(f"FLARE_DECODE_MAXNREG={cap}: expected 24..255 registers per thread (or 0: no cap)")
    warps = whole("FLARE_DECODE_WARPS", 4, low=1)
    if warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"FLARE_DECODE_WARPS={warps}: expected 1, 2, 4, 8 or 16 warps per program")
    pad = whole("FLARE_DECODE_SMEM_KB", 0, low=0)
    if pad > 227:
        raise ValueError(f"FLARE_DECODE_SMEM_KB={pad}: expected at most 227 KiB per program (sm90)")
    trigger = whole("FLARE_DECODE_TRIGGER", 0, low=0)
    if trigger > 2:
        raise ValueError(f"FLARE_DECODE_TRIGGER={trigger}: expected 0 (after the wait), 1 (after the query rows) or "
                         "2 (after the key loop)")
    if _interpreting():
        return {"num_warps": warps}
    options = {"num_warps": warps, **({"maxnreg": cap} if cap else {})}
    if trigger:
        options["TRIGGER"] = trigger
    if pad:
        pad_shared_memory()
        options["SMEM_PAD"] = pad << 10
    return options


def pad_shared_memory() -> None:
    """Let a kernel with a ``SMEM_PAD`` constexpr reserve that many bytes of dynamic shared memory per program
    (when more than its own use): the launch then holds fewer programs per SM and the block scheduler spreads them
    over more SMs -- a side-by-side knob (``FLARE_DECODE_SMEM_KB``).  Triton has no such option: this wraps
    ``CompiledKernel._init_handles`` once, so the size is set before the binary is loaded (which opts in to more than
    48 KiB) and before its first launch."""
    from triton.compiler.compiler import CompiledKernel

    if getattr(CompiledKernel, "_flare_shared_pad", False):
        return
    load = CompiledKernel._init_handles

    def _init_handles(self):
        fn = getattr(self.src, "fn", None)
        if self.module is None and fn is not None and "SMEM_PAD" in fn.arg_names:
            pad = int(self.src.constants.get((fn.arg_names.index("SMEM_PAD"),), 0) or 0)
            if pad > self.metadata.shared:
                self.metadata = self.metadata._replace(shared=pad)
                self.packed_metadata = (self.metadata.num_warps, self.metadata.num_ctas, pad)
        load(self)

    CompiledKernel._init_handles = _init_handles
    CompiledKernel._flare_shared_pad = True


def rope_decode_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: torch.Tensor | None,
                                 k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                                 k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
                                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scaling: float, *,
                                 num_splits: int | None = None, block_n: int | None = None,
                                 overlap_bytes: int | None = None,
                                 probe: tuple[torch.Tensor, torch.Tensor] | None = None,
                                 prefetch: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """The fused decode step of one layer: ``q [B, 1, H, D]``, ``k, v [B, 1, KV, D]`` (views of the packed QKV
    output are fine), norm weights ``[D]`` or None, ``cos, sin [B, 1, D]``, one layer's pools, sanitized
    ``slots [B]``, ``block_tables [B, P]``, ``seq_lens [B]`` -> ``[B, 1, H * D]``: ``rope_write_triton`` then
    ``paged_decode_attention_triton`` in two launches instead of three (the fused kernel, then the reduce kernel
    unless one split).  ``num_splits``: default :func:`fused_decode_num_splits`; ``block_n``: keys per block
    (:func:`decode_block_n`); ``overlap_bytes``: the bytes the kernel before it streams (the QKV projection's
    weight; None: unknown), which decide its K/V prefetch (:func:`decode_kv_prefetch_keys`).  ``probe``:
    diagnostics (``scripts/probe_decode_attention.py``) -- int64 buffers ``[B * KV * splits, 2 * PROBE_STAMPS]``
    and ``[B * H, 2 * PROBE_STAMPS]`` that the fused and the reduce kernel fill with clock stamps
    (:func:`_probe_stamp`).  ``prefetch``: ``(weight, nbytes)`` -- the reduce kernel's programs, before their wait,
    prefetch the last ``nbytes`` of ``weight`` (contiguous; the output projection's) into L2
    (``decode_attention.DECODE_REDUCE_PREFETCH_MB``; nothing when 0, in the interpreter or without a reduce launch).
    Shapes are checked by the op (``decode_attention.py``)."""
    geo = _decode_geometry("rope_decode_attention_triton", q, k_pool, v_pool, block_tables, num_splits, fused=True,
                           block_n=block_n)
    b, h, d, kvh, page = geo["B"], geo["H"], geo["D"], geo["KVH"], geo["PAGE"]
    _check_rope_inputs("rope_decode_attention_triton", d, (q, k, v, cos, sin), (q_norm, k_norm))
    out = torch.empty((b, 1, h * d), dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    splits = geo["SPLITS"]
    apart = decode_new_key_apart()
    parts = splits + 1 if apart else splits  # the partials per (row, KV head): with the new key's own
    ws_geo = {**geo, "SPLITS": parts, "SP": triton.next_power_of_2(parts)}
    m_ws, l_ws, acc_ws = _decode_workspace(ws_geo, q.device) if parts > 1 else (out, out, out)  # one split: unused
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    slots = slots if slots.is_contiguous() else slots.contiguous()
    _rope_decode_kernel[(b, kvh, parts)](
        q, k, v, q_norm if q_norm is not None else q, k_norm if k_norm is not None else k, cos, sin, k_pool, v_pool,
        slots, block_tables, seq_lens, m_ws, l_ws, acc_ws, out,
        q.stride(0), q.stride(2), k.stride(0), k.stride(2), v.stride(0), v.stride(2), cos.stride(0), sin.stride(0),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        block_tables.stride(0), block_tables.shape[1], float(scaling) * _LOG2E, float(eps),
        H=h, KVH=kvh, G=geo["G"], GP=geo["GP"], QR=geo["QR"], D=d, HALF=d // 2, PAGE=page, BLOCK_N=geo["BLOCK_N"],
        SPLITS=splits, Q_NORM=q_norm is not None, K_NORM=k_norm is not None, DOT_F32=_interpreting(),
        PIPELINE=decode_pipelined() and not geo["WIDE"], KV_PREFETCH=decode_kv_prefetch_keys(b, overlap_bytes),
        KV_LAST=switch("FLARE_DECODE_KV_PREFETCH_LAST", DECODE_KV_PREFETCH_LAST),
        KV_LINES=max(1, d * k_pool.element_size() // 128), **_pdl(q.device),
        **({"NEW_APART": True, "WS": parts} if apart else {}), PV_SPLIT=decode_pv_split(geo["WIDE"]),
        **fused_decode_launch_options(), **_probe_args(probe, 0, b * kvh * parts))
    if parts > 1:
        _paged_decode_reduce_kernel[(b, h)](
            m_ws, l_ws, acc_ws, out, H=h, KVH=kvh, G=geo["G"], GP=geo["GP"], D=d, DP=d, SPLITS=parts,
            SP=ws_geo["SP"], num_warps=4, **_pdl(q.device, early_rows=b, overlap_bytes=overlap_bytes),
            **_probe_args(probe, 1, b * h), **_reduce_prefetch_args(prefetch))
    return out


def _reduce_prefetch_args(prefetch: tuple[torch.Tensor, int] | None) -> dict:
    """The reduce kernel's L2 prefetch arguments for ``(weight, nbytes)``: its last ``nbytes`` (whole 128-byte lines,
    at most the weight) -- none when None or 0 bytes, or in the interpreter; raises unless a contiguous CUDA
    tensor starting on a 128-byte line (the bulk prefetch takes 16-byte aligned addresses)."""
    if prefetch is None or prefetch[1] <= 0 or _interpreting():
        return {}
    weight, nbytes = prefetch
    if not (weight.is_cuda and weight.is_contiguous() and weight.data_ptr() % 128 == 0):
        raise ValueError(f"prefetch: a contiguous CUDA tensor on a 128-byte line, got {weight.device} "
                         f"{tuple(weight.shape)} (contiguous: {weight.is_contiguous()}, address mod 128: "
                         f"{weight.data_ptr() % 128})")
    total = weight.numel() * weight.element_size() // 128
    lines = min(total, triton.cdiv(int(nbytes), 128))
    return {"PF": weight, "PF_FIRST": total - lines, "PF_LINES": lines, "PF_STEP": 128 // weight.element_size(),
            "HAS_PF": True}


def _probe_args(probe: tuple[torch.Tensor, ...] | None, which: int, programs: int) -> dict:
    """The ``PROBE``/``HAS_PROBE`` launch arguments for buffer ``which`` of ``probe`` (none when None); raises when
    the buffer cannot hold ``programs`` rows of stamps."""
    if probe is None:
        return {}
    buf = probe[which]
    if buf.dtype != torch.int64 or not buf.is_contiguous() or buf.numel() < programs * 2 * PROBE_STAMPS.value:
        raise ValueError(f"probe buffer {which}: need a contiguous int64 tensor of >= {programs} x "
                         f"{2 * PROBE_STAMPS.value} stamps, got {buf.dtype} {tuple(buf.shape)}")
    return {"PROBE": buf, "HAS_PROBE": True}


# ------------------------------------------------------------------------------------------------------------
# Decode-time projection: y = x @ W^T for a handful of rows (GEMV, memory-bound on the weight stream), with an
# optional RMSNorm prologue, SiLU-gated epilogue (packed [gate; up] weight) and residual add (``flare::fused_linear``,
# ``ignition/components/fused_linear.py``, states the rounding points).
#
# Grid (cdiv(N_out, BN), cdiv(M, MP)): program (j, r) owns output columns j*BN .. j*BN+BN-1 for the MP rows of
# row block r.  It streams its [BN, BK] weight tile(s) over K once, multiplies every tile by all MP rows of x
# ([MP, BN, BK] broadcast) and accumulates elementwise into an fp32 tile of that shape; ONE tl.sum over BK at
# the end.  The fp32 summation order is therefore a function of (BK, the tile layout) only -- fixed by the
# config, which is a pure function of the shapes (``gemv_config``): no autotuning, no atomics, no split-K, so
# the same shapes give the same bits in every process.  With the norm prologue every program recomputes the
# row statistics from x (MP * K bf16, L2-resident) before its main loop.  K is a constexpr: one compile per
# layer shape, a static trip count (and Triton 3.6's interpreter cannot take a tensor bound in range()).


@triton.jit
def _gemv_x_tile(x_rows, NW, kk, xm, rstd, K: tl.constexpr, HAS_NORM: tl.constexpr, GATED_IN: tl.constexpr,
                 EVEN_K: tl.constexpr):
    """The decode GEMV's input tile at columns ``kk``, ``[MP, BK]`` in x's dtype: x, or the gated input
    ``bf16(bf16(silu(gate)) * up)``, through the RMSNorm prologue (``rstd [MP]``) when ``HAS_NORM``."""
    if GATED_IN:  # x is the packed [gate; up] activation input: bf16(bf16(silu(gate)) * up), as Qwen3MLP
        gx = tl.load(x_rows + kk[None, :], mask=xm, other=0.0).to(tl.float32)
        ux = tl.load(x_rows + K + kk[None, :], mask=xm, other=0.0)
        ax = (gx / (1.0 + tl.exp(-gx))).to(ux.dtype)
        xv = (ax.to(tl.float32) * ux.to(tl.float32)).to(ux.dtype)
    else:
        xv = tl.load(x_rows + kk[None, :], mask=xm, other=0.0)  # [MP, BK] bf16
    if HAS_NORM:
        if EVEN_K:
            nw = tl.load(NW + kk)
        else:
            nw = tl.load(NW + kk, mask=kk < K, other=0.0)
        xv = _gemv_normed(xv, nw, rstd)
    return xv


@triton.jit
def _gemv_normed(xv, nw, rstd):
    """Qwen3RMSNorm of an input tile ``xv [MP, BK]`` with its weights ``nw [BK]`` (:func:`_gemv_normed_tile`)."""
    return _gemv_normed_tile(xv, nw[None, :], rstd)


@triton.jit
def _gemv_normed_tile(xv, nw, rstd):
    """Qwen3RMSNorm of an input tile ``xv [MP, BK]`` with its weights ``nw`` (``[1, BK]`` or ``[MP, BK]``, rows
    alike): bf16(x * rstd), then bf16(weight * that) with the product in fp32."""
    xh = (xv.to(tl.float32) * rstd[:, None]).to(xv.dtype)
    return (nw.to(tl.float32) * xh.to(tl.float32)).to(xv.dtype)


@triton.jit
def _gemv_whole_row(x_rows, NW, offs_k, m_mask, eps, K: tl.constexpr, BK: tl.constexpr, TILES: tl.constexpr):
    """The normed input tiles of a row whose ``TILES`` tiles of ``BK`` are its whole K (the norm prologue with every
    weight tile preloaded): x and the norm weights loaded once, together, and ``rstd`` summed from those tiles in
    :func:`_gemv_rstd`'s order -- the same values with one round trip instead of two.  Returns four tiles (the unused
    ones are the first again)."""
    xm = m_mask[:, None]
    x0 = tl.load(x_rows + offs_k[None, :], mask=xm, other=0.0)
    n0 = tl.load(NW + offs_k)
    x1, x2, x3, n1, n2, n3 = x0, x0, x0, n0, n0, n0
    if TILES >= 2:
        x1 = tl.load(x_rows + (BK + offs_k)[None, :], mask=xm, other=0.0)
        n1 = tl.load(NW + BK + offs_k)
    if TILES >= 3:
        x2 = tl.load(x_rows + (2 * BK + offs_k)[None, :], mask=xm, other=0.0)
        n2 = tl.load(NW + 2 * BK + offs_k)
    if TILES >= 4:
        x3 = tl.load(x_rows + (3 * BK + offs_k)[None, :], mask=xm, other=0.0)
        n3 = tl.load(NW + 3 * BK + offs_k)
    ss = tl.zeros(x0.shape, dtype=tl.float32)
    ss += x0.to(tl.float32) * x0.to(tl.float32)
    if TILES >= 2:
        ss += x1.to(tl.float32) * x1.to(tl.float32)
    if TILES >= 3:
        ss += x2.to(tl.float32) * x2.to(tl.float32)
    if TILES >= 4:
        ss += x3.to(tl.float32) * x3.to(tl.float32)
    rstd = _gemv_rstd_of(ss, eps, K)
    return (_gemv_normed(x0, n0, rstd), _gemv_normed(x1, n1, rstd), _gemv_normed(x2, n2, rstd),
            _gemv_normed(x3, n3, rstd))


@triton.jit
def _gemv_program(X, W, M, N_OUT, stride_x, stride_w, MP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Program (n block, row block)'s offsets, masks and row pointers: ``(offs_m, offs_n, offs_k, m_mask, n_mask,
    x_rows [MP, 1], w_rows [BN, 1])``."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * MP + tl.arange(0, MP)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    m_mask = offs_m < M
    n_mask = offs_n < N_OUT
    x_rows = X + offs_m.to(tl.int64)[:, None] * stride_x  # [MP, 1]
    w_rows = W + offs_n.to(tl.int64)[:, None] * stride_w  # [BN, 1]
    return offs_m, offs_n, offs_k, m_mask, n_mask, x_rows, w_rows


@triton.jit
def _gemv_masks(kk, m_mask, n_mask, K: tl.constexpr, EVEN_K: tl.constexpr):
    """``(x mask [MP, BK], weight mask [BN, BK])`` of the K tile at columns ``kk``."""
    if EVEN_K:
        xm = m_mask[:, None]
        wm = n_mask[:, None]
    else:
        xm = m_mask[:, None] & (kk < K)[None, :]
        wm = n_mask[:, None] & (kk < K)[None, :]
    return xm, wm


@triton.jit
def _gemv_prefetch(W, offs_n, N_OUT, stride_w, K: tl.constexpr, BK: tl.constexpr, PF_LINES: tl.constexpr,
                   FIRST: tl.constexpr, TILES: tl.constexpr, GATED: tl.constexpr):
    """L2 prefetch of weight tiles ``FIRST .. FIRST + TILES - 1`` of this program's rows (and their up halves when
    gated), one per 128-byte line (``PF_LINES`` per tile row), clamped to K."""
    n_c = tl.minimum(offs_n, N_OUT - 1).to(tl.int64)[:, None] * stride_w
    lines = tl.arange(0, PF_LINES) * (BK // PF_LINES)
    for i in tl.static_range(TILES):
        kl = tl.minimum((FIRST + i) * BK + lines, K - 1)[None, :]
        _prefetch_l2(W + n_c + kl)
        if GATED:
            _prefetch_l2(W + N_OUT * stride_w + n_c + kl)


@triton.jit
def _gemv_rstd_of(ss, eps, K: tl.constexpr):
    """``rstd [MP]`` from the elementwise fp32 sums of x^2 ``ss [MP, BK]`` (one sum at the end)."""
    return tl.math.rsqrt(tl.sum(ss, axis=1) / K + eps)


@triton.jit
def _gemv_rstd(x_rows, m_mask, offs_k, eps, K: tl.constexpr, MP: tl.constexpr, BK: tl.constexpr,
               HAS_NORM: tl.constexpr, STAGES: tl.constexpr = 0):
    """``rstd [MP]`` of the RMSNorm prologue: elementwise fp32 accumulation of x^2 over K chunks, one sum at the end
    (ones, unused, without the norm).  ``STAGES``: the chunk loop software-pipelined over that many stages (its loads
    asynchronous and in flight together -- without, the loop waits out one L2 round trip per chunk: offline sm90
    TTGIR, ``scripts/sm90_kernel_check.py``); 0: the plain loop (the same PTX as a ``range`` loop).  The same chunks
    in the same order, the same bits."""
    if HAS_NORM:
        ss = tl.zeros([MP, BK], dtype=tl.float32)
        for k0 in tl.range(0, K, BK, num_stages=STAGES):
            kk = k0 + offs_k
            xm = m_mask[:, None] & (kk < K)[None, :]
            xs = tl.load(x_rows + kk[None, :], mask=xm, other=0.0).to(tl.float32)
            ss += xs * xs
        rstd = _gemv_rstd_of(ss, eps, K)
    else:
        rstd = tl.full([MP], 1.0, dtype=tl.float32)
    return rstd


@triton.jit
def _gemv_epilogue(y, u, r, Y, offs_m, offs_n, m_mask, n_mask, stride_y, GATED: tl.constexpr,
                   HAS_RES: tl.constexpr):
    """From the fp32 sums ``y`` (and ``u``, the up half, when gated) ``[MP, BN]``: round; gated,
    ``bf16(bf16(silu(y)) * u)`` in fp32; ``+ residual`` (``r``, :func:`_gemv_residual`) rounded once; store."""
    out_ty = Y.dtype.element_ty
    y = y.to(out_ty)  # [MP, BN]: the projection, rounded
    if GATED:
        u = u.to(out_ty)
        g = y.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(out_ty)  # silu of the rounded gate, in fp32, rounded
        y = (act.to(tl.float32) * u.to(tl.float32)).to(out_ty)
    mask = m_mask[:, None] & n_mask[None, :]
    if HAS_RES:
        y = (r.to(tl.float32) + y.to(tl.float32)).to(out_ty)
    tl.store(Y + offs_m.to(tl.int64)[:, None] * stride_y + offs_n[None, :], y, mask=mask)
    return y


@triton.jit
def _gemv_weight_tile(w_rows, u_rows, i: tl.constexpr, offs_k, n_mask, BK: tl.constexpr, GATED: tl.constexpr,
                      EVICT_FIRST: tl.constexpr = False):
    """Weight tile ``i`` of the program's rows ``[BN, BK]`` (whole tiles: EVEN_K), and its up half when gated (else
    the same tile again, unused); ``EVICT_FIRST``: with the evict-first L2 priority, as the streamed tiles."""
    policy: tl.constexpr = "evict_first" if EVICT_FIRST else ""
    w = tl.load(w_rows + (i * BK + offs_k)[None, :], mask=n_mask[:, None], other=0.0, eviction_policy=policy)
    if GATED:
        u = tl.load(u_rows + (i * BK + offs_k)[None, :], mask=n_mask[:, None], other=0.0, eviction_policy=policy)
    else:
        u = w
    return w, u


@triton.jit
def _gemv_x_f32(xv, FLAT: tl.constexpr = False):
    """An input tile ``[MP, BK]`` (:func:`_gemv_x_tile`) as fp32 ``[MP, 1, BK]``, broadcast against a weight tile
    (its layout change: a CTA barrier -- the streamed loop converts before issuing the tile's weight loads); ``FLAT``
    (one row): ``[1, BK]`` as it is (:func:`_gemv_acc`)."""
    xf = xv.to(tl.float32)
    if not FLAT:
        xf = xf[:, None, :]
    return xf


@triton.jit
def _gemv_acc(MP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FLAT: tl.constexpr):
    """The elementwise fp32 accumulator: ``[MP, BN, BK]``, or ``[BN, BK]`` when ``FLAT`` (one row: the weight tiles'
    own shape, so the compiler keeps the weight loads' layout -- the 3-D one made every weight tile a layout change
    through shared memory, four CTA barriers per tile, and the x tile another; offline sm90 TTGIR)."""
    if FLAT:
        acc = tl.zeros([BN, BK], dtype=tl.float32)
    else:
        acc = tl.zeros([MP, BN, BK], dtype=tl.float32)
    return acc


@triton.jit
def _gemv_acc_sum(acc, FLAT: tl.constexpr):
    """The accumulator's sums over K, ``[MP, BN]``."""
    if FLAT:
        y = tl.sum(acc, axis=1)[None, :]
    else:
        y = tl.sum(acc, axis=2)
    return y


@triton.jit
def _gemv_tile_product(acc, acc_u, w, u, xf, GATED: tl.constexpr, FLAT: tl.constexpr = False):
    """``acc`` (and ``acc_u`` with the up half ``u`` when gated) plus a weight tile ``w [BN, BK]`` times its fp32
    input tile ``xf`` (:func:`_gemv_x_f32`), elementwise: every tile's step, preloaded or streamed."""
    acc += xf * _gemv_w_f32(w, FLAT)
    if GATED:
        acc_u += xf * _gemv_w_f32(u, FLAT)
    return acc, acc_u


@triton.jit
def _gemv_w_f32(w, FLAT: tl.constexpr):
    """A weight tile ``[BN, BK]`` as fp32, ``[1, BN, BK]`` against the 3-D accumulator (as it is when ``FLAT``)."""
    wf = w.to(tl.float32)
    if not FLAT:
        wf = wf[None, :, :]
    return wf


@triton.jit
def _gemv_x_whole_tile(x_rows, NW, i: tl.constexpr, offs_k, m_mask, rstd, K: tl.constexpr, BK: tl.constexpr,
                       HAS_NORM: tl.constexpr, GATED_IN: tl.constexpr):
    """The input tile of whole weight tile ``i`` (a preloaded one: EVEN_K)."""
    return _gemv_x_tile(x_rows, NW, i * BK + offs_k, m_mask[:, None], rstd, K, HAS_NORM, GATED_IN, True)


@triton.jit
def _gemv_residual(R, offs_m, offs_n, m_mask, n_mask, stride_r, HAS_RES: tl.constexpr):
    """The residual tile ``[MP, BN]`` the epilogue adds (HAS_RES; else a zero scalar, unused)."""
    if HAS_RES:
        r = tl.load(R + offs_m.to(tl.int64)[:, None] * stride_r + offs_n[None, :],
                    mask=m_mask[:, None] & n_mask[None, :], other=0.0)
    else:
        r = 0.0
    return r


@triton.jit
def _fused_gemv_kernel(X, W, NW, R, Y, M, N_OUT, stride_x, stride_w, stride_r, stride_y, eps,
                       K: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr, GATED: tl.constexpr,
                       EVEN_K: tl.constexpr, GATED_IN: tl.constexpr, USE_PDL: tl.constexpr,
                       PREFETCH: tl.constexpr, PF_LINES: tl.constexpr, PRELOAD: tl.constexpr = 0,
                       X_FIRST: tl.constexpr = True, EARLY: tl.constexpr = False,
                       PROBE=None, HAS_PROBE: tl.constexpr = False, FLAT: tl.constexpr = False,
                       STREAM_STAGES: tl.constexpr = 0, PRELOAD_EVICT: tl.constexpr = False):
    prog = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)  # the timing probe's row (diagnostics only)
    _probe_stamp(PROBE, prog, 0, prog, HAS_PROBE)
    _probe_smid(PROBE, prog, HAS_PROBE)
    offs_m, offs_n, offs_k, m_mask, n_mask, x_rows, w_rows = _gemv_program(X, W, M, N_OUT, stride_x, stride_w, MP,
                                                                            BN, BK)
    if GATED:
        u_rows = W + (offs_n + N_OUT).to(tl.int64)[:, None] * stride_w  # the up half: rows N_OUT + n
    else:
        u_rows = w_rows  # unused

    # PRELOAD (EVEN_K; up to 4): the program's first PRELOAD weight tiles (and their up halves when gated) are loaded
    # into registers before the wait -- weights are never written in a step, so this is legal whatever the
    # predecessor -- and multiplied in order after it, with the loop's own x tiles (``_gemv_x_tile``): the same
    # tiles, the same elementwise accumulation order as without (the same bits with the 3-D accumulator; a whole-K
    # preload takes the 2-D one by default, ``GEMV_FLAT``, whose final sum over K groups the lanes otherwise).
    if PRELOAD >= 1:
        w_p0, u_p0 = _gemv_weight_tile(w_rows, u_rows, 0, offs_k, n_mask, BK, GATED, PRELOAD_EVICT)
    if PRELOAD >= 2:
        w_p1, u_p1 = _gemv_weight_tile(w_rows, u_rows, 1, offs_k, n_mask, BK, GATED, PRELOAD_EVICT)
    if PRELOAD >= 3:
        w_p2, u_p2 = _gemv_weight_tile(w_rows, u_rows, 2, offs_k, n_mask, BK, GATED, PRELOAD_EVICT)
    if PRELOAD >= 4:
        w_p3, u_p3 = _gemv_weight_tile(w_rows, u_rows, 3, offs_k, n_mask, BK, GATED, PRELOAD_EVICT)
    if USE_PDL:  # before the wait: L2 prefetch of this program's next weight tiles
        _gemv_prefetch(W, offs_n, N_OUT, stride_w, K, BK, PF_LINES, PRELOAD, PREFETCH, GATED)
    if HAS_PROBE and PRELOAD >= 1:  # stamp 1: the preloaded tiles arrived (the first and the last of them)
        if PRELOAD >= 4:
            w_last = w_p3
        elif PRELOAD >= 3:
            w_last = w_p2
        elif PRELOAD >= 2:
            w_last = w_p1
        else:
            w_last = w_p0
        _probe_stamp(PROBE, prog, 1, (tl.sum(tl.sum(w_p0.to(tl.float32) + w_last.to(tl.float32), axis=1), axis=0)
                                      ).to(tl.int32, bitcast=True), HAS_PROBE)
    else:
        _probe_stamp(PROBE, prog, 1, prog, HAS_PROBE)
    _pdl_enter(USE_PDL, EARLY)
    _probe_stamp(PROBE, prog, 2, prog, HAS_PROBE)
    # The preloaded tiles' inputs and the residual are loaded together, before any of them is used: one round trip
    # after the wait instead of one per tile (each tile's layout change is a CTA barrier that global loads do not
    # cross) -- the same values, the same accumulation order; with the norm prologue and the whole K preloaded, the
    # row statistics come from those tiles too (``_gemv_whole_row``).
    # ``X_FIRST`` False (``FLARE_GEMV_X_FIRST=0``, side-by-side runs): each input tile loaded just before its tile's
    # product, the residual after the loop, as before -- in the steps 1.034x (Qwen3-0.6B) and 1.008x (Qwen3-8B) at
    # batch 1 (runs 66 and 67, ``results/20261201T173333Z-sm90-gpu-replay-0.6B``, ``...173900Z...-8B``).
    early: tl.constexpr = X_FIRST and PRELOAD >= 1
    whole: tl.constexpr = early and HAS_NORM and not GATED_IN and PRELOAD * BK == K
    if whole:
        x_p0, x_p1, x_p2, x_p3 = _gemv_whole_row(x_rows, NW, offs_k, m_mask, eps, K, BK, PRELOAD)
        rstd = tl.full([MP], 1.0, dtype=tl.float32)  # unused: the tiles are normed
    else:
        rstd = _gemv_rstd(x_rows, m_mask, offs_k, eps, K, MP, BK, HAS_NORM)
    if early and not whole:
        x_p0 = _gemv_x_whole_tile(x_rows, NW, 0, offs_k, m_mask, rstd, K, BK, HAS_NORM, GATED_IN)
    if early and not whole and PRELOAD >= 2:
        x_p1 = _gemv_x_whole_tile(x_rows, NW, 1, offs_k, m_mask, rstd, K, BK, HAS_NORM, GATED_IN)
    if early and not whole and PRELOAD >= 3:
        x_p2 = _gemv_x_whole_tile(x_rows, NW, 2, offs_k, m_mask, rstd, K, BK, HAS_NORM, GATED_IN)
    if early and not whole and PRELOAD >= 4:
        x_p3 = _gemv_x_whole_tile(x_rows, NW, 3, offs_k, m_mask, rstd, K, BK, HAS_NORM, GATED_IN)
    if early:
        res = _gemv_residual(R, offs_m, offs_n, m_mask, n_mask, stride_r, HAS_RES)

    acc = _gemv_acc(MP, BN, BK, FLAT)
    if GATED:
        acc_u = _gemv_acc(MP, BN, BK, FLAT)
    else:
        acc_u = acc  # unused
    if PRELOAD >= 1:
        if not X_FIRST:
            x_p0 = _gemv_x_whole_tile(x_rows, NW, 0, offs_k, m_mask, rstd, K, BK, HAS_NORM, GATED_IN)
        acc, acc_u = _gemv_tile_product(acc, acc_u, w_p0, u_p0, _gemv_x_f32(x_p0, FLAT), GATED, FLAT)
    if PRELOAD >= 2:
        if not X_FIRST:
            x_p1 = _gemv_x_whole_tile(x_rows, NW, 1, offs_k, m_mask, rstd, K, BK, HAS_NORM, GATED_IN)
        acc, acc_u = _gemv_tile_product(acc, acc_u, w_p1, u_p1, _gemv_x_f32(x_p1, FLAT), GATED, FLAT)
    if PRELOAD >= 3:
        if not X_FIRST:
            x_p2 = _gemv_x_whole_tile(x_rows, NW, 2, offs_k, m_mask, rstd, K, BK, HAS_NORM, GATED_IN)
        acc, acc_u = _gemv_tile_product(acc, acc_u, w_p2, u_p2, _gemv_x_f32(x_p2, FLAT), GATED, FLAT)
    if PRELOAD >= 4:
        if not X_FIRST:
            x_p3 = _gemv_x_whole_tile(x_rows, NW, 3, offs_k, m_mask, rstd, K, BK, HAS_NORM, GATED_IN)
        acc, acc_u = _gemv_tile_product(acc, acc_u, w_p3, u_p3, _gemv_x_f32(x_p3, FLAT), GATED, FLAT)
    # The streamed tiles (tried and removed: ``FLARE_GEMV_PIPELINE=1``, each iteration issuing the NEXT tile's weight
    # loads before its input tile -- more registers, so fewer programs resident: Qwen3-8B's one-row layer graph 1.086x
    # slower side by side, qkv and down each in a late wave, ``results/20261201T183600Z-sm90-run71``; nor with
    # ``FLARE_GEMV_GROUP=8``, the products of 8 consecutive columns summed before accumulating -- an eighth of the
    # accumulator, offline 56-108 registers, but the in-register regrouping made qkv 16 -> 32 us and down 29 -> 49 us:
    # the layer graph 1.43x (Qwen3-8B) and 1.70x (Qwen3-0.6B) slower, 1.35x with the pipelined stream,
    # ``results/20261201T202700Z-sm90-run79``).
    for k0 in tl.range(PRELOAD * BK, K, BK, num_stages=STREAM_STAGES):
        kk = k0 + offs_k
        xm, wm = _gemv_masks(kk, m_mask, n_mask, K, EVEN_K)
        xf = _gemv_x_f32(_gemv_x_tile(x_rows, NW, kk, xm, rstd, K, HAS_NORM, GATED_IN, EVEN_K), FLAT)
        w = tl.load(w_rows + kk[None, :], mask=wm, other=0.0, eviction_policy="evict_first")  # [BN, BK]
        u = w
        if GATED:
            u = tl.load(u_rows + kk[None, :], mask=wm, other=0.0, eviction_policy="evict_first")
        acc, acc_u = _gemv_tile_product(acc, acc_u, w, u, xf, GATED, FLAT)

    _probe_stamp(PROBE, prog, 3, tl.sum(tl.sum(_gemv_acc_sum(acc, FLAT), axis=1), axis=0).to(tl.int32, bitcast=True),
                 HAS_PROBE)
    if not early:  # no preloaded tiles: the residual after the loop (held across it, it spilled in 8B down)
        res = _gemv_residual(R, offs_m, offs_n, m_mask, n_mask, stride_r, HAS_RES)
    if GATED:
        _gemv_epilogue(_gemv_acc_sum(acc, FLAT), _gemv_acc_sum(acc_u, FLAT), res, Y, offs_m, offs_n, m_mask, n_mask,
                       stride_y, GATED, HAS_RES)
    else:
        _gemv_epilogue(_gemv_acc_sum(acc, FLAT), None, res, Y, offs_m, offs_n, m_mask, n_mask, stride_y, GATED,
                       HAS_RES)
    _probe_stamp(PROBE, prog, 4, prog, HAS_PROBE)


# The few-rows variant (2..16 rows: decode batches, speculative rounds): the same prologues and epilogues, but each
# weight tile meets the rows through the tensor cores, ``tl.dot`` of the row tile ``[MP, BK]`` (rows padded to 16,
# tl.dot's minimum) and the weight tile transposed ``[BK, BN]`` (BN >= 16), accumulated in fp32 ``[MP, BN]`` across
# K in order -- bf16 products are exact in fp32; the sum order within a tile is the MMA's, fixed by the config,
# so the same shapes give the same bits.  The elementwise kernel above costs MP fp32 FMAs per weight element on the
# CUDA cores, which is why it lost to cuBLAS from 4 rows on (``fused_linear.prefers_fused``).  The step takes
# it for plain inputs only (``fused_linear.uses_dot_kernel``; ``FLARE_GEMV_DOT=0`` turns it off): where the input
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


#: SMs of the target (H200); the heuristic aims for at least two programs per SM where N allows.
GEMV_TARGET_SMS = 132
#: fp32 accumulator elements per program the heuristic allows (MP * BN * BK, doubled when gated): 64 per thread
#: at 8 warps -- beyond that the accumulator spills.
GEMV_ACC_BUDGET = 16384
#: rows of x per program (larger M: more row blocks on the grid's second axis).
GEMV_MAX_ROWS = 16
#: weight tiles per program prefetched into L2 before the PDL wait (overlapping the previous kernel's tail) ...
GEMV_PREFETCH_TILES = 2
#: ... or all of them when the whole weight fits this many bytes: every Qwen3-0.6B projection (<= 12 MiB; with the
#: EARLY reduce 1.1217 -> 1.1090 ms, ``results/20261201T045516Z-sm90-run15``), no Qwen3-8B one.  Prefetching the
#: 8B o_proj (32 MiB) whole during the attention cost more than it saved (B=1 4.748 ms without, 4.771 with,
#: ``results/20261201T050909Z-sm90-run18``), its qkv (48 MiB) during the down projection more still (4.905,
#: ``results/20261201T050720Z-sm90-run17``).  ``FLARE_GEMV_PREFETCH_MB`` overrides it (0: first tiles only).
#: Tried and removed: the decode attention's programs prefetching the o_proj weight (all of it, its last 25-75 %, or
#: with the MLP's) into L2 during their latency-bound span, by ``prefetch.global.L2`` per line or by the TMA unit
#: (``cp.async.bulk.prefetch.L2``), before or after their wait -- every variant slower: Qwen3-8B 1.015-1.037x for
#: o_proj, 1.34x with the MLP; Qwen3-0.6B 0.993-1.07x (the prefetching programs stall, ~3 us for 32 MiB, and the
#: projections do not get faster; ``results/20261201T163000Z-sm90-attnprobe-runs48-53``, runs 50-52).
GEMV_PREFETCH_FULL_BYTES = 16 << 20


#: Whether the one-row GEMV whose whole K is preloaded (no streamed tiles) accumulates in the weight tiles' own 2-D
#: shape (:func:`_gemv_acc`; ``FLARE_GEMV_FLAT=1`` / ``0`` sets it, read at each launch for side-by-side runs).
#: Offline sm90 (``scripts/sm90_kernel_check.py``): Qwen3-8B's qkv 31 -> 7 CTA barriers, o_proj 44 -> 4 and 255 -> 168
#: registers (3 programs per SM instead of 2), the head 31 -> 7.  The final sum over K then groups the lanes as the
#: weight loads do, another fp32 order than the 3-D accumulator's (both within the reference's bound; each path
#: deterministic).  Side by side in one process with the null on the H200, 1024-token context, batch 1
#: (``results/20261202T075700Z-sm90-run118``, ``...074600Z-sm90-run117``): Qwen3-8B 0.9846x (10 of 10 blocks faster
#: against A and A2; qkv 13.95 -> 12.51 us and o_proj 11.46 -> 7.97 per layer in the critical path, the attention
#: before it 9.41 -> 10.75), Qwen3-0.6B (every projection preloaded whole) 0.9288x, faster by the min-max rule.
GEMV_FLAT = True

#: Pipeline stages of the one-row GEMV's streamed tiles (the tiles after the preloaded ones: Qwen3-8B's down), which
#: then take the 2-D accumulator too and are copied asynchronously that many tiles ahead (``tl.range``'s software
#: pipeliner; ``FLARE_GEMV_STREAM_STAGES=N`` sets it); 0: the plain loop over the 3-D accumulator.  The 2-D accumulator
#: without the pipeliner lost: Qwen3-8B's down took 43.2 us per layer in the step's critical path against 29.7
#: (``results/20261202T074600Z-sm90-run117``; the preloaded projections gained there).  With it, 3 stages, the step
#: 0.9953x against A but slower than :data:`GEMV_FLAT` alone (0.9846x in the same call; down 29.47 -> 28.51 us), and
#: 3 stages at 8x512 1.0034x (``results/20261202T075700Z-sm90-run118``).
GEMV_STREAM_STAGES = 0


#: Whether the one-row GEMV's preloaded weight tiles take the evict-first L2 priority, as its streamed tiles do
#: (``FLARE_GEMV_PRELOAD_EVICT_FIRST=1`` / ``0``; read at each launch).  A weight is read once per step; with the
#: normal priority the whole-K preloads (Qwen3-8B: qkv 48 MiB during the down, o_proj 32 MiB during the attention,
#: the head's 1.2 GB) can evict what the step reads back soon -- the K/V lines the decode attention prefetched before
#: its wait (run 53's stamps: K and V arriving 1.6-2.8 us after their page ids), the activations.  On since run 121
#: (``results/20261202T094300Z-sm90-run121``, side by side in one process with the null, 1024-token context): Qwen3-8B
#: batch 1 0.9803x (B faster by the min-max rule; paired blocks 10/10 against A and A2; the attention's critical path
#: unchanged, the projections' down), batch 4 (tensor-core launches, no preload) within noise; Qwen3-0.6B batch 1
#: 0.9954x (paired 10/10 against A and A2), batch 4 within noise (``results/20261202T094900Z-sm90-run122``).
GEMV_PRELOAD_EVICT_FIRST = True


#: Tried and removed: each program of a one-row GEMV with its whole K preloaded also prefetching into L2, before its
#: wait, the whole rows of the program 256 further on (``FLARE_GEMV_L2_AHEAD``, Qwen3-8B's o_proj only: its early
#: programs, 261 of 512 in run 123's probe, are resident during the latency-bound attention, the late ones stream
#: their rows after it) -- Qwen3-8B batch 1 1.0131x slower side by side in one process with the null (paired blocks
#: 0/10 faster; ``results/20261202T100100Z-sm90-run124``), as the attention's own prefetch of that weight before (runs
#: 50-52, :data:`GEMV_PREFETCH_FULL_BYTES`).  The prefetch was issued before the preloads: after them, 176 registers,
#: 2 programs per SM instead of 3.

#: Tried and removed: each iteration of the one-row GEMV's streamed loop taking 2 to 4 whole tiles, all their weight
#: loads issued before their input tiles (``FLARE_GEMV_UNROLL=N``; the same tiles in the same order, bitwise the same in
#: the interpreter) -- Qwen3-8B's down (gated input) in the step side by side in one process
#: (``results/20261204T102500Z-sm90-run135``): 8x512 w4 with 2 tiles (100 registers) 1.0336x slower, down 27.94 -> 31.74
#: us per layer in the critical path; 4x1024 w4 with 4 (128 registers, 1024 programs) 1.0527x, 34.11 us; 8x1024 w4
#: with 2 (168 registers, 3 programs per SM) 1.0567x, 35.23 us.  Nor its wider tiles alone: 4x2048 w4 1.0265x slower
#: (``results/20261204T103500Z-sm90-run136``).
#: Tried and removed: Qwen3-8B's one-row down (gated input) split over K (``FLARE_GEMV_SPLIT``): program (n, s) preloads
#: its whole slice of 1..4 tiles before its wait, as the qkv does, and the last of a column block's programs to take a
#: ticket (an acq_rel atomic after a GPU-scope fence) sums the fp32 partials in split order -- deterministic, correct
#: on the GPU (50 launches and 50 graph replays bitwise alike) -- but side by side in one process with the null
#: (``results/20261204T150400Z-sm90-run146``, batch 1): 3 splits 4x1024 w4 (126 registers) 1.0469x slower, 6 splits
#: 8x512 w4 1.0432x, 6 splits 8x1024 w4 1.0855x (paired blocks 0/10); in the critical path down 28.00 -> 32.32 us and
#: gate/up 45.73 -> 48.10 (its 3072 programs fill the SMs: the next qkv's early launch lead fell from 27.1 to 4.9 us).
#: Tried and removed: each iteration of a one-row GEMV's streamed loop (Qwen3-8B's down, 3.58 TB/s in run 126's
#: critical path) prefetching into L2 the tile N ahead (``FLARE_GEMV_STREAM_PREFETCH=N``), so that lines keep coming
#: without registers -- Qwen3-8B batch 1 side by side in one process with the null
#: (``results/20261204T033000Z-sm90-run127``): 1, 2 and 4 tiles ahead 1.026x, 1.022x, 1.057x slower.


#: Tried and removed: Qwen3-8B's one-row down (gated input) through a TMA kernel -- the weight by a tensor descriptor
#: into shared memory, a ``tl.range`` loop software-pipelined 4 to 8 stages deep, the gated input in the same pipeline
#: (``FLARE_GEMV_TMA``).  Alone (cold weights) 32x256 w4 with 8 stages took 26.22 us against the register kernel's
#: 27.92 (3.84 TB/s; 4 and 6 stages, or 16-row boxes, no faster than it), but in the step side by side in one process
#: with the null (``results/20261204T201700Z-sm90-run160``) batch 1 was 1.0473x slower (paired blocks 0/10; per layer
#: 105.06 -> 111.90 us: down 28.00 -> 29.31, qkv +2.69, o_proj +3.01, the attention +1.25) -- its 136 KiB of shared
#: memory per SM crowd out the next qkv's early programs, and Triton 3.6's TMA lowering drops the evict-first hint
#: (offline PTX), so the streamed weight enters L2 at normal priority.


def gemv_flat(mp: int, k: int, bk: int, preload: int) -> tuple[bool, int]:
    """``(FLAT, STREAM_STAGES)`` of a one-row GEMV launch (``mp`` padded rows, ``preload`` of K's ``bk``-column tiles
    preloaded): the 2-D accumulator where the whole K is preloaded (:data:`GEMV_FLAT`) or the streamed tiles are
    pipelined (:data:`GEMV_STREAM_STAGES`); never for more rows."""
    if mp != 1:
        return False, 0
    if preload * bk >= k:
        return switch("FLARE_GEMV_FLAT", GEMV_FLAT), 0
    stages = whole("FLARE_GEMV_STREAM_STAGES", GEMV_STREAM_STAGES, low=0)
    return stages > 0, stages


#: Measured launch configs, ``(M, N, K, gated) -> (BN, BK, num_warps, num_stages)``: the fastest of the H200 sweep
#: ``results/20261130T203339Z-sm90-run1/gemv.json`` (``scripts/bench_gemv.py``) where it beat the heuristic by
#: more than 3 %; entries marked [6] from the re-sweep with programmatic dependent launch
#: (``results/20261201T000448Z-sm90-run6/gemv.json``), [13] and [14] from ``results/20261201T044049Z-sm90-run13/gemv.json`` and
#: ``results/20261201T044844Z-sm90-run14/gemv.json`` (with PDL).  A table, not runtime autotuning: equal shapes always run the same summation order.
GEMV_MEASURED: dict[tuple[int, int, int, bool], tuple[int, int, int, int]] = {
    (1, 6144, 4096, False): (4, 1024, 4, 2),  # Qwen3-8B qkv: its whole K preloaded before the wait (4 tiles, 127
    #   registers, 4 programs per SM; ``gemv_preload_tiles``), the row statistics from those tiles.  In the step side by
    #   side in one process against run 6's 8x512 w4 (13.78 us alone, no preload): batch 1 0.9848x
    #   (``results/20261202T033000Z-sm90-run104``), 0.9865x with the null A2/A 1.0023 (run 105, B's median below both
    #   A's minima); 8x1024 w4 (208 registers, 2 per SM) 1.0002x, 2x1024 w4 0.9948x, 4x1024 w8 0.9949x
    (4, 6144, 4096, False): (16, 512, 8, 2),  # Qwen3-8B qkv: 36.31 us (heuristic 42.47)
    (1, 4096, 4096, False): (8, 1024, 4, 2),  # Qwen3-8B o_proj: 8.44 us (run 1's entry 8x256 w8 not in the top 3) [6]
    #                                           in the layer graph 8x512, 4x1024 (preload 4 or 2), 16x256 1.007-1.051x
    #                                           slower (run 62, ``results/20261201T173000Z-sm90-gemvprobe-runs60-65``)
    (8, 4096, 4096, False): (4, 256, 4, 2),  # Qwen3-8B o_proj: 26.27 us (heuristic 31.23)
    (1, 24576, 4096, True): (16, 256, 8, 2),  # Qwen3-8B gate_up: 66.31 us (heuristic 94.30)
    (1, 24576, 4096, False): (4, 1024, 4, 2),  # Qwen3-8B gate_up packed, norm prologue (``PACKED_GATE_UP_FUSED``):
    #   its whole K preloaded like the qkv's; in the step side by side against cuBLAS + the norm kernel 0.9798x, B
    #   faster by the min-max rule (``results/20261202T035300Z-sm90-run107``; 2x1024 w4 1.029x slower; run 108: 46.75
    #   us per layer, 4.31 TB/s).  Before: 16x256
    #   w4, 50.11 us alone against cuBLAS 49.22 (heuristic 32x512 w8 69.48) [13], slower in the step (runs 14, 75)
    (1, 4096, 1024, False): (8, 1024, 4, 2),  # Qwen3-0.6B qkv: 3.61 us (heuristic 8x1024 w8 4.93) [14]
    (1, 151936, 4096, False): (4, 1024, 4, 2),  # Qwen3-8B head with the final norm (``fused_linear.HEAD_FUSED``):
    #   the qkv's config at the same K, its whole K preloaded and the row statistics from those tiles (the heuristic
    #   32x512 w8 preloads nothing and reads x twice); in the step 278.7 us from the last down's end, 8x1024 w8
    #   288.7, cuBLAS behind the norm kernel 305.9 (``results/20261202T054700Z-sm90-run113``)
    (1, 151936, 1024, False): (8, 1024, 4, 2),  # Qwen3-0.6B head with the final norm: the 0.6B qkv's config; 78.8 us
    #   in the step's critical path (run 115, ``results/20261202T060800Z-sm90-run115``); 4x1024 w4 1.0166x side by side
    (1, 1024, 2048, False): (8, 1024, 4, 2),  # Qwen3-0.6B o_proj: 2.69 us (heuristic 4x1024 w8 2.99) [14]
    (1, 6144, 1024, True): (8, 512, 4, 2),  # Qwen3-0.6B gate_up: 5.18 us (heuristic 8x1024 w8 6.22) [14]
    (1, 1024, 3072, False): (4, 1024, 4, 2),  # Qwen3-0.6B down: 3.55 us (heuristic 4x1024 w8 4.13) [14]
    (1, 4096, 12288, False): (8, 1024, 4, 2),  # Qwen3-8B down: 24.95 us, with the gated input 27.35 (32x1024 w8
    #                                            spilled at 255 registers: 29.87 / 31.52) [6]
    (4, 4096, 12288, False): (4, 512, 8, 2),  # Qwen3-8B down: 49.20 us (heuristic 53.47)
    (8, 4096, 12288, False): (4, 256, 4, 2),  # Qwen3-8B down: 85.62 us (heuristic 106.00)
}


def gemv_prefetch_tiles(weight: torch.Tensor, bk: int) -> int:
    """Weight tiles (of ``bk`` columns) each GEMV program prefetches into L2 before its PDL wait: all of them when
    the weight fits :data:`GEMV_PREFETCH_FULL_BYTES` (or ``FLARE_GEMV_PREFETCH_MB``), else
    :data:`GEMV_PREFETCH_TILES`."""
    tiles = triton.cdiv(weight.shape[1], bk)
    budget = mebibytes("FLARE_GEMV_PREFETCH_MB", GEMV_PREFETCH_FULL_BYTES)
    if weight.numel() * weight.element_size() <= budget:
        return tiles
    return min(GEMV_PREFETCH_TILES, tiles)


#: Weight tiles each one-row plain GEMV program (no norm or gate prologue, no gated output: o_proj, and down after a
#: gated fused gate/up) loads into registers before its PDL wait, while its predecessor finishes
#: (``FLARE_GEMV_PRELOAD`` overrides it; at most 4).  The GEMVs with a prologue or a gated output (qkv, gate/up, the
#: down with the gated input) preload only when the preloaded tiles are their whole K (``FLARE_GEMV_PRELOAD_PROLOGUE``
#: 1 / 0 forces it on / off), side by side on the H200: Qwen3-8B batch 1 (qkv 4 of 8 tiles, down 4 of 12) 5.2294 ms
#: with, 4.6547 without (``results/20261201T103624Z-sm90-run24``: the partial preload holds its tiles in registers
#: across the rstd pass or the gated-input loop -- down went from 29 to 43 us); Qwen3-0.6B batch 1 (qkv 1 tile, gate/up
#: 2 -- whole K) 1.0232 ms with, 1.0378 without in run 23, but within noise in run 26 (see
#: :data:`FUSED_DECODE_MAX_SPLITS`): kept, bitwise the same either way.  The plain GEMVs side by side on the H200,
#: batch 1, 1024-token context (``results/20261201T070650Z-sm90-run21``): Qwen3-0.6B 1.1216 ms without, 1.0617 with 2
#: tiles, **1.0354** with 4
#: (o_proj's and down's whole rows: K = 2 and 3 tiles); Qwen3-8B (o_proj only: its down takes the gated input) 4.7312,
#: 4.7520, 4.7227 -- within noise.  Tried and removed: first-wave programs of the one-row output projection
#: prefetching later programs' whole rows into L2 before the wait -- Qwen3-8B batch 1 within noise (1.006x,
#: ``results/20261201T114716Z-sm90-run28``); and after the wait -- 1.018-1.020x slower in the one-row layer graph
#: (run 65, ``results/20261201T173000Z-sm90-gemvprobe-runs60-65``: at Qwen3-8B 241 of o_proj's 512 programs are
#: resident before the reduce ends, 2 per SM at 255 registers; the 271 late ones stream 6 us after the first wave).
GEMV_PRELOAD_TILES = 4


def gemv_preload_tiles(m: int, k: int, bk: int, plain: bool) -> int:
    """Weight tiles the GEMV loads into registers before its PDL wait (:data:`GEMV_PRELOAD_TILES`): one row, a
    plain input (no norm, no gated input or output -- those too when the tiles cover K, or as
    ``FLARE_GEMV_PRELOAD_PROLOGUE`` says), whole tiles only; never more than the tiles of K."""
    tiles = int(number("FLARE_GEMV_PRELOAD", GEMV_PRELOAD_TILES))
    if m != 1 or k % bk or not (plain or switch("FLARE_GEMV_PRELOAD_PROLOGUE", k // bk <= min(tiles, 4))):
        return 0
    return max(0, min(tiles, 4, k // bk))


#: Measured tensor-core launch configs, ``(N, K, gated) -> (BN, BK, num_warps, num_stages)`` (its row tile is 16 for
#: every row count): the fastest of ``results/20261201T102332Z-sm90-run23/gemv.json`` at 4 and 8 rows (both the same),
#: for the plain-input launches :func:`fused_linear.uses_dot_kernel` takes.  Qwen3-8B's batch-4 launches side by side
#: in the step with deeper pipelines (``FLARE_GEMV_CONFIG``; ``results/20261204T070950Z-sm90-run131``): qkv 8 stages
#: 1.0045x, down 8 stages 1.0069x, o_proj and down 6 stages 0.9994x, qkv 64x256 w4 s4 1.0009x -- within noise --, all
#: three deeper 1.0162x slower.  Tried and removed: the norm kernel in front of the batch-4 qkv letting it launch before
#: the norm's wait (so its programs prefetch their weight into L2 while the down projection streams at ~3.3 TB/s),
#: alone 1.0086x slower, with 16 / 32 tiles prefetched per program 1.066x / 1.109x, 8 tiles without it 1.030x
#: (``results/20261204T070300Z-sm90-run130``) -- as every L2 weight prefetch on this machine.
#: Qwen3-8B's o_proj and down take 512-column tiles (run 23's sweep stopped at 256, its times falling from 64 to 256):
#: side by side in one process with the null at 4 rows (``results/20261204T104300Z-sm90-run137``): down 32x512 w4 s4
#: 0.9851x (B faster by the min-max rule, paired blocks 10/10 against A and A2; down 30.27 -> 27.97 us per layer in
#: the critical path), with o_proj too 0.9834x (o_proj 11.20 -> 10.46 us, the reduce before it 2.11 -> 2.59); o_proj
#: on top of down alone 0.9986x (paired 10/10 against A and A2, within noise by min-max; ``...104700Z-sm90-run138``).
#: Slower at 4 rows (``...103500Z-sm90-run136``, ``...104750Z-sm90-run139``): down 16x512 1.026x, 32x512 w8 1.025x,
#: o_proj 16x512 1.014x, qkv 32x256 1.004x, 16x256 1.034x, 16x512 1.084x.  8 rows not measured (run 23: 4 and 8 alike).
GEMM_ROWS_MEASURED: dict[tuple[int, int, bool], tuple[int, int, int, int]] = {
    (4096, 4096, False): (32, 512, 4, 4),  # Qwen3-8B o_proj (run 137); 32x256 w4 s4 12.12 us alone at 4 rows (run 23)
    (4096, 12288, False): (32, 512, 4, 4),  # Qwen3-8B down (run 137); 32x256 w4 s4 30.02 alone (cuBLAS 28.63; run 23)
    # the plain qkv (its norm run apart), full grid (``results/20261201T121435Z-sm90-run31``, 4 rows; 8 rows alike):
    (6144, 4096, False): (64, 128, 4, 5),  # Qwen3-8B: 15.44 us (the heuristic 16x128 w4 s4: 17.36; cuBLAS 14.62)
    (4096, 1024, False): (32, 128, 4, 5),  # Qwen3-0.6B: 3.70 us (heuristic 4.61; cuBLAS 4.72)
}


#: Whether the tensor-core kernel loads its residual tile right after its wait, before the main loop, instead of after
#: it (``FLARE_GEMM_ROWS_RES_FIRST=1`` / ``0``; read at each launch): after the loop its L2/HBM round trip comes
#: between the last product and the store (offline sm90 PTX: the epilogue's first instruction waits on it) -- once per
#: o_proj and down launch at batch 4.  The same values, the same bits.  On since run 154: Qwen3-8B side by side in one
#: process with the null (``results/20261204T174600Z-sm90-run154``, 1024-token context): batch 4 0.9934x (paired blocks
#: 10/10 faster against A and A2; within noise by the min-max rule; per layer 114.91 -> 114.14 us in the critical
#: path, o_proj 10.46 -> 9.95, down 25.34 -> 24.93), batch 1 (no such launch) 0.9991x.
GEMM_ROWS_RES_FIRST = True

#: Pipeline stages of the tensor-core kernel's row-statistics loop (the norm prologue; ``_gemv_rstd``'s ``STAGES``).
GEMM_ROWS_NORM_STAGES = 3


#: Weight tiles each program of a tensor-core launch taking a published norm (``fused_linear.GEMM_ROWS_PRENORM``:
#: Qwen3-8B's gate/up at batch 4) prefetches before its wait.  It launches while the projection before it streams --
#: no norm launch between -- so its prefetch competes with that stream: run 155's publishing o_proj took 12.58 us per
#: layer against 9.95 without publishing while the gate/up's 384 programs prefetched 2 tiles each (~12 MiB).  Side by
#: side in one process with the null (``results/20261204T184500Z-sm90-run156``, Qwen3-8B batch 4, 1024-token
#: context): 1 tile 0.9960x (paired blocks 10/10 faster against A and A2; per layer 115.14 -> 114.56 us, o_proj
#: 12.67 -> 11.58, gate/up 48.26 -> 48.83), none 0.9980x (o_proj 10.81, gate/up 49.66).
GEMM_ROWS_PRENORM_PREFETCH_TILES = 1


def gemm_rows_prefetch_tiles(published: bool = False) -> int:
    """Weight tiles each tensor-core program prefetches into L2 before its PDL wait: :data:`GEMV_PREFETCH_TILES`
    (``FLARE_GEMM_ROWS_PREFETCH=N`` sets it, read at each launch: side-by-side runs); the launch clamps it to its K's
    tiles.  ``published``: a launch taking a published norm, :data:`GEMM_ROWS_PRENORM_PREFETCH_TILES`
    (``FLARE_GEMM_ROWS_PRENORM_PREFETCH=N``)."""
    tiles = whole("FLARE_GEMM_ROWS_PREFETCH", GEMV_PREFETCH_TILES, low=0)
    if published:
        return whole("FLARE_GEMM_ROWS_PRENORM_PREFETCH", min(tiles, GEMM_ROWS_PRENORM_PREFETCH_TILES), low=0)
    return tiles


def gemm_rows_config(M: int, N: int, K: int, gated: bool = False) -> dict:
    """The tensor-core kernel's launch config, a pure function of the shapes: the :data:`GEMM_ROWS_MEASURED` entry,
    else ``BN`` 32 (16 when that leaves fewer than two programs per SM), ``BK`` 128 (K's power of two when smaller,
    at least 16), 4 warps, 4 stages -- a starting point for ``scripts/bench_gemv.py --dot``.
    ``FLARE_GEMM_ROWS_TABLE=0`` ignores the table, ``FLARE_GEMV_CONFIG`` replaces it per shape
    (:func:`gemv_config_override`, keyed by the row count too; side-by-side runs; both read at each launch)."""
    measured = gemv_config_override(M, N, K, gated) or (
        GEMM_ROWS_MEASURED.get((N, K, bool(gated))) if switch("FLARE_GEMM_ROWS_TABLE", True) else None)
    if measured is not None:
        return dict(zip(("BN", "BK", "num_warps", "num_stages"), measured))
    n_out = N // 2 if gated else N
    bn = 32 if triton.cdiv(n_out, 32) >= 2 * GEMV_TARGET_SMS else 16
    return {"BN": bn, "BK": max(16, min(128, triton.next_power_of_2(K))), "num_warps": 4, "num_stages": 4}


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


def published_norm_triton(h: torch.Tensor, norm_weight: torch.Tensor, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(xw, stats)`` of ``h [rows, N]`` (rows contiguous) for the norm weights ``[N]`` over ``parts`` column blocks of
    ``cdiv(N, parts)`` -- the pair a ``publish_norm`` launch returns (:func:`fused_linear_triton`), in one launch."""
    rows, n = h.shape
    if norm_weight.shape != (n,) or h.stride(-1) != 1 or parts < 1:
        raise ValueError(f"published_norm_triton: h {tuple(h.shape)}, norm_weight {tuple(norm_weight.shape)}, "
                         f"parts {parts}")
    xw = torch.empty_like(h)
    stats = torch.empty((rows, parts), dtype=torch.float32, device=h.device)
    if rows:
        width = triton.cdiv(n, parts)
        mp = min(triton.next_power_of_2(rows), GEMV_MAX_ROWS)
        _published_norm_kernel[(parts, triton.cdiv(rows, mp))](
            h, norm_weight.contiguous(), xw, stats, rows, n, h.stride(0), xw.stride(0), PARTS=parts, WIDTH=width,
            MP=mp, BW=triton.next_power_of_2(width), num_warps=1)
    return xw, stats


def gemm_rows_parts(m: int, n: int, k: int) -> int:
    """The column blocks (programs along N) of an ungated tensor-core launch of ``m`` rows through a ``[n, k]`` weight:
    the statistics a ``publish_norm`` launch returns per row (:func:`fused_linear_triton`)."""
    return triton.cdiv(n, int(gemm_rows_config(max(m, DOT_ROWS.start), n, k)["BN"]))


assert DOT_ROWS.stop - 1 == GEMV_MAX_ROWS  # the tensor-core kernel's one row block holds every row it takes


#: One-row GEMVs the caller marks ``early`` (the output projection, the MLP's: their successors read only weights
#: before their wait) let the next kernel launch before their own wait, so its weight tiles load while they and the
#: attention before them run.  Side by side in the one-row layer graphs on the H200 (run 68,
#: ``results/20261201T175000Z-sm90-gemvprobe-run68``): Qwen3-0.6B o_proj, gate/up and down early 0.9694x
#: (disjoint ranges; o_proj alone 0.9792x), Qwen3-8B o_proj 0.9993x (its successor is the norm before cuBLAS); in
#: the Qwen3-0.6B step (run 69, ``results/20261201T175200Z-sm90-gpu-replay-0.6B``) B=1 0.9540 ms, off 1.0195x.
#: ``FLARE_GEMV_EARLY=0`` turns it off; at one row only (:data:`PDL_EARLY_ROWS`, ``FLARE_PDL_EARLY``).
GEMV_EARLY = True


#: Whether the one-row plain projections (the output projection) run ``smem_gemv``'s Gluon kernel, their weight rows
#: copied into shared memory before the PDL wait (``FLARE_GEMV_SMEM=1``; read at each launch).  Off: not yet measured
#: on the H200.
GEMV_SMEM = False


def gemv_smem_enabled() -> bool:
    """:data:`GEMV_SMEM` (``FLARE_GEMV_SMEM``)."""
    return switch("FLARE_GEMV_SMEM", GEMV_SMEM)


def gemv_early_enabled(device: torch.device, rows: int) -> bool:
    """Whether a one-row GEMV marked ``early`` launches its dependents before its wait on ``device``: PDL on, ``rows``
    within :func:`pdl_early_enabled`, and :data:`GEMV_EARLY` (``FLARE_GEMV_EARLY``; read at each launch)."""
    return pdl_enabled(device) and pdl_early_enabled(rows) and switch("FLARE_GEMV_EARLY", GEMV_EARLY)


def gemv_config_override(M: int, N: int, K: int, gated: bool) -> tuple[int, int, int, int] | None:
    """``FLARE_GEMV_CONFIG="MxNxK[g]=BN/BK/warps/stages;..."`` (side-by-side runs; read at each launch): the launch
    config of those shapes (``g``: gated) instead of the table's or the heuristic's, in whichever kernel launches them
    (:func:`gemv_config`, :func:`gemm_rows_config`); raises naming a malformed item."""
    spec = os.environ.get("FLARE_GEMV_CONFIG", "").strip()
    for item in filter(None, (i.strip() for i in spec.split(";"))):
        key, _, value = item.partition("=")
        try:
            shape = tuple(int(v) for v in key.rstrip("g").split("x"))
            cfg = tuple(int(v) for v in value.split("/"))
        except ValueError:
            shape, cfg = (), ()
        if len(shape) != 3 or len(cfg) != 4 or min(cfg) < 1:
            raise ValueError(f"FLARE_GEMV_CONFIG item {item!r}: expected MxNxK[g]=BN/BK/warps/stages")
        if key == f"{M}x{N}x{K}{'g' if gated else ''}":
            return cfg
    return None


def gemv_config(M: int, N: int, K: int, gated: bool = False) -> dict:
    """The launch config of ``_fused_gemv_kernel``: a pure function of the shapes (``N`` is the weight's row
    count, ``2 * I`` when gated), so equal shapes always run the same fp32 summation order.  Measured shapes
    take their entry of :data:`GEMV_MEASURED`; others the heuristic below.

    ``BN``: the largest of 32/16/8/4 whose grid still has >= 2 programs per SM; ``BK``: up to 1024 (never more
    than K rounded up to a power of two), shrunk -- then ``BN`` -- until the accumulator fits the budget."""
    measured = gemv_config_override(M, N, K, gated) or GEMV_MEASURED.get((M, N, K, bool(gated)))
    if measured is not None:
        return dict(zip(("BN", "BK", "num_warps", "num_stages"), measured))
    n_out = N // 2 if gated else N
    mp = min(triton.next_power_of_2(max(M, 1)), GEMV_MAX_ROWS)
    tiles = 2 if gated else 1
    bn = 32
    while bn > 4 and triton.cdiv(n_out, bn) < 2 * GEMV_TARGET_SMS:
        bn //= 2
    bk = max(16, min(1024, triton.next_power_of_2(K)))
    while mp * bn * bk * tiles > GEMV_ACC_BUDGET and bk > 256:
        bk //= 2
    while mp * bn * bk * tiles > GEMV_ACC_BUDGET and bn > 4:
        bn //= 2
    while mp * bn * bk * tiles > GEMV_ACC_BUDGET and bk > 64:
        bk //= 2
    num_warps = 8 if bn * bk * tiles >= 4096 else 4
    return {"BN": bn, "BK": bk, "num_warps": num_warps, "num_stages": 2}


def _prenorm_args(x: torch.Tensor, m: int, n_out: int, gated: bool, gated_input: bool,
                  norm_weight: torch.Tensor | None, norm_stats: torch.Tensor | None,
                  publish_norm: torch.Tensor | None, dot: bool) -> dict:
    """The published-norm kernel arguments of a :func:`fused_linear_triton` launch taking ``norm_stats`` (checked
    here; the publishing ones the launch adds once it knows its programs); raises naming the bad argument."""
    if norm_stats is None and publish_norm is None:
        return {}
    if not dot:
        raise ValueError(f"fused_linear_triton: norm_stats / publish_norm are the tensor-core kernel's "
                         f"({DOT_ROWS.start}..{DOT_ROWS.stop - 1} rows); this launch ({m} rows) is the one-row "
                         f"kernel's")
    if publish_norm is not None and (gated or publish_norm.shape != (n_out,) or not publish_norm.is_contiguous()):
        raise ValueError(f"fused_linear_triton: publish_norm {tuple(publish_norm.shape)} must be the next norm's "
                         f"contiguous weights [{n_out}] of an ungated launch")
    if norm_stats is None:
        return {}
    if norm_weight is not None or gated_input:
        raise ValueError("fused_linear_triton: norm_stats (x already normed by weight) excludes norm_weight and "
                         "gated_input")
    if (norm_stats.dim() != 2 or norm_stats.shape[0] != m or norm_stats.dtype != torch.float32
            or not norm_stats.is_contiguous() or norm_stats.device != x.device):
        raise ValueError(f"fused_linear_triton: norm_stats {tuple(norm_stats.shape)} {norm_stats.dtype}: expected "
                         f"contiguous fp32 [{m}, parts] on {x.device}")
    parts = norm_stats.shape[1]
    return {"S_IN": norm_stats, "IN_PARTS": parts, "IN_PP": triton.next_power_of_2(parts)}


def fused_linear_triton(x: torch.Tensor, weight: torch.Tensor, *, norm_weight: torch.Tensor | None = None,
                        eps: float = 0.0, residual: torch.Tensor | None = None, gated: bool = False,
                        gated_input: bool = False, config: dict | None = None,
                        dot: bool | None = None, probe: torch.Tensor | None = None,
                        early: bool = False, norm_stats: torch.Tensor | None = None,
                        publish_norm: torch.Tensor | None = None):
    """``x [M, K]`` (rows contiguous), ``weight [N, K]`` (nn.Linear layout; packed ``[gate; up]`` of ``2 * I``
    rows when ``gated``) -> a new ``[M, N_out]`` (``N_out = N``, or ``I`` when gated) in x's dtype.
    ``norm_weight [K]``: RMSNorm prologue with ``eps``; ``residual [M, N_out]``: added after the projection;
    ``gated_input``: x is ``[M, 2 * K]``, the packed ``[gate; up]`` output of the previous projection, and the
    kernel's input is ``silu(gate) * up`` (not with ``norm_weight``).
    ``config``: override of :func:`gemv_config` (keys BN, BK, num_warps, num_stages; for benchmarking).
    ``dot``: the tensor-core variant (2..16 rows) or not; default the rule of :func:`fused_linear.uses_dot_kernel`
    (tests and ``scripts/bench_gemv.py --dot`` force it, to cover every prologue and epilogue).
    ``early``: the caller's promise that the next kernel reads nothing but weights before its PDL wait (anything but
    the fused decode attention): the one-row kernel then lets it launch before its own wait
    (:func:`gemv_early_enabled`).
    ``probe``: diagnostics (``scripts/probe_decode_attention.py``; the one-row kernel only) -- an int64 buffer of
    ``[programs, 2 * PROBE_STAMPS]`` the kernel fills with clock stamps: 0 entry, 1 preloaded tiles arrived, 2 after
    the PDL wait, 3 after the main loop, 4 after the store; the SM id in slot ``PROBE_STAMPS - 1``.
    The published norm (the tensor-core kernel; ``fused_linear.GEMM_ROWS_PRENORM``): ``publish_norm [N_out]``, the
    next RMSNorm's weights -- the launch then returns ``(out, xw, stats)``: ``xw = bf16(publish_norm * out)`` and
    ``stats [M, P]``, the fp32 sums of ``out ** 2`` over its P column blocks; ``norm_stats`` (with ``eps``) -- x is
    such an ``xw`` and these its statistics: the launch scales its fp32 sums by ``rsqrt(sum(stats) / K + eps)``
    before rounding, the norm without a launch of its own (not with ``norm_weight`` or ``gated_input``)."""
    k = weight.shape[1] if weight.dim() == 2 else -1
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != (2 * k if gated_input else k):
        raise ValueError(f"fused_linear_triton: x {tuple(x.shape)} and weight {tuple(weight.shape)}"
                         f"{' (gated input: x has 2 * K columns)' if gated_input else ''}")
    if gated_input and norm_weight is not None:
        raise ValueError("fused_linear_triton: gated_input and norm_weight do not combine")
    m = x.shape[0]
    n = weight.shape[0]
    if gated and n % 2:
        raise ValueError(f"fused_linear_triton: gated needs an even number of weight rows, got {n}")
    n_out = n // 2 if gated else n
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight.stride(-1) != 1:
        raise ValueError("fused_linear_triton: weight rows must be contiguous")
    if norm_weight is not None:
        if norm_weight.shape != (k,):
            raise ValueError(f"fused_linear_triton: norm_weight {tuple(norm_weight.shape)} for K={k}")
        norm_weight = norm_weight.contiguous()
    if residual is not None:
        if residual.shape != (m, n_out):
            raise ValueError(f"fused_linear_triton: residual {tuple(residual.shape)}, expected {(m, n_out)}")
        if residual.stride(-1) != 1:
            residual = residual.contiguous()
    out = torch.empty((m, n_out), dtype=x.dtype, device=x.device)
    if m == 0 or n_out == 0:
        if publish_norm is not None:
            return out, torch.empty_like(out), out.new_zeros((m, gemm_rows_parts(m, n, k)), dtype=torch.float32)
        return out
    if k == 0:
        raise ValueError("fused_linear_triton: K must be positive")
    if dot is None:
        dot = uses_dot_kernel(m, gated=gated, prologue=norm_weight is not None or gated_input,
                              norm=norm_weight is not None and not gated_input, elements=weight.numel())
    if dot and m not in DOT_ROWS:
        raise ValueError(f"fused_linear_triton: the tensor-core kernel takes {DOT_ROWS.start}..{DOT_ROWS.stop - 1} "
                         f"rows, got {m}")
    if dot and probe is not None:
        raise ValueError("fused_linear_triton: probe is for the one-row kernel (dot=False)")
    prenorm = _prenorm_args(x, m, n_out, gated, gated_input, norm_weight, norm_stats, publish_norm, dot)
    if dot:
        cfg = {**gemm_rows_config(m, n, k, gated), **(config or {})}
        bn, bk = int(cfg["BN"]), int(cfg["BK"])
        if bn < 16 or bk < 16:
            raise ValueError(f"fused_linear_triton: the tensor-core kernel needs BN, BK >= 16, got {bn}, {bk}")
        parts = triton.cdiv(n_out, bn)
        published = None
        if publish_norm is not None:
            published = (torch.empty_like(out), torch.empty((m, parts), dtype=torch.float32, device=x.device))
            prenorm.update(NW_OUT=publish_norm, XW=published[0], S_OUT=published[1], stride_xw=published[0].stride(0),
                           OUT_PARTS=parts)
        _fused_gemm_rows_kernel[(parts, triton.cdiv(m, GEMV_MAX_ROWS))](
            x, weight, norm_weight if norm_weight is not None else x, residual if residual is not None else out, out,
            m, n_out, x.stride(0), weight.stride(0), residual.stride(0) if residual is not None else 0,
            out.stride(0), float(eps), K=k, MP=GEMV_MAX_ROWS, BN=bn, BK=bk, HAS_NORM=norm_weight is not None,
            HAS_RES=residual is not None, GATED=bool(gated), EVEN_K=k % bk == 0, GATED_IN=bool(gated_input),
            PREFETCH=min(gemm_rows_prefetch_tiles(norm_stats is not None), triton.cdiv(k, bk)),
            PF_LINES=max(1, bk // 64),
            DOT_F32=_interpreting(), NORM_STAGES=GEMM_ROWS_NORM_STAGES if norm_weight is not None else 0,
            RES_FIRST=residual is not None and switch("FLARE_GEMM_ROWS_RES_FIRST", GEMM_ROWS_RES_FIRST),
            num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), **_pdl(x.device), **prenorm)
        return (out, *published) if published is not None else out
    if (probe is None and config is None and gemv_smem_enabled() and not _interpreting()
            and x.dtype == weight.dtype == torch.bfloat16):
        from ignition.components import smem_gemv  # Gluon, compiled only: imported where it may run

        if smem_gemv.smem_gemv_applies(m, k, norm=norm_weight is not None, gated=gated, gated_input=gated_input,
                                       dot=dot, prenorm=bool(prenorm), device=x.device):
            return smem_gemv.smem_gemv(x, weight, residual, out, pdl=_pdl(x.device),
                                       early=early and gemv_early_enabled(x.device, m))
    cfg = {**gemv_config(m, n, k, gated), **(config or {})}
    bn, bk = int(cfg["BN"]), int(cfg["BK"])
    mp = min(triton.next_power_of_2(m), GEMV_MAX_ROWS)
    grid = (triton.cdiv(n_out, bn), triton.cdiv(m, mp))
    preload = gemv_preload_tiles(m, k, bk, norm_weight is None and not gated and not gated_input)
    flat, stream_stages = gemv_flat(mp, k, bk, preload)
    _fused_gemv_kernel[grid](
        x, weight, norm_weight if norm_weight is not None else x, residual if residual is not None else out, out,
        m, n_out, x.stride(0), weight.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
        float(eps), K=k, MP=mp, BN=bn, BK=bk, HAS_NORM=norm_weight is not None, HAS_RES=residual is not None,
        GATED=bool(gated), EVEN_K=k % bk == 0, GATED_IN=bool(gated_input),
        PREFETCH=gemv_prefetch_tiles(weight, bk), PF_LINES=max(1, bk // 64), PRELOAD=preload,
        X_FIRST=switch("FLARE_GEMV_X_FIRST", True), EARLY=early and gemv_early_enabled(x.device, m),
        FLAT=flat, STREAM_STAGES=stream_stages,
        PRELOAD_EVICT=preload > 0 and switch("FLARE_GEMV_PRELOAD_EVICT_FIRST", GEMV_PRELOAD_EVICT_FIRST),
        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), **_pdl(x.device),
        **_probe_args(None if probe is None else (probe,), 0, grid[0] * grid[1]))
    return out


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


# ------------------------------------------------------------------------------------------------------------
# Top-k values of each row (``flare::topk_values``, ``ignition/components/topk.py``): pass 1, grid (B, chunks), keeps
# the KP largest of each CHUNK-entry chunk of the row (``tl.topk``: bitonic top-k, padding -inf); pass 2, grid (B,),
# the KP largest of the row's chunks * KP candidates, of which the first k are stored.  Values only, selected and never
# computed: the result is ``torch.topk(x, k).values`` (descending).

@triton.jit
def _topk_chunk_kernel(X, WS, V, stride_x, CHUNK: tl.constexpr, KP: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(X + b * stride_x + offs, mask=offs < V, other=float("-inf"))
    top = tl.topk(x, KP)
    tl.store(WS + (b * tl.num_programs(1) + c) * KP + tl.arange(0, KP), top)


@triton.jit
def _topk_merge_kernel(WS, Out, N, K, stride_o, NP: tl.constexpr, KP: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, NP)
    x = tl.load(WS + b * N + offs, mask=offs < N, other=float("-inf"))
    top = tl.topk(x, KP)
    o = tl.arange(0, KP)
    tl.store(Out + b * stride_o + o, top, mask=o < K)


#: Entries per pass-1 program of :func:`topk_values_triton` (at most): a 151,936-entry vocabulary is 38 chunks, so
#: pass 2 ranks 38 * 64 candidates for k = 64 -- both passes about the same size.
TOPK_CHUNK = 4096


def topk_values_triton(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x [B, V]`` float32 -> ``[B, k]``: each row's ``k`` largest values, descending (``torch.topk(x, k).values``);
    two launches (see above).  Shapes are checked by the op (``topk.py``)."""
    b, v = x.shape
    out = torch.empty((b, k), dtype=x.dtype, device=x.device)
    if b == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    kp = max(2, triton.next_power_of_2(k))  # tl.topk keeps at least 2 (k = 1: the first of the top 2)
    chunk = max(kp, min(TOPK_CHUNK, triton.next_power_of_2(v)))
    n = triton.cdiv(v, chunk)
    ws = torch.empty((b, n, kp), dtype=x.dtype, device=x.device)
    _topk_chunk_kernel[(b, n)](x, ws, v, x.stride(0), CHUNK=chunk, KP=kp, num_warps=8)
    _topk_merge_kernel[(b,)](ws, out, n * kp, k, out.stride(0), NP=triton.next_power_of_2(n * kp), KP=kp,
                             num_warps=8)
    return out


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
def _cut_row_needs(TOPK, TOPP, SKIP, b, V):
    """``(k, p, need_k, need_p)`` of row ``b``: whether it cuts by top-k (``1 <= k < V``) and by top-p (``p < 1``);
    both False for a skipped row."""
    k = tl.load(TOPK + b)
    p = tl.load(TOPP + b)
    live = tl.load(SKIP + b).to(tl.int32) == 0
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


@triton.jit
def _cut_chunk_stats_kernel(Y, TOPK, TOPP, SKIP, MC, ZC, V, stride_y, C: tl.constexpr, CHUNK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    _, _, need_k, need_p = _cut_row_needs(TOPK, TOPP, SKIP, b, V)
    if need_k | need_p:
        offs = c * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(Y + b * stride_y + offs, mask=offs < V, other=float("-inf"))
        mc = tl.max(x, axis=0)
        tl.store(MC + b * C + c, mc)
        tl.store(ZC + b * C + c, tl.sum(tl.exp(x - tl.where(mc == float("-inf"), 0.0, mc)), axis=0))


@triton.jit
def _cut_chunk_hist_kernel(Y, TOPK, TOPP, SKIP, MC, ZC, H, V, stride_y, C: tl.constexpr, CP: tl.constexpr,
                           CHUNK: tl.constexpr, NBINS: tl.constexpr, INV_W: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    _, _, need_k, need_p = _cut_row_needs(TOPK, TOPP, SKIP, b, V)
    if need_k | need_p:
        m, _ = _cut_row_m_z(MC, ZC, b, C, CP)
        offs = c * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(Y + b * stride_y + offs, mask=offs < V, other=float("-inf"))
        hist = tl.histogram(_cut_bins(x, m, INV_W, NBINS), NBINS, mask=offs < V)
        tl.store(H + (b * C + c) * NBINS + tl.arange(0, NBINS), hist)


@triton.jit
def _cut_plan_kernel(TOPK, TOPP, SKIP, MC, ZC, H, PLAN, OFF, V, C: tl.constexpr, CP: tl.constexpr,
                     NBINS: tl.constexpr, INV_W: tl.constexpr, MARGIN: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    k, p, need_k, need_p = _cut_row_needs(TOPK, TOPP, SKIP, b, V)
    if need_k | need_p:
        m, z = _cut_row_m_z(MC, ZC, b, C, CP)
        offs_c = tl.arange(0, CP)
        j = tl.arange(0, NBINS)
        hist = tl.load(H + (b * C + offs_c[:, None]) * NBINS + j[None, :], mask=(offs_c < C)[:, None], other=0)
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
        tl.store(PLAN + b * 4, last)
        tl.store(PLAN + b * 4 + 1, tl.sum(per_chunk, axis=0))
        tl.store(PLAN + b * 4 + 2, first)
        tl.store(PLAN + b * 4 + 3, tl.sum(tl.where(j < first, total, 0), axis=0))
        tl.store(OFF + b * C + offs_c, tl.cumsum(per_chunk, axis=0) - per_chunk, mask=offs_c < C)


@triton.jit
def _cut_compact_kernel(Y, TOPK, TOPP, SKIP, MC, ZC, PLAN, OFF, BUF, MA, V, stride_y, C: tl.constexpr,
                        CP: tl.constexpr, CHUNK: tl.constexpr, NBINS: tl.constexpr, INV_W: tl.constexpr,
                        BUFN: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    _, _, need_k, need_p = _cut_row_needs(TOPK, TOPP, SKIP, b, V)
    if need_k | need_p:
        if tl.load(PLAN + b * 4 + 1) <= BUFN:
            m, _ = _cut_row_m_z(MC, ZC, b, C, CP)
            offs = c * CHUNK + tl.arange(0, CHUNK)
            x = tl.load(Y + b * stride_y + offs, mask=offs < V, other=float("-inf"))
            bins = _cut_bins(x, m, INV_W, NBINS)
            first = tl.load(PLAN + b * 4 + 2)
            keep = (offs < V) & (bins >= first) & (bins <= tl.load(PLAN + b * 4))
            at = tl.load(OFF + b * C + c) + tl.cumsum(keep.to(tl.int32), axis=0) - 1
            tl.store(BUF + b * BUFN + at, x, mask=keep)
            tl.store(MA + b * C + c, tl.sum(tl.where((offs < V) & (bins < first), tl.exp(x - m), 0.0), axis=0))


@triton.jit
def _cut_final_kernel(Y, TOPK, TOPP, SKIP, MC, ZC, PLAN, BUF, MA, CUT, WS, V, stride_y, C: tl.constexpr,
                      CP: tl.constexpr, CAP: tl.constexpr, BUFN: tl.constexpr, BLOCK: tl.constexpr,
                      PIPELINE: tl.constexpr, NB: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    k, p, need_k, need_p = _cut_row_needs(TOPK, TOPP, SKIP, b, V)
    cut = float("-inf")
    done = tl.full((), True, tl.int1)
    if need_k | need_p:
        n = tl.load(PLAN + b * 4 + 1)
        m, z_row = _cut_row_m_z(MC, ZC, b, C, CP)
        src = BUF + b * BUFN
        done = n <= BUFN
        # the mass above the window (0 for top-k rows: their window starts at the row max), summed in chunk order
        offs_c = tl.arange(0, CP)
        above = tl.where(done, tl.sum(tl.load(MA + b * C + offs_c, mask=(offs_c < C) & done, other=0.0), axis=0), 0.0)
        if n <= CAP:  # a small window: sorted in registers
            i = tl.arange(0, CAP)
            s = tl.sort(tl.load(src + i, mask=i < n, other=float("-inf")), descending=True)
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
                                *, chunk: int | None = None, cap: int = SAMPLING_CUT_CAP,
                                buffer: int = SAMPLING_CUT_BUFFER, block: int = SAMPLING_CUT_BLOCK,
                                plan: torch.Tensor | None = None) -> torch.Tensor:
    """``flare::sampling_cut_compact`` on the GPU (or the interpreter): the cut of :func:`sampling_cut_triton` over
    many programs per row (see above).
    ``chunk`` / ``cap`` / ``buffer`` (powers of two): values per chunk (default: at least 4096, at most
    :data:`SAMPLING_CUT_CHUNKS` chunks), the window values sorted at most and compacted at most; ``plan``: an
    optional ``[B, 4]`` int32 that receives each row's last bin, window count, first bin and count of values above
    the window (tests: which rows took the buffer, and what it held); ``block``: the searches' block (rows whose
    window exceeds ``cap``).  Shapes are checked by the op."""
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
    _cut_chunk_stats_kernel[(b, c)](*rows, mc, zc, v, y.stride(0), C=c, CHUNK=chunk, num_warps=8)
    _cut_chunk_hist_kernel[(b, c)](*rows, mc, zc, hist, v, y.stride(0), C=c, CP=cp, CHUNK=chunk, **bins,
                                   num_warps=8)
    _cut_plan_kernel[(b,)](*rows[1:], mc, zc, hist, plan, off, v, C=c, CP=cp, **bins, MARGIN=SAMPLING_CUT_MARGIN,
                           num_warps=16)
    _cut_compact_kernel[(b, c)](*rows, mc, zc, plan, off, buf, ma, v, y.stride(0), C=c, CP=cp, CHUNK=chunk,
                                BUFN=buffer, **bins, num_warps=8)
    _cut_final_kernel[(b,)](*rows, mc, zc, plan, buf, ma, cut, ws, v, y.stride(0), C=c, CP=cp, CAP=cap, BUFN=buffer,
                            **loop, num_warps=SAMPLING_CUT_WARPS)
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


# ------------------------------------------------------------------------------------------------------------
# The rotary embedding's cos and sin (``flare::rotary_cos_sin``, ``ignition/components/rotary.py``): one launch for
# what the canonical module runs as nine (the position cast, the product with inv_freq, the cat, cos, sin, two
# scalings, two casts -- about 17 us on the Qwen3 decode step's critical path on the H200, run 39).  The same
# operations in the same order, each rounded where the module rounds: ``f = fp32(position) * inv_freq`` (one fp32
# product; the module's K=1 matmul or elementwise product rounds it once), ``cos(f)`` / ``sin(f)`` (``tl.cos`` /
# ``tl.sin`` compile to libdevice's ``__nv_cosf`` / ``__nv_sinf`` for sm90 -- the CUDA math library's accurate
# functions, which PyTorch's own kernels call; offline PTX: no ``.approx``), ``* scaling`` in fp32, one rounding to
# the output dtype; both halves of the head dimension get the same values (the module's ``cat((freqs, freqs))``).


@triton.jit
def _rotary_cos_sin_kernel(POS, INV, COS, SIN, R, scaling, HALF: tl.constexpr, HP: tl.constexpr,
                           BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    h = tl.arange(0, HP)
    r_mask = rows < R
    h_mask = h < HALF
    pos = tl.load(POS + rows, mask=r_mask, other=0).to(tl.float32)
    inv = tl.load(INV + h, mask=h_mask, other=0.0)
    f = pos[:, None] * inv[None, :]  # [BLOCK_R, HP] fp32
    c = (tl.cos(f) * scaling).to(COS.dtype.element_ty)  # libdevice's cosf on NVIDIA: no .approx in the PTX
    s = (tl.sin(f) * scaling).to(SIN.dtype.element_ty)
    off = rows.to(tl.int64)[:, None] * (2 * HALF) + h[None, :]
    m = r_mask[:, None] & h_mask[None, :]
    tl.store(COS + off, c, mask=m)
    tl.store(COS + off + HALF, c, mask=m)
    tl.store(SIN + off, s, mask=m)
    tl.store(SIN + off + HALF, s, mask=m)


#: Positions per program of the rotary kernel (a decode step's rows fit one program; a prefill chunk's spread).
ROTARY_BLOCK_ROWS = 16


def rotary_cos_sin_triton(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``positions [...]`` (integer), ``inv_freq [D / 2]`` float32 -> ``(cos, sin)``, each ``[..., D]`` in ``dtype``,
    one launch (see above).  Shapes are checked by the op (``rotary.py``)."""
    half = inv_freq.shape[0]
    cos = torch.empty((*positions.shape, 2 * half), dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    r = positions.numel()
    if r == 0:
        return cos, sin
    _rotary_cos_sin_kernel[(triton.cdiv(r, ROTARY_BLOCK_ROWS),)](
        positions.reshape(-1).contiguous(), inv_freq.contiguous(), cos, sin, r, float(scaling), HALF=half,
        HP=triton.next_power_of_2(half), BLOCK_R=ROTARY_BLOCK_ROWS, num_warps=4)
    return cos, sin
