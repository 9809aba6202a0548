"""RMSNorm as one opaque op, so that compiled and uncompiled steps run the very same reduction.

Inductor re-derives every reduction it traces (its own order of the fp32 sum), so a compiled RMSNorm is
not bytewise equal to the eager one on a GPU, and neither is anything downstream of it -- the catalog's
``--check-compiled`` sees that.  ``flare::rms_norm`` is a custom op Inductor cannot see into: the eager
prepared forward and every compiled region call the same kernel.

Semantics are the canonical ``Qwen3RMSNorm`` (fp32 statistics, the normalized value rounded to the input
dtype, then multiplied by the weight in that dtype):

    y = weight * (x.float() * rsqrt(mean(x.float() ** 2, -1) + eps)).to(x.dtype)

- CPU: exactly that PyTorch expression (the canonical module's own ops, so CPU numerics are unchanged).
- CUDA: one Triton kernel per row block (fp32 sum in Triton's tree order, then the same rounding
  points); it differs from the canonical module only by the order of the fp32 sum, and the recipe's
  tests bound that against the canonical forward.

``RMSNorm.from_canonical(module)`` replaces one canonical instance (same ``weight`` parameter, same name
in the state dict) -- an instance-local replacement, no class patch.
"""

from __future__ import annotations

import torch
from torch import nn

from ignition.components.custom_ops import opaque_op

__all__ = ["RMSNorm", "rms_norm", "rms_norm_reference"]


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape)


@opaque_op("rms_norm", mutates_args=(), fake=_fake)
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``[..., N]`` -> a new contiguous ``[..., N]`` (see the module docstring)."""
    if x.is_cuda:
        from ignition.components.kernels.rms_norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps)
    return rms_norm_reference(x, weight, eps).contiguous()


class RMSNorm(nn.Module):
    def __init__(self, weight: nn.Parameter, eps: float):
        super().__init__()
        self.weight = weight
        self.variance_epsilon = eps

    @classmethod
    def from_canonical(cls, module: nn.Module) -> "RMSNorm":
        return cls(module.weight, module.variance_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon} (flare::rms_norm)"
