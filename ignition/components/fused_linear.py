"""A decode-time projection as one opaque op: ``flare::fused_linear`` = [RMSNorm ->] x @ W^T [-> SiLU gate]
[-> + residual].

What it fuses (each part optional, in this order):

- an RMSNorm prologue (``norm_weight [K]``, ``eps``): the canonical ``Qwen3RMSNorm`` of x;
- the projection by ``weight [N, K]`` (nn.Linear layout);
- a SiLU-gated epilogue (``gated``): ``weight`` is the packed ``[gate; up]`` of ``2 * I`` rows and the result
  is ``silu(gate) * up``, ``[..., I]`` (the canonical ``Qwen3MLP`` up to ``down_proj``);
- a residual epilogue (``residual [..., N_out]``): ``residual + y`` (the decoder layer's skip connection).

Rounding points (bf16 tensors, every product and sum in fp32, each arrow a rounding to bf16) -- exactly the
canonical modules' own, so the op differs from them only by the order of the fp32 sums:

    xn  = bf16(norm_weight * bf16(x * rsqrt(mean(x ** 2) + eps)))     (prologue; else xn = x)
    y   = bf16(sum_k xn[k] * w[n, k])                                  (gate and up each rounded when gated)
    y   = bf16(bf16(silu(g)) * u)                                      (gated)
    out = bf16(residual + y)                                           (residual)

- CPU: :func:`fused_linear_reference`, the canonical torch ops in that order (``rms_norm_reference``,
  ``F.linear`` -- gate and up as two projections, as ``Qwen3MLP`` runs them --, ``F.silu``, ``+``), so CPU
  numerics are the canonical module's bit for bit.
- CUDA: one Triton GEMV launch (``fused_linear_triton`` in ``triton_kernels.py``): programs over blocks of
  output columns, each streaming its weight rows once for all rows of x, with an fp32 accumulator summed once
  at the end.  Deterministic: its launch config is a pure function of the shapes (``gemv_config``; no runtime
  autotuning, no atomics, no split-K), so the fp32 summation order -- and the bits -- are the same for the
  same shapes in every process and every replay, eager or compiled (Inductor cannot see into the op).

When used: decode steps, a few rows (<= 16) per projection on CUDA, where cuBLAS launches (plus separate norm,
activation and add kernels) are latency-bound; callers decide (prefill-sized inputs belong to cuBLAS).  Any
row count is accepted (rows beyond 16 go to further row blocks of the grid, re-reading the weight).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ignition.components.custom_ops import opaque_op
from ignition.components.norms import rms_norm_reference

__all__ = ["fused_linear", "fused_linear_reference"]


def _out_features(weight: torch.Tensor, gated: bool) -> int:
    n = weight.shape[0]
    if gated and n % 2:
        raise ValueError(f"fused_linear: gated needs an even number of weight rows, got {n}")
    return n // 2 if gated else n


def fused_linear_reference(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor] = None,
                           eps: float = 0.0, residual: Optional[torch.Tensor] = None,
                           gated: bool = False) -> torch.Tensor:
    """The canonical composition (the op's CPU path): ``[..., K]`` -> a new contiguous ``[..., N_out]``."""
    h = rms_norm_reference(x, norm_weight, eps) if norm_weight is not None else x
    if gated:
        i = _out_features(weight, gated)
        y = F.silu(F.linear(h, weight[:i])) * F.linear(h, weight[i:])
    else:
        y = F.linear(h, weight)
    if residual is not None:
        y = residual + y
    return y.contiguous()


def _fake(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor], eps: float,
          residual: Optional[torch.Tensor], gated: bool) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], _out_features(weight, gated)))


@opaque_op("fused_linear", mutates_args=(), fake=_fake)
def fused_linear(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor], eps: float,
                 residual: Optional[torch.Tensor], gated: bool) -> torch.Tensor:
    """``x [..., K]``, ``weight [N, K]`` -> a new contiguous ``[..., N_out]`` (see the module docstring)."""
    if x.is_cuda:
        from ignition.components.triton_kernels import fused_linear_triton

        k = x.shape[-1]
        n_out = _out_features(weight, gated)
        lead = x.shape[:-1]
        res2 = residual.reshape(-1, n_out) if residual is not None else None
        out = fused_linear_triton(x.reshape(-1, k), weight, norm_weight=norm_weight, eps=eps, residual=res2,
                                  gated=gated)
        return out.view(*lead, n_out)
    return fused_linear_reference(x, weight, norm_weight, eps, residual, gated)
