"""A layer's whole decode-step attention as one opaque op: ``flare::rope_decode_attention_``.

At a decode step (one query token per row) a Qwen3-style layer runs, between its QKV and output projections:
``flare::rope_write_`` (q_norm / k_norm, the rotary embedding, the paged K/V write) and decode attention (split
pass and combine pass) -- three launches, each a few microseconds of mostly launch latency and ramp at batch 1
(Qwen3-8B on the H200: 100 + 253 + 76 us of a 4.7 ms step over 36 layers,
``results/20261201T000848Z-sm90-run7``).  This op is their composition in two launches:

    q_rot = rope_write_(q, k, v, q_norm, k_norm, eps, cos, sin, k_pool, v_pool, slots)
    out   = paged_decode_attention(q_rot, k_pool, v_pool, block_tables, seq_lens, scaling)

- CPU: exactly that composition of the two references (:func:`rope_write_reference`,
  :func:`paged_decode_attention_reference`), so it is what the two ops compute, bit for bit.
- CUDA: ``rope_decode_attention_triton`` -- one program per (row, KV head, split) forms its query rows with the
  rope_write kernel's row helper, the program owning the row's last key block writes the new K/V before it reads
  (``kernels/fused_decode.py`` states why no other program reads that slot), then the decode reduce kernel combines the
  splits.  The same numerics as the two ops (the norm statistics may sum in another order on the GPU: ulp-level
  differences, bounded in ``test_components_gpu.py``); deterministic.  Its split count is its own
  (``fused_decode_num_splits``, measured).

It assumes what a decode step is: each row's new token is the last key it attends (position ``seq_lens - 1``), and
no row reads another row's new slot.  The recipe calls it through the attention backend's ``rope_attend`` (T == 1
only); prefill and verify steps keep ``rope_write_`` + attention.
"""

from __future__ import annotations

from typing import Optional

import torch

from ignition.components.attention import _attention_output_fake, paged_decode_attention_reference
from ignition.components.custom_ops import opaque_op
from ignition.components.rope_write import check_rope_write_args, rope_write_reference
from ignition.components.switches import mebibytes

__all__ = ["rope_decode_attention_", "rope_decode_attention_reference", "DECODE_REDUCE_PREFETCH_MB",
           "decode_reduce_prefetch_bytes"]

#: MiB of the output projection's weight -- its last rows, which its late programs stream after the attention -- that
#: the decode reduce kernel's programs prefetch into L2 by the TMA unit after their early trigger and before their
#: wait, while the attention runs (``FLARE_DECODE_REDUCE_PREFETCH_MB=N``; read once, when a step is traced -- the op
#: takes the byte count as an argument, which the traced graph records -- and where the probe launches).  0: off --
#: 32 MiB was slower at Qwen3-8B side by side in one process with the null (``results/20261205T014952Z-sm90-run165``):
#: batch 1 1.0065x, batch 4 1.0222x (paired blocks 0/10 faster against A at both).  Run 162's stamps (Qwen3-8B, one
#: row): o_proj's late programs
#: take 4.6 us to get their 64 KiB each from HBM after the reduce, while HBM idles through most of the ~11 us
#: attention window; earlier weight prefetches were issued by the attention's own programs, which then stalled
#: (runs 50-52, ``kernels.linear.GEMV_PREFETCH_FULL_BYTES``) -- the reduce's programs only wait there.
DECODE_REDUCE_PREFETCH_MB = 0


def decode_reduce_prefetch_bytes() -> int:
    """:data:`DECODE_REDUCE_PREFETCH_MB` in bytes (``FLARE_DECODE_REDUCE_PREFETCH_MB``)."""
    return mebibytes("FLARE_DECODE_REDUCE_PREFETCH_MB", DECODE_REDUCE_PREFETCH_MB << 20)


def _checked(q, k, v, cos, sin, k_pool, v_pool, slots, block_tables, seq_lens):
    check_rope_write_args(q, k, v, cos, sin, k_pool, v_pool, slots)
    b = q.shape[0]
    if q.shape[1] != 1:
        raise ValueError(f"rope_decode_attention_: one query token per row, got q {tuple(q.shape)}")
    if block_tables.dim() != 2 or block_tables.shape[0] != b or seq_lens.shape != (b,):
        raise ValueError(f"rope_decode_attention_: block_tables {tuple(block_tables.shape)}, seq_lens "
                         f"{tuple(seq_lens.shape)} for {b} rows")


def rope_decode_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    q_norm: Optional[torch.Tensor], k_norm: Optional[torch.Tensor], eps: float,
                                    cos: torch.Tensor, sin: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                                    slots: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                                    scaling: float) -> torch.Tensor:
    """The composition (the op's CPU path); see the module docstring."""
    _checked(q, k, v, cos, sin, k_pool, v_pool, slots, block_tables, seq_lens)
    q_rot = rope_write_reference(q, k, v, q_norm, k_norm, eps, cos, sin, k_pool, v_pool, slots)
    return paged_decode_attention_reference(q_rot, k_pool, v_pool, block_tables, seq_lens, scaling).contiguous()


@opaque_op("rope_decode_attention_", mutates_args=("k_pool", "v_pool"), fake=_attention_output_fake)
def rope_decode_attention_(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: Optional[torch.Tensor],
                           k_norm: Optional[torch.Tensor], eps: float, cos: torch.Tensor, sin: torch.Tensor,
                           k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scaling: float,
                           overlap_bytes: Optional[int] = None, prefetch_weight: Optional[torch.Tensor] = None,
                           prefetch_bytes: int = 0) -> torch.Tensor:
    """``q [B, 1, H, D]``, ``k, v [B, 1, KV, D]`` (views of the packed QKV output are fine), per-head norm weights
    ``[D]`` or None, ``cos, sin [B, 1, D]``, one layer's pools ``[pages + 1, page, KV, D]``, sanitized ``slots [B]``,
    ``block_tables [B, P]``, ``seq_lens [B]`` -> a new contiguous ``[B, 1, H * D]``; writes the rotated key and the
    value of each row into the pools (see the module docstring).  ``overlap_bytes``: the bytes the kernel before it
    streams (the QKV projection's weight; None: unknown) -- a scheduling hint for the CUDA kernel's K/V prefetch
    (``kernels.decode_plan.decode_kv_prefetch_keys``), no effect on the values.  ``prefetch_weight``: the output
    projection's weight, read by nothing but the CUDA reduce kernel's L2 prefetch of its last ``prefetch_bytes``
    (:func:`decode_reduce_prefetch_bytes` where the caller traced the step; 0: none) -- no effect on the values."""
    if q.is_cuda:
        from ignition.components.kernels.fused_decode import rope_decode_attention_triton  # imports triton: CUDA only

        _checked(q, k, v, cos, sin, k_pool, v_pool, slots, block_tables, seq_lens)
        prefetch = None if prefetch_weight is None else (prefetch_weight, prefetch_bytes)
        return rope_decode_attention_triton(q, k, v, q_norm, k_norm, eps, cos, sin, k_pool, v_pool, slots,
                                            block_tables, seq_lens, scaling, overlap_bytes=overlap_bytes,
                                            prefetch=prefetch)
    return rope_decode_attention_reference(q, k, v, q_norm, k_norm, eps, cos, sin, k_pool, v_pool, slots,
                                           block_tables, seq_lens, scaling)
