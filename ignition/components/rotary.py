"""``flare::rotary_cos_sin``: a step's rotary ``(cos, sin)`` in one launch instead of the canonical module's nine.

The canonical rotary module (``Qwen3RotaryEmbedding`` and its kind: an ``inv_freq`` buffer and an
``attention_scaling``) computes, for integer positions ``p``::

    f   = fp32(p) * inv_freq                      (one fp32 product per element)
    cos = dtype(cos(cat(f, f)) * attention_scaling),  sin likewise

- CUDA: ``rotary_cos_sin_triton`` (``kernels/rotary.py``), one Triton launch doing exactly those operations and
  roundings, ``cos``/``sin`` by libdevice -- the CUDA math library PyTorch's own kernels use -- so the values are
  the module's bit for bit (``test_components_gpu.py`` compares them with the module on the GPU).  On the H200 the
  module's nine kernels took about 17 us of a Qwen3-0.6B decode step's critical path, the op 2.9
  (``results/20261201T143416Z-sm90-run39`` against ``results/20261201T145055Z-sm90-run41``); side by side in one
  process the step's median 1.3% lower at batch 1, within noise by the min-max rule
  (``results/20261201T144726Z-sm90-run40``).
- CPU: :func:`rotary_cos_sin_reference`, the same expression in torch ops.

:func:`position_embeddings` is the one entry point for a prepared model: the op on CUDA when the module's
frequencies are fixed (every rope type but the dynamic ones, whose ``inv_freq`` the module rewrites as positions
grow) unless ``FLARE_FUSED_ROTARY=0`` (side-by-side runs; read when a step is traced), else the module itself.
"""

from __future__ import annotations

import torch
from torch import nn

from ignition.components.custom_ops import opaque_op
from ignition.components.switches import switch

__all__ = ["rotary_cos_sin", "rotary_cos_sin_reference", "position_embeddings", "fused_rotary_applies",
           "embed_rotary", "embed_rotary_reference", "embed_position_embeddings", "FUSED_EMBED_ROTARY",
           "embed_rotary_batch", "embed_rotary_batch_reference", "embed_rotary_applies", "embed_rotary_batch_applies",
           "FUSED_STEP_BATCH"]


def _check(positions: torch.Tensor, inv_freq: torch.Tensor) -> None:
    if positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise ValueError(f"rotary_cos_sin: positions must be integers, got {positions.dtype}")
    if inv_freq.dim() != 1 or inv_freq.dtype != torch.float32 or inv_freq.numel() == 0:
        raise ValueError(f"rotary_cos_sin: inv_freq must be a non-empty 1-D float32 tensor, got "
                         f"{tuple(inv_freq.shape)} {inv_freq.dtype}")
    if inv_freq.device != positions.device:
        raise ValueError(f"rotary_cos_sin: inv_freq on {inv_freq.device}, positions on {positions.device}")


def rotary_cos_sin_reference(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                             like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's expression in torch ops (the op's CPU path): ``(cos, sin)`` ``[..., 2 * len(inv_freq)]`` in
    ``like``'s dtype."""
    _check(positions, inv_freq)
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(like.dtype), (emb.sin() * scaling).to(like.dtype)


