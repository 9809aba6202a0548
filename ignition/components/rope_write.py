"""Per-head norms, rotary embedding and the paged K/V write of one step as one opaque op: ``flare::rope_write_``.

Between the QKV projection and attention a Qwen3-style layer runs, per token: an RMSNorm over each query head and
each key head (``q_norm`` / ``k_norm``, optional), the rotary embedding of queries and keys, and the scatter of the
new keys and values into the paged pools.  Run as separate modules that is five launches per layer (two norms, the
rotary elementwise kernel, two ``index_put_``), each moving a few kilobytes at a decode step: pure launch latency
(0.5 ms of a 5.7 ms Qwen3-8B decode step on the H200, ``results/20261130T211410Z-sm90-run3``).  This op is one launch.

Rounding points -- the canonical modules' own (bf16 tensors, each product and sum in fp32, each arrow a rounding):

    h    = bf16(norm_weight * bf16(x * rsqrt(mean(x ** 2) + eps)))           (per head; else h = x)
    out  = bf16(bf16(h * cos) + bf16(rotate_half(h) * sin))                   (``apply_rotary_pos_emb``)

then ``k_out`` and ``v`` are written to the pools at ``slots`` (the sink slot for padding: duplicates there are
harmless) and ``q_out`` is returned.

- CPU: :func:`rope_write_reference`, the canonical torch ops in that order (``rms_norm_reference``, the rotary
  expression of transformers' ``apply_rotary_pos_emb``, ``kv_write_``), so CPU numerics are the canonical
  modules' bit for bit (tests compare against transformers' ``apply_rotary_pos_emb`` itself).
- CUDA: one Triton program per token (``rope_write_triton``): the norms' fp32 sums in Triton's order (as
  ``flare::rms_norm``'s kernel), every other step exactly the rounding above -- the rotation's sums are ``add.rn`` of
  their own (``kernels.rope_write._sum_rounded``): a plain add let LLVM fuse one product into the sum as a bf16 fma,
  one rounding instead of two (``scripts/sm90_kernel_check.py`` fails on a bf16 fma; without the norms the GPU tests
  compare with transformers bit for bit).  Deterministic (no atomics).

At a decode step the attention backend may run this together with decode attention as one launch
(``flare::rope_decode_attention_``, ``decode_attention.py``).
"""

from __future__ import annotations

from typing import Optional

import torch

from ignition.components.attention import kv_write_
from ignition.components.custom_ops import opaque_op
from ignition.components.norms import rms_norm_reference

__all__ = ["rope_write_", "rope_write_reference", "rotary_reference", "check_rope_write_args"]


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The canonical rotary embedding of ``x [B, T, heads, D]`` with ``cos, sin [B, T, D]`` (broadcast over
    heads): ``x * cos + rotate_half(x) * sin``, rotate_half = ``cat(-x2, x1)``."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


def check_rope_write_args(q, k, v, cos, sin, k_pool, v_pool, slots) -> None:
    """Raises naming the argument whose shape does not fit ``q [B, T, H, D]`` (shared with the fused decode op)."""
    b, t, h, d = q.shape
    if k.dim() != 4 or k.shape[:2] != (b, t) or k.shape[-1] != d or v.shape != k.shape:
        raise ValueError(f"rope_write_: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if cos.shape != (b, t, d) or sin.shape != cos.shape:
        raise ValueError(f"rope_write_: cos {tuple(cos.shape)} / sin {tuple(sin.shape)}, expected {(b, t, d)}")
    if d % 2:
        raise ValueError(f"rope_write_: head_dim {d} must be even (rotate_half)")
    if k_pool.shape[-2:] != k.shape[-2:] or v_pool.shape != k_pool.shape:
        raise ValueError(f"rope_write_: pools {tuple(k_pool.shape)}, {tuple(v_pool.shape)} for k {tuple(k.shape)}")
    if slots.shape != (b * t,):
        raise ValueError(f"rope_write_: slots {tuple(slots.shape)}, expected {(b * t,)}")


def rope_write_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: Optional[torch.Tensor],
                         k_norm: Optional[torch.Tensor], eps: float, cos: torch.Tensor, sin: torch.Tensor,
                         k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The canonical composition (the op's CPU path); see the module docstring."""
    check_rope_write_args(q, k, v, cos, sin, k_pool, v_pool, slots)
    b, t, _, d = q.shape
    if q_norm is not None:
        q = rms_norm_reference(q, q_norm, eps)
    if k_norm is not None:
        k = rms_norm_reference(k, k_norm, eps)
    q, k = rotary_reference(q, cos, sin), rotary_reference(k, cos, sin)
    kvh = k.shape[2]
    kv_write_(k_pool, v_pool, k.reshape(b * t, kvh, d), v.reshape(b * t, kvh, d), slots)
    return q.contiguous()


def _fake(q, *_):
    return q.new_empty(q.shape)


@opaque_op("rope_write_", mutates_args=("k_pool", "v_pool"), fake=_fake)
def rope_write_(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: Optional[torch.Tensor],
                k_norm: Optional[torch.Tensor], eps: float, cos: torch.Tensor, sin: torch.Tensor,
                k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``q [B, T, H, D]``, ``k, v [B, T, KV, D]`` (views of the packed QKV output are fine), per-head norm weights
    ``[D]`` or None, ``cos, sin [B, T, D]``, one layer's pools ``[pages + 1, page, KV, D]``, sanitized
    ``slots [B * T]`` -> the rotated queries, a new contiguous ``[B, T, H, D]``; writes the rotated keys and the
    values into the pools (see the module docstring)."""
    if q.is_cuda:
        from ignition.components.kernels.rope_write import rope_write_triton  # imports triton: CUDA only

        check_rope_write_args(q, k, v, cos, sin, k_pool, v_pool, slots)
        return rope_write_triton(q, k, v, q_norm, k_norm, eps, cos, sin, k_pool, v_pool, slots)
    return rope_write_reference(q, k, v, q_norm, k_norm, eps, cos, sin, k_pool, v_pool, slots)
