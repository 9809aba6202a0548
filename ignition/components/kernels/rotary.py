"""The rotary embedding's cos and sin (``flare::rotary_cos_sin``, ``ignition/components/rotary.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignition.components.kernels.launch import ROTARY_PDL, _pdl_enter, pdl_if


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
def _rotary_cos_sin_kernel(POS, INV, COS, SIN, R, scaling, IDS, TABLE, HID, stride_t, SLOTMAP, ACTIVE, SEQLENS, SLOTS,
                           VALID, LENS, T, sink, max_len, HALF: tl.constexpr, HP: tl.constexpr, BLOCK_R: tl.constexpr,
                           USE_PDL: tl.constexpr = False, H: tl.constexpr = 0, BLOCK_H: tl.constexpr = 512,
                           META: tl.constexpr = False):
    _pdl_enter(USE_PDL)  # kernels.launch.ROTARY_PDL: the first layer's projection launches while this runs
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_mask = rows < R
    if H > 0:  # flare::embed_rotary: program (i, j) copies columns j * BLOCK_H.. of its rows' embeddings TABLE[IDS[r]]
        ids = tl.load(IDS + rows, mask=r_mask, other=0).to(tl.int64)
        hh = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        mh = r_mask[:, None] & (hh < H)[None, :]
        tl.store(HID + rows.to(tl.int64)[:, None] * H + hh[None, :],
                 tl.load(TABLE + ids[:, None] * stride_t + hh[None, :], mask=mh), mask=mh)
    if tl.program_id(1) == 0:  # the cos / sin: the first program of each row block
        h = tl.arange(0, HP)
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
        if META:  # flare::embed_rotary_batch: the attention batch's slots, valid and lengths (attention.batch_tensors)
            b = rows // T  # token r of the [B, T] step is row r // T's
            act = tl.load(ACTIVE + b, mask=r_mask, other=0) != 0
            sm = tl.load(SLOTMAP + rows, mask=r_mask, other=-1)
            v = (sm >= 0) & act
            tl.store(SLOTS + rows, tl.where(v, sm, sink).to(tl.int64), mask=r_mask)
            tl.store(VALID + rows, v, mask=r_mask)
            first = r_mask & (rows % T == 0)  # one store per row: its first token's program
            n = tl.minimum(tl.maximum(tl.load(SEQLENS + b, mask=first, other=0).to(tl.int64), 0), max_len)
            tl.store(LENS + b, tl.where(act, n, 0), mask=first)


#: Positions per program of the rotary kernel (a decode step's rows fit one program; a prefill chunk's spread).
ROTARY_BLOCK_ROWS = 16
#: Embedding columns per program of :func:`embed_rotary_triton` (a decode step's one row of Qwen3-8B's 4096: 8
#: programs, each one load and one store of 1 KiB in flight).
EMBED_BLOCK_H = 512


def rotary_cos_sin_triton(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype, *,
                          gather: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                          meta: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``positions [...]`` (integer), ``inv_freq [D / 2]`` float32 -> ``(cos, sin)``, each ``[..., D]`` in ``dtype``,
    one launch (see above).  ``gather``: ``(ids [R], table [vocab, H], hidden [R, H])`` -- the same launch writes
    ``hidden[r] = table[ids[r]]`` (:func:`embed_rotary_triton`).  ``meta``: ``(slot_mapping [B, T] int64, active [B]
    bool, seq_lens [B], slots [B * T] int64, valid [B, T] bool, lens [B] int64, sink_slot, max_len)`` -- the same
    launch writes the attention batch's slots, valid and lengths (:func:`embed_rotary_batch_triton`; positions
    ``[B, T]``).  Shapes are checked by the op (``rotary.py``)."""
    half = inv_freq.shape[0]
    cos = torch.empty((*positions.shape, 2 * half), dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    r = positions.numel()
    if r == 0:
        return cos, sin
    ids, table, hidden = gather or (positions, cos, cos)  # unread without a gather (H = 0)
    h = table.shape[1] if gather else 0
    slot_mapping, active, seq_lens, slots, valid, lens, sink, max_len = meta or (positions, positions, positions, cos,
                                                                                 cos, cos, 0, 0)  # unread: META off
    _rotary_cos_sin_kernel[(triton.cdiv(r, ROTARY_BLOCK_ROWS), max(1, triton.cdiv(h, EMBED_BLOCK_H)))](
        positions.reshape(-1).contiguous(), inv_freq.contiguous(), cos, sin, r, float(scaling), ids, table, hidden,
        table.stride(0), slot_mapping, active, seq_lens, slots, valid, lens, positions.shape[-1], sink, max_len,
        HALF=half, HP=triton.next_power_of_2(half), BLOCK_R=ROTARY_BLOCK_ROWS, num_warps=4, H=h, BLOCK_H=EMBED_BLOCK_H,
        META=meta is not None, **pdl_if(positions.device, "FLARE_ROTARY_PDL", ROTARY_PDL))
    return cos, sin


def embed_rotary_triton(input_ids: torch.Tensor, table: torch.Tensor, positions: torch.Tensor,
                        inv_freq: torch.Tensor, scaling: float,
                        meta: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids [...]``, ``table [vocab, H]`` (rows contiguous), ``positions`` of ``input_ids``' shape ->
    ``(hidden [..., H], cos, sin)`` in the table's dtype, one launch: the rotary kernel also copies each token's
    embedding row (``flare::embed_rotary``; shapes checked by the op).  ``meta``: :func:`rotary_cos_sin_triton`'s."""
    hidden = torch.empty((*input_ids.shape, table.shape[1]), dtype=table.dtype, device=table.device)
    cos, sin = rotary_cos_sin_triton(positions, inv_freq, scaling, table.dtype,
                                     gather=(input_ids.reshape(-1).contiguous(), table, hidden), meta=meta)
    return hidden, cos, sin


def embed_rotary_batch_triton(input_ids: torch.Tensor, table: torch.Tensor, positions: torch.Tensor,
                              inv_freq: torch.Tensor, scaling: float, slot_mapping: torch.Tensor, active: torch.Tensor,
                              seq_lens: torch.Tensor, sink_slot: int, max_len: int) -> tuple[torch.Tensor, ...]:
    """:func:`embed_rotary_triton`'s ``(hidden, cos, sin)`` and the attention batch's ``(slots [B * T] int64, valid
    [B, T] bool, lens [B] int64)`` (``attention.batch_tensors``' values) from one launch (``flare::embed_rotary_batch``;
    ``positions``, ``input_ids`` and ``slot_mapping`` ``[B, T]``, ``active`` ``[B]`` bool; checked by the op)."""
    slots = torch.empty(positions.numel(), dtype=torch.long, device=positions.device)
    valid = torch.empty(positions.shape, dtype=torch.bool, device=positions.device)
    lens = torch.empty(positions.shape[0], dtype=torch.long, device=positions.device)
    meta = (slot_mapping.reshape(-1).contiguous(), active.contiguous(), seq_lens.contiguous(), slots, valid, lens,
            int(sink_slot), int(max_len))
    return (*embed_rotary_triton(input_ids, table, positions, inv_freq, scaling, meta=meta), slots, valid, lens)