def _fake(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
          like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (*positions.shape, 2 * inv_freq.shape[0])
    return positions.new_empty(shape, dtype=like.dtype), positions.new_empty(shape, dtype=like.dtype)


@opaque_op("rotary_cos_sin", mutates_args=(), fake=_fake)
def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                   like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``positions [...]`` (integer), ``inv_freq [D / 2]`` float32, the module's ``attention_scaling`` -> new
    ``(cos, sin)`` ``[..., D]`` in ``like``'s dtype (``like`` is read for its dtype only)."""
    if positions.is_cuda:
        from ignition.components.kernels.rotary import rotary_cos_sin_triton  # imports triton: CUDA only

        _check(positions, inv_freq)
        return rotary_cos_sin_triton(positions, inv_freq, scaling, like.dtype)
    return rotary_cos_sin_reference(positions, inv_freq, scaling, like)


def fused_rotary_applies(rotary: nn.Module) -> bool:
    """Whether ``rotary`` is a module the op reproduces: an fp32 ``inv_freq`` buffer, a numeric ``attention_scaling``
    and fixed frequencies (not a dynamic rope type, whose forward updates ``inv_freq`` with the positions)."""
    inv = getattr(rotary, "inv_freq", None)
    scaling = getattr(rotary, "attention_scaling", None)
    rope_type = str(getattr(rotary, "rope_type", "default"))
    return (isinstance(inv, torch.Tensor) and inv.dim() == 1 and inv.dtype == torch.float32
            and isinstance(scaling, (int, float)) and "dynamic" not in rope_type and rope_type != "longrope")


def _check_embed(input_ids: torch.Tensor, table: torch.Tensor, positions: torch.Tensor,
                 inv_freq: torch.Tensor) -> None:
    """:func:`embed_rotary`'s arguments (raises naming the bad one): :func:`_check`'s, ``input_ids`` of the
    positions' shape, the table ``[vocab, H]`` with contiguous rows."""
    _check(positions, inv_freq)
    if input_ids.shape != positions.shape or table.dim() != 2 or table.stride(-1) != 1:
        raise ValueError(f"embed_rotary: input_ids {tuple(input_ids.shape)} and positions {tuple(positions.shape)} "
                         f"must match, table must be [vocab, H] with contiguous rows, got {tuple(table.shape)} "
                         f"strides {table.stride()}")


def embed_rotary_reference(input_ids: torch.Tensor, table: torch.Tensor, positions: torch.Tensor,
                           inv_freq: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(embedding(input_ids), cos, sin)``: the embedding table's rows (``F.embedding``) and
    :func:`rotary_cos_sin_reference` in the table's dtype (the op's CPU path)."""
    _check_embed(input_ids, table, positions, inv_freq)
    return (torch.nn.functional.embedding(input_ids, table),
            *rotary_cos_sin_reference(positions, inv_freq, scaling, table))


def _embed_fake(input_ids: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                scaling: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    pe = (*positions.shape, 2 * inv_freq.shape[0])
    return (table.new_empty((*input_ids.shape, table.shape[1])), table.new_empty(pe), table.new_empty(pe))


@opaque_op("embed_rotary", mutates_args=(), fake=_embed_fake)
def embed_rotary(input_ids: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                 scaling: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``positions`` of one shape (integers), the embedding ``table [vocab, H]`` -> new ``(hidden
    [..., H], cos, sin)`` in the table's dtype: :func:`embed_rotary_reference`.  CUDA: the rotary kernel's launch
    copies the rows too (``kernels.rotary.embed_rotary_triton``; rows of the table must be contiguous); elsewhere the
    reference."""
    if not input_ids.is_cuda:
        return embed_rotary_reference(input_ids, table, positions, inv_freq, scaling)
    from ignition.components.kernels.rotary import embed_rotary_triton  # imports triton: CUDA only

    _check_embed(input_ids, table, positions, inv_freq)
    return embed_rotary_triton(input_ids, table, positions, inv_freq, scaling)


#: Whether a step's embedding and rotary run as one launch (:func:`embed_position_embeddings`;
#: ``FLARE_FUSED_EMBED_ROTARY=1`` / ``0``, read when a step is traced, for side-by-side runs): run 194's Qwen3-8B
#: batch-1 trace ran the embedding's gather (aten's ``indexSelectSmallIndex``, 2.2 us) as a launch of its own before
#: the rotary kernel, 2.8 us of the critical path.  The same values (a copy of the table's rows).
FUSED_EMBED_ROTARY = True


def embed_rotary_applies(embedding: nn.Module, rotary: nn.Module, input_ids: torch.Tensor,
                         positions: torch.Tensor) -> bool:
    """Whether a step's embedding and rotary run as one launch (``flare::embed_rotary``): on CUDA, where the embedding
    is a plain ``nn.Embedding`` (no ``max_norm``, contiguous rows) and the rotary one the op reproduces
    (:func:`fused_rotary_applies`), unless ``FLARE_FUSED_ROTARY=0`` or ``FLARE_FUSED_EMBED_ROTARY=0``."""
    table = getattr(embedding, "weight", None)
    return (input_ids.is_cuda and type(embedding) is nn.Embedding and embedding.max_norm is None
            and table.stride(-1) == 1 and input_ids.shape == positions.shape and fused_rotary_applies(rotary)
            and switch("FLARE_FUSED_ROTARY", True) and switch("FLARE_FUSED_EMBED_ROTARY", FUSED_EMBED_ROTARY))


def embed_position_embeddings(embedding: nn.Module, rotary: nn.Module, input_ids: torch.Tensor,
                              positions: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``(embedding(input_ids), position_embeddings(rotary, ., positions))``: on CUDA one launch
    (``flare::embed_rotary``) where :func:`embed_rotary_applies`, else the module and :func:`position_embeddings`."""
    if embed_rotary_applies(embedding, rotary, input_ids, positions):
        hidden, cos, sin = embed_rotary(input_ids, embedding.weight, positions, rotary.inv_freq,
                                        float(rotary.attention_scaling))
        return hidden, (cos, sin)
    hidden = embedding(input_ids)
    return hidden, position_embeddings(rotary, hidden, positions)


#: Whether a step whose attention batch needs no ``visible`` mask also writes the batch's slots, valid and lengths from
#: its embedding and rotary launch (``flare::embed_rotary_batch``; ``FLARE_FUSED_STEP_BATCH=1`` / ``0``, read when a
#: step is traced, for side-by-side runs) instead of the compiled metadata region's own launches: run 200's Qwen3-8B
#: batch-1 trace (an H100) had two Inductor launches there, 4.6 us of the step's critical path (run 194, an H200:
#: 3.0 us), ahead of the embedding.  The same values (:func:`~ignition.components.attention.batch_slots_lens`; its GPU
#: test passes on an H100, run 201).  Qwen3-8B side by side in one process on an H100
#: (``results/20261206T191700Z-sm90-run201``, 1024-token context): off 1.0004x slower at batch 1, 1.0015x at batch 4
#: (paired blocks 1/10 and 0/10 faster; within noise by the min-max rule).  Not yet on an H200.
FUSED_STEP_BATCH = True


def embed_rotary_batch_applies(embedding: nn.Module, rotary: nn.Module, input_ids: torch.Tensor,
                               positions: torch.Tensor, active: torch.Tensor) -> bool:
    """Whether a step's embedding, rotary and attention batch run as one launch (``flare::embed_rotary_batch``):
    where :func:`embed_rotary_applies`, the step's ids ``[B, T]`` and ``active`` bool, unless
    ``FLARE_FUSED_STEP_BATCH=0`` (:data:`FUSED_STEP_BATCH`).  The caller also asks whether its batch needs the
    ``visible`` mask, which the op does not build."""
    return (input_ids.dim() == 2 and active.dtype == torch.bool and switch("FLARE_FUSED_STEP_BATCH", FUSED_STEP_BATCH)
            and embed_rotary_applies(embedding, rotary, input_ids, positions))


def _check_batch(input_ids: torch.Tensor, slot_mapping: torch.Tensor, active: torch.Tensor,
                 seq_lens: torch.Tensor) -> None:
    """:func:`embed_rotary_batch`'s batch arguments (raises naming the bad one): ``slot_mapping`` of the ids' shape
    ``[B, T]`` (int64), ``active`` ``[B]`` bool, ``seq_lens`` ``[B]`` integers."""
    if input_ids.dim() != 2 or slot_mapping.shape != input_ids.shape or slot_mapping.dtype != torch.long:
        raise ValueError(f"embed_rotary_batch: slot_mapping must be int64 of input_ids' [B, T] shape "
                         f"{tuple(input_ids.shape)}, got {tuple(slot_mapping.shape)} {slot_mapping.dtype}")
    b = input_ids.shape[0]
    if active.shape != (b,) or active.dtype != torch.bool:
        raise ValueError(f"embed_rotary_batch: active must be [B] = [{b}] bool, got {tuple(active.shape)} "
                         f"{active.dtype}")
    if seq_lens.shape != (b,) or seq_lens.dtype.is_floating_point or seq_lens.dtype == torch.bool:
        raise ValueError(f"embed_rotary_batch: seq_lens must be [B] = [{b}] integers, got {tuple(seq_lens.shape)} "
                         f"{seq_lens.dtype}")


def embed_rotary_batch_reference(input_ids: torch.Tensor, table: torch.Tensor, positions: torch.Tensor,
                                 inv_freq: torch.Tensor, scaling: float, slot_mapping: torch.Tensor,
                                 active: torch.Tensor, seq_lens: torch.Tensor, sink_slot: int,
                                 max_len: int) -> tuple[torch.Tensor, ...]:
    """``(hidden, cos, sin)`` of :func:`embed_rotary_reference` and ``(slots, valid, lens)`` of
    ``attention.batch_slots_lens`` (the op's CPU path)."""
    from ignition.components.attention import batch_slots_lens  # attention imports this module's users

    _check_batch(input_ids, slot_mapping, active, seq_lens)
    return (*embed_rotary_reference(input_ids, table, positions, inv_freq, scaling),
            *batch_slots_lens(slot_mapping, seq_lens, active, sink_slot, max_len))


def _embed_batch_fake(input_ids, table, positions, inv_freq, scaling, slot_mapping, active, seq_lens, sink_slot,
                      max_len):
    return (*_embed_fake(input_ids, table, positions, inv_freq, scaling),
            slot_mapping.new_empty(slot_mapping.numel()), active.new_empty(slot_mapping.shape),
            seq_lens.new_empty(seq_lens.shape, dtype=torch.long))


@opaque_op("embed_rotary_batch", mutates_args=(), fake=_embed_batch_fake)
def embed_rotary_batch(input_ids: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                       scaling: float, slot_mapping: torch.Tensor, active: torch.Tensor, seq_lens: torch.Tensor,
                       sink_slot: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                              torch.Tensor, torch.Tensor]:
    """``flare::embed_rotary``'s ``(hidden, cos, sin)`` plus the step's attention batch ``(slots [B * T] int64, valid
    [B, T] bool, lens [B] int64)`` -- ``attention.batch_slots_lens`` of ``slot_mapping [B, T]``, ``seq_lens [B]``,
    ``active [B]`` bool, the sink slot and the longest context -- all new tensors.  CUDA: one launch
    (``kernels.rotary.embed_rotary_batch_triton``: the rotary kernel's first program per row block writes them);
    elsewhere :func:`embed_rotary_batch_reference`."""
    if not input_ids.is_cuda:
        return embed_rotary_batch_reference(input_ids, table, positions, inv_freq, scaling, slot_mapping, active,
                                            seq_lens, sink_slot, max_len)
    from ignition.components.kernels.rotary import embed_rotary_batch_triton  # imports triton: CUDA only

    _check_embed(input_ids, table, positions, inv_freq)
    _check_batch(input_ids, slot_mapping, active, seq_lens)
    return embed_rotary_batch_triton(input_ids, table, positions, inv_freq, scaling, slot_mapping, active, seq_lens,
                                     sink_slot, max_len)


def position_embeddings(rotary: nn.Module, x: torch.Tensor,
                        positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotary(x, positions)``'s ``(cos, sin)``: by the op on CUDA where :func:`fused_rotary_applies` (unless
    ``FLARE_FUSED_ROTARY=0``), else by the module."""
    if x.is_cuda and fused_rotary_applies(rotary) and switch("FLARE_FUSED_ROTARY", True):
        return rotary_cos_sin(positions, rotary.inv_freq, float(rotary.attention_scaling), x)
    return rotary(x, positions)
