"""A one-row GEMV whose weight rows wait in shared memory: ``out = bf16(residual + bf16(x @ W^T))`` for one row of x,
each program copying its ``BN`` whole weight rows (``BN * K`` bf16) into shared memory by ``cp.async`` *before* its
PDL wait, then reading them back against x after it -- a side-by-side experiment (``FLARE_GEMV_SMEM=1``, off by
default: ``kernels.linear.GEMV_SMEM``; Gluon, compiled only, sm90+).

Why: at batch 1 the output projection's early programs preload their whole weight rows into registers while the
decode attention runs (``kernels.linear.gemv_preload_tiles``), but registers beside the attention's programs hold
only part of the weight (run 162's probe: 196 of 512 programs, ~12 of 32 MiB); shared memory -- 228 KiB per SM, of
which the attention takes ~43 KiB per program -- is idle then.  With ``BN = 4`` a program holds 32 KiB in shared
memory and 48 registers (offline sm90), so 6 fit on an SM without attention programs (1 KiB reserved per program)
and 4 beside two of them.  The copies carry no L2 priority: Triton 3.6's Gluon lowering drops ``evict_first`` from
``cp.async`` (offline PTX), as its TMA lowering does (run 160).

Rounding points and determinism as ``flare::fused_linear``'s (``fused_linear.py``): fp32 products and sums, y rounded
to bf16, then ``residual + y`` rounded once.  The fp32 sum order is fixed by the layout: each thread holds 8
contiguous columns of every 1024-column stretch (32 lanes x 4 warps x 8) for all its rows, sums its products per row,
then the lanes' sums, then the warps' -- another order than the Triton GEMV's, the same in every launch.  No norm
prologue, gated input or epilogue: the output projection's case only (:func:`smem_gemv_applies`).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from ignition.components.switches import whole

__all__ = ["SMEM_GEMV_ROWS", "smem_gemv", "smem_gemv_applies"]

#: Weight rows per program (``FLARE_GEMV_SMEM_ROWS=N``): 4 -> 32 KiB of shared memory at K = 4096.
SMEM_GEMV_ROWS = 4
#: Warps per program.
WARPS = 4
#: The layout's width: 4 warps x 32 lanes x 8 bf16 (one 16-byte copy per lane and row); K a power of two from it.
CHUNK = WARPS * 32 * 8
#: The most shared memory one program may take (sm90 allows 227 KiB per block).
MAX_BYTES = 227 << 10


def smem_gemv_applies(m: int, k: int, *, norm: bool, gated: bool, gated_input: bool, dot: bool,
                      prenorm: bool, device: torch.device) -> bool:
    """Whether a fused_linear launch with ``FLARE_GEMV_SMEM`` on (``kernels.linear.gemv_smem_enabled``) takes this
    kernel: one row, a plain projection (an optional residual only), K a power of two of at least :data:`CHUNK`, the
    rows fitting :data:`MAX_BYTES`, sm90 or newer."""
    if m != 1 or norm or gated or gated_input or dot or prenorm or device.type != "cuda":
        return False
    if k < CHUNK or k & (k - 1):
        return False
    if smem_gemv_rows() * k * 2 > MAX_BYTES:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def smem_gemv_rows() -> int:
    """:data:`SMEM_GEMV_ROWS` (``FLARE_GEMV_SMEM_ROWS``), a power of two of 1..16."""
    rows = whole("FLARE_GEMV_SMEM_ROWS", SMEM_GEMV_ROWS, low=1)
    if rows > 16 or rows & (rows - 1):
        raise ValueError(f"FLARE_GEMV_SMEM_ROWS={rows}: expected a power of two of 1..16 rows per program")
    return rows


@gluon.jit
def _pdl_wait_and_trigger(USE_PDL: gl.constexpr, EARLY: gl.constexpr):
    """``kernels.launch._pdl_enter`` in Gluon: wait for the previous kernel; let the next launch after the wait, or
    before it with ``EARLY``."""
    if USE_PDL:
        if EARLY:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
        if not EARLY:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)


@gluon.jit
def _smem_gemv_kernel(X, W, R, Y, N_OUT, stride_w, K: gl.constexpr, BN: gl.constexpr, HAS_RES: gl.constexpr,
                      USE_PDL: gl.constexpr, EARLY: gl.constexpr, WARPS: gl.constexpr):
    # [BN, K]: each lane holds 8 contiguous columns of all BN rows (16-byte copies), 32 lanes and then the warps
    # along the row, wrapping over K -- so each x value is loaded once per program and used for every row
    layout: gl.constexpr = gl.BlockedLayout([BN, 8], [1, 32], [1, WARPS], [1, 0])
    rows_l: gl.constexpr = gl.SliceLayout(1, layout)
    cols_l: gl.constexpr = gl.SliceLayout(0, layout)
    pid = gl.program_id(0)
    rows = pid * BN + gl.arange(0, BN, layout=rows_l)
    keep = rows < N_OUT
    cols = gl.arange(0, K, layout=cols_l)
    # the rows stay in shared memory as this program's threads hold them: each reads back what it copied
    smem = gl.allocate_shared_memory(gl.bfloat16, [BN, K], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    # before the wait: weights only (nothing in a step writes them)
    async_copy.async_copy_global_to_shared(smem, W + rows.to(gl.int64)[:, None] * stride_w + cols[None, :],
                                           mask=keep[:, None], eviction_policy="evict_first")
    async_copy.commit_group()
    _pdl_wait_and_trigger(USE_PDL, EARLY)
    xv = gl.load(X + cols).to(gl.float32)
    async_copy.wait_group(0)
    prod = smem.load(layout).to(gl.float32) * xv[None, :]
    y = gl.sum(prod, axis=1).to(gl.bfloat16)
    if HAS_RES:
        y = (gl.load(R + rows, mask=keep, other=0.0).to(gl.float32) + y.to(gl.float32)).to(gl.bfloat16)
    gl.store(Y + rows, y, mask=keep)


def smem_gemv(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, out: torch.Tensor, *,
              pdl: dict, early: bool) -> torch.Tensor:
    """``out [1, N] = bf16(residual + bf16(x @ weight^T))`` (``residual`` None: no add) for ``x [1, K]`` bf16,
    ``weight [N, K]`` with contiguous rows; ``pdl``: ``kernels.launch._pdl``'s options (``USE_PDL``,
    ``launch_pdl``); ``early``: the next kernel may launch before this one's wait (see ``fused_linear_triton``).
    The caller checked the shapes (:func:`smem_gemv_applies`)."""
    n, k = weight.shape
    bn = smem_gemv_rows()
    use_pdl = bool(pdl.get("USE_PDL", False))
    _smem_gemv_kernel[(triton.cdiv(n, bn),)](
        x, weight, residual if residual is not None else out, out, n, weight.stride(0), K=k, BN=bn,
        HAS_RES=residual is not None, USE_PDL=use_pdl, EARLY=use_pdl and early, WARPS=WARPS, num_warps=WARPS,
        **({"launch_pdl": True} if pdl.get("launch_pdl") else {}))
    return out
