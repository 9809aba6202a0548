"""``flare::topk_values``: the ``k`` largest values of each row of ``x [B, V]`` (fp32), descending -- what
``torch.topk(x, k).values`` returns, which the bounded sampler (``SamplingTensors.max_top_k``) cuts by.

- CPU (and CUDA with ``FLARE_TRITON_TOPK=0``, or ``k > TRITON_MAX_K``): ``torch.topk``.
- CUDA, ``k <= TRITON_MAX_K`` (the default since ``results/20261201T102332Z-sm90-run23``: Qwen3-0.6B's bounded
  ``decode_topk`` graph, top 64, batch 1 0.9922 ms against 1.0328 with ``torch.topk``, batch 4 1.4407 against 1.4782):
  ``topk_values_triton``, two launches: each program keeps the top ``k`` of one vocabulary chunk (Triton's bitonic
  top-k), then one program per row keeps the top ``k`` of those candidates.  The values are selected, never
  computed, so the result equals ``torch.topk``'s value for value: the ``k`` largest with their multiplicities, in
  descending order.  (Equal values are indistinguishable, except ``-0.0`` against ``0.0``, which compare equal and
  may come in either order -- and either rounds the sampler's thresholds and ``exp`` identically.  Rows must hold
  no NaN; the sampler's logits never do.)  ``torch.topk`` on one 151,936-entry row is a radix select of about ten
  launches with a sort of the result.
"""

from __future__ import annotations

import torch

from ignition.components.custom_ops import opaque_op
from ignition.components.switches import switch

__all__ = ["topk_values", "topk_values_reference", "TRITON_MAX_K"]

#: The largest ``k`` the Triton path takes (its programs hold ``k`` rounded up to a power of two per chunk); larger
#: ``k`` -- no sampler bound is near it -- stays with ``torch.topk``, by this rule.
TRITON_MAX_K = 1024


def _check(x: torch.Tensor, k: int) -> None:
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"topk_values: x must be a [B, V] float32 tensor, got {tuple(x.shape)} {x.dtype}")
    if not 1 <= k <= x.shape[1]:
        raise ValueError(f"topk_values: k={k} outside 1..{x.shape[1]} (the row length)")


def topk_values_reference(x: torch.Tensor, k: int) -> torch.Tensor:
    """``torch.topk(x, k).values`` (the op's CPU path)."""
    _check(x, k)
    return torch.topk(x, k, dim=-1).values.contiguous()


def _fake(x: torch.Tensor, k: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], k))


@opaque_op("topk_values", mutates_args=(), fake=_fake)
def topk_values(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x [B, V]`` float32 -> a new ``[B, k]``: each row's ``k`` largest values, descending (module docstring)."""
    if x.is_cuda and k <= TRITON_MAX_K and switch("FLARE_TRITON_TOPK", True):
        from ignition.components.kernels.topk import topk_values_triton  # imports triton: CUDA only

        _check(x, k)
        return topk_values_triton(x, k)
    return topk_values_reference(x, k)
