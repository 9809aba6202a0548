"""RMSNorm of each row (``flare::rms_norm``, ``ignition/components/norms.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignition.components.kernels.launch import _pdl, _pdl_enter


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
