"""Paged KV cache and the PyTorch attention backend (decode and chunked prefill).

Layout (``PagedKVCache``): one stacked pool per K and V, ``[num_layers, num_pages + 1, page_size,
kv_heads, head_dim]``.  Page ``num_pages`` is a sink: writes of padding tokens and inactive rows go
there (``slot_mapping < 0`` or row inactive), so every step writes a static number of slots and
nothing is decided on the host.  Page indices ``0 .. num_pages - 1`` belong to requests through their
block tables ``[B, max_pages] int32``; a token at position ``p`` of a row lives in slot
``block_tables[row, p // page_size] * page_size + p % page_size``.

A step's ``AttentionBatch`` carries explicit tensors (positions ``[B, T]``, slot mapping ``[B, T]``,
block tables, ``seq_lens [B]`` = context length after this step, ``active [B]``) and the visibility
mask, built once per step from tensor comparisons of static shape (key index ``j`` is visible to a
query at position ``p`` iff ``j <= p`` and ``j < seq_len`` and the row is active).  No dense mask is
built from Python values and nothing reads back to the host, so the step is capturable.

``PyTorchPagedAttention`` writes the new K/V through the slot mapping, gathers each row's context from
its pages and computes attention like transformers' eager path: bf16 scores ``(q @ k^T) * scaling``,
masked, softmax in fp32 rounded to the activation dtype, ``@ v``.  GQA shares each K/V head with its
query-head group by reshaping the queries (no K/V repetition).  It attends over the full block-table
width every step (the price of static shapes on this reference path); kernels that stop at
``seq_len`` belong to the Triton/FlashInfer backends.

``TritonPagedAttention`` (attention backend "triton", selected only when asked for) writes K/V the same way;
decode steps (T == 1) go to ``flare::paged_decode_attention`` -- a flash-decoding Triton kernel on CUDA that
reads only the first ``seq_lens[b]`` keys of each row (fp32 scores, softmax and P @ V; output rounded once),
a PyTorch implementation of the same numerics on CPU -- and prefill/verify steps (T > 1) go to
``flare::paged_prefill_attention`` -- a FlashAttention-2 style Triton kernel on CUDA (causal by query position,
only the key blocks a query tile can see; bf16 probabilities into P @ V), the same numerics in PyTorch on CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from ignition.components.custom_ops import opaque_op
from ignition.components.switches import switch


@dataclass
class PagedKVCache:
    k: torch.Tensor  # [layers, num_pages + 1, page_size, kv_heads, head_dim]; the last page is the sink
    v: torch.Tensor
    page_size: int
    max_pages_per_row: int

    @classmethod
    def allocate(cls, num_layers: int, num_pages: int, page_size: int, kv_heads: int, head_dim: int, *,
                 max_context: int, dtype=torch.bfloat16, device=None) -> "PagedKVCache":
        """Zero-filled pools (never uninitialized: masked keys must still hold finite values)."""
        shape = (num_layers, num_pages + 1, page_size, kv_heads, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device),
                   page_size, math.ceil(max_context / page_size))

    @property
    def num_pages(self) -> int:
        return self.k.shape[1] - 1

    @property
    def sink_page(self) -> int:
        return self.num_pages

    @property
    def sink_slot(self) -> int:
        return self.num_pages * self.page_size

    @property
    def max_context(self) -> int:
        return self.max_pages_per_row * self.page_size

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, slots: torch.Tensor) -> None:
        """Scatter ``[N, kv_heads, head_dim]`` into flat slots ``[N]`` (every slot valid; sink for padding)."""
        # An opaque op that declares the pools it mutates: torch.compile calls it in place on the graph input.
        # Traced, the scatter into a view of a graph input was functionalized into a copy of the whole layer
        # pool and a copy back, twice per layer and step (gpu_replay --timeline on the H200; the CPU output
        # code shows the same pool-sized buffer).
        kv_write_(self.k[layer], self.v[layer], k_new, v_new, slots)

    def gather(self, layer: int, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's context in logical order: ``[B, max_pages * page_size, kv_heads, head_dim]``."""
        b, p = block_tables.shape
        idx = block_tables.long()
        k = self.k[layer][idx].view(b, p * self.page_size, *self.k.shape[-2:])
        v = self.v[layer][idx].view(b, p * self.page_size, *self.v.shape[-2:])
        return k, v


@opaque_op("kv_write_", mutates_args=("k_pool", "v_pool"))
def kv_write_(k_pool: torch.Tensor, v_pool: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
              slots: torch.Tensor) -> None:
    """Scatter ``k_new, v_new [N, kv_heads, head_dim]`` into one layer's pools ``[pages + 1, page, kv_heads,
    head_dim]`` at flat ``slots [N]`` (the sink slot for padding: duplicates there are harmless)."""
    k_pool.view(-1, *k_pool.shape[-2:]).index_put_((slots,), k_new)
    v_pool.view(-1, *v_pool.shape[-2:]).index_put_((slots,), v_new)


def slot_mapping_for(block_tables: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                     page_size: int) -> torch.Tensor:
    """Host-side helper (scheduler, tests): slots of ``positions [B, T]``; -1 where not ``valid``."""
    page = torch.gather(block_tables.long(), 1, (positions // page_size).clamp(min=0, max=block_tables.shape[1] - 1))
    slots = page * page_size + positions % page_size
    return torch.where(valid, slots, torch.full_like(slots, -1))


@dataclass
class AttentionBatch:
    """Per-step attention inputs shared by every layer (built once per step, static shapes)."""

    cache: PagedKVCache
    slots: torch.Tensor  # [B * T] int64, sanitized: padding and inactive rows point at the sink slot
    block_tables: torch.Tensor  # [B, P]
    # [B, 1, 1, T, S] bool: key j visible to query t; None where no layer's backend reads it
    # (:meth:`PyTorchPagedAttention.uses_visible`, :func:`batch_tensors`)
    visible: torch.Tensor | None
    valid: torch.Tensor  # [B, T] bool: real (written, attended) tokens
    active: torch.Tensor  # [B] bool
    # [B] int64: context length after this step, clamped to [0, S], 0 for inactive rows.  In decode (T == 1) the
    # query sits at position seq_len - 1, so this is the number of keys it sees (``visible.sum(-1)``).  None for
    # batches built without it; :class:`TritonPagedAttention` then counts ``visible``.
    seq_lens: torch.Tensor | None = None
    positions: torch.Tensor | None = None  # [B, T] int64: each query's position (None: see query_positions())

    @classmethod
    def build(cls, cache: PagedKVCache, positions: torch.Tensor, slot_mapping: torch.Tensor,
              block_tables: torch.Tensor, seq_lens: torch.Tensor, active: torch.Tensor,
              tensors_fn: Callable | None = None, with_visible: bool = True) -> "AttentionBatch":
        """``tensors_fn``: :func:`batch_tensors` or a compiled form of it (a step's metadata region);
        ``with_visible``: whether to build ``visible`` (:func:`batch_tensors`)."""
        slots, visible, valid, active, lens, pos = (tensors_fn or batch_tensors)(
            positions, slot_mapping, block_tables, seq_lens, active, cache.sink_slot, cache.page_size, with_visible)
        return cls(cache, slots, block_tables, visible, valid, active, lens, pos)

    def visible_mask(self) -> torch.Tensor:
        """:attr:`visible`; raises where the batch was built without it."""
        if self.visible is None:
            raise ValueError("AttentionBatch.visible: this batch was built without the visibility mask "
                             "(with_visible=False: no layer's attention backend reads it)")
        return self.visible

    def decode_lens(self) -> torch.Tensor:
        """``[B]`` int64: keys visible to each row's (single) decode query; static-shape, no host sync."""
        if self.seq_lens is not None:
            return self.seq_lens
        return self.visible_mask()[:, 0, 0, -1, :].sum(dim=-1)

    def last_valid(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, D]``: each row's last valid token of ``hidden [B, T, D]`` (position 0 for a row with none).  At one
        token per row (decode) that is ``hidden[:, 0]`` whatever ``valid`` holds -- a view, no gather launch: in a
        captured Qwen3-8B decode step the gather was a kernel of its own between the last down projection and the
        head (1.1 us, run 186's batch-1 trace), which also kept the head from launching early behind the down.
        ``FLARE_HEAD_VIEW=0`` gathers at one token too (read at each trace, for side-by-side runs; the same values):
        Qwen3-8B side by side in one process on an H100 (``results/20261206T031133Z-sm90-run189``) 1.0010x slower at
        batch 1, 1.0020x at batch 4 (paired blocks 0/10 faster; within noise by the min-max rule)."""
        if hidden.shape[1] == 1 and switch("FLARE_HEAD_VIEW", True):
            return hidden[:, 0]
        last = (self.valid.sum(dim=1) - 1).clamp(min=0)
        return hidden.gather(1, last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])).squeeze(1)

    def query_positions(self) -> torch.Tensor:
        """``[B, T]`` int64: each query's absolute position (the prefill kernels' causal bound).  For a batch built
        without them, recovered from ``visible`` (``visible.sum(-1) - 1``: exact for every real token, whose
        position is below seq_len; a padding query gets seq_len - 1 and an inactive row -1 -- both ignored)."""
        if self.positions is not None:
            return self.positions
        return self.visible_mask()[:, 0, 0].sum(dim=-1) - 1


#: Whether every step builds its batch's ``visible`` mask (``FLARE_BATCH_VISIBLE=1`` / ``0``, read at each trace, for
#: side-by-side runs) instead of only the steps where a layer's backend reads it (:func:`step_needs_visible`): the
#: "triton" backend never does -- its decode and prefill kernels take ``seq_lens`` and the positions -- yet the mask was
#: the compiled metadata region's own launch at the start of every step (run 190's Qwen3-8B batch-1 trace, an H100: a
#: 1.5 us kernel of the 5.0 us of metadata on the step's critical path, beside the slots' and the lengths' launches),
#: and at prefill a ``T x S`` bool write per row (S: the block table's keys).  Side by side in one process with the null
#: on an H100 (``results/20261206T045100Z-sm90-run191``), the mask built again against this default: Qwen3-8B batch 1
#: 1.0003x, batch 4 1.0014x -- within noise (null 1.0006 / 1.0011); the default stays: work nobody reads, the same bits.
BATCH_VISIBLE_ALWAYS = False


def step_needs_visible(backends: Iterable[Any], tokens: int) -> bool:
    """Whether a step of ``tokens`` per row (a static shape) builds ``visible``: where any of ``backends`` reads it
    (``uses_visible(tokens)``; a backend without that method is assumed to), or always with
    :data:`BATCH_VISIBLE_ALWAYS` (``FLARE_BATCH_VISIBLE``)."""
    if switch("FLARE_BATCH_VISIBLE", BATCH_VISIBLE_ALWAYS):
        return True
    return any(b.uses_visible(tokens) if hasattr(b, "uses_visible") else True for b in backends)


def batch_tensors(positions: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor, active: torch.Tensor, sink_slot: int, page_size: int,
                  with_visible: bool = True) -> tuple[torch.Tensor | None, ...]:
    """The tensors of an :class:`AttentionBatch`: ``(slots, visible, valid, active, seq_lens, positions)``.  Pure,
    integer and boolean ops only: compiled (the step's metadata region under regional compilation, one fused
    launch or a few instead of a dozen) it equals the eager ops bit for bit.  ``with_visible`` False: ``visible``
    is None -- the ``[B, 1, 1, T, S]`` mask only :class:`PyTorchPagedAttention` reads (the step's builder asks its
    backends, :func:`step_needs_visible`); compiled, its launch is gone from the step's metadata region."""
    b, t = positions.shape
    s = block_tables.shape[1] * page_size
    active = active.bool()
    slots, valid, lens = batch_slots_lens(slot_mapping, seq_lens, active, sink_slot, s)
    visible = None
    if with_visible:
        key = torch.arange(s, device=positions.device)
        visible = (key[None, None, :] <= positions[:, :, None]) & (key[None, None, :] < seq_lens[:, None, None])
        visible = (visible & active[:, None, None]).view(b, 1, 1, t, s)
    return slots, visible, valid, active, lens, positions.long()


def batch_slots_lens(slot_mapping: torch.Tensor, seq_lens: torch.Tensor, active: torch.Tensor, sink_slot: int,
                     max_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`batch_tensors`' ``(slots [B * T] int64, valid [B, T] bool, lens [B] int64)`` from ``slot_mapping [B, T]``,
    ``seq_lens [B]``, ``active [B]`` bool: a token is valid where its slot is (>= 0) and its row active, a slot not
    valid points at the sink, a length is clamped to ``[0, max_len]`` (0 for an inactive row).  Also the CPU path of
    ``flare::embed_rotary_batch``, whose CUDA launch writes the same values."""
    valid = (slot_mapping >= 0) & active[:, None]
    sink = torch.full_like(slot_mapping, sink_slot)
    slots = torch.where(valid, slot_mapping, sink).reshape(-1).long()
    lens = torch.where(active, seq_lens.long().clamp(min=0, max=max_len), torch.zeros_like(seq_lens, dtype=torch.long))
    return slots, valid, lens


class PyTorchPagedAttention:
    """Reference backend (CPU and GPU, eager or Inductor): eager-path numerics, paged K/V."""

    name = "pytorch"
    features = frozenset({"paged_decode", "chunked_prefill", "gqa", "capturable"})  # backends.ATTENTION_FEATURES

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float):
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
        self.num_heads, self.num_kv_heads, self.head_dim, self.scaling = num_heads, num_kv_heads, head_dim, scaling
        self.groups = num_heads // num_kv_heads

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 batch: AttentionBatch) -> torch.Tensor:
        """``q [B, T, H, D]``, ``k, v [B, T, KV, D]`` (rotated, normed) -> ``[B, T, H * D]``: the KV write (the
        opaque ``flare::kv_write_``), then :meth:`attend`."""
        b, t = q.shape[:2]
        kvh, d = self.num_kv_heads, self.head_dim
        batch.cache.write(layer, k.reshape(b * t, kvh, d), v.reshape(b * t, kvh, d), batch.slots)
        return self.attend(layer, q, batch)

    def rope_attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor,
                    sin: torch.Tensor, batch: AttentionBatch, overlap_bytes: int | None = None,
                    prefetch_weight: torch.Tensor | None = None) -> torch.Tensor:
        """``q [B, T, H, D]``, ``k, v [B, T, KV, D]`` straight from the QKV projection (views are fine), per-head
        norm weights ``[D]`` or None, ``cos, sin [B, T, D]`` -> ``[B, T, H * D]``: the per-head norms, the rotary
        embedding and the KV write (``flare::rope_write_``), then :meth:`attend`.  ``overlap_bytes``: the QKV
        projection's weight bytes (None: unknown), ``prefetch_weight``: the output projection's weight (None: none
        given) -- scheduling hints for backends whose kernels use them."""
        from ignition.components.rope_write import rope_write_  # rope_write imports this module

        q = rope_write_(q, k, v, q_norm, k_norm, eps, cos, sin, batch.cache.k[layer], batch.cache.v[layer],
                        batch.slots)
        return self.attend(layer, q, batch)

    def attend(self, layer: int, q: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        """Attention of ``q [B, T, H, D]`` over the pools, this step's K/V already written (by :meth:`__call__` or
        by a fused write such as ``flare::rope_write_``) -> ``[B, T, H * D]``: the opaque ``flare::paged_attention``
        (its softmax is a reduction: compiled and uncompiled steps must run the same one)."""
        return paged_attention(q, batch.cache.k[layer], batch.cache.v[layer], batch.block_tables,
                               batch.visible_mask(), self.scaling)

    def uses_visible(self, tokens: int) -> bool:
        """Whether :meth:`attend` reads the batch's ``visible`` mask at ``tokens`` per row (a static shape): always
        here."""
        return True


def paged_attention_reference(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                              block_tables: torch.Tensor, visible: torch.Tensor, scaling: float) -> torch.Tensor:
    """Eager-path numerics: gather each row's pages, GQA matmuls, fp32 softmax rounded to the input dtype.
    ``q [B, T, H, D]``, pools ``[pages + 1, page, KV, D]``, ``visible [B, 1, 1, T, S]`` -> ``[B, T, H * D]``."""
    b, t, h, d = q.shape
    kvh = k_pool.shape[-2]
    g = h // kvh
    p = block_tables.shape[1]
    idx = block_tables.long()
    k_ctx = k_pool[idx].view(b, p * k_pool.shape[1], kvh, d)  # [B, S, KV, D]
    v_ctx = v_pool[idx].view(b, p * v_pool.shape[1], kvh, d)
    s = k_ctx.shape[1]
    # queries of one KV group side by side: [B, KV, G*T, D]; head h = kv * G + g as in repeat_kv
    qg = q.view(b, t, kvh, g, d).permute(0, 2, 3, 1, 4).reshape(b, kvh, g * t, d)
    scores = torch.matmul(qg, k_ctx.permute(0, 2, 3, 1)) * scaling  # [B, KV, G*T, S]
    scores = scores.view(b, kvh, g, t, s).masked_fill(~visible, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype).view(b, kvh, g * t, s)
    out = torch.matmul(probs, v_ctx.transpose(1, 2))  # [B, KV, G*T, D]
    return out.view(b, kvh, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, kvh * g * d)


def _attention_output_fake(q, *_):
    """Fake (meta) output of the attention ops: ``[B, T, H * D]`` like ``q [B, T, H, D]``."""
    b, t, h, d = q.shape
    return q.new_empty((b, t, h * d))


@opaque_op("paged_attention", mutates_args=(), fake=_attention_output_fake)
def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                    visible: torch.Tensor, scaling: float) -> torch.Tensor:
    """Opaque to Inductor: reads ``q``, one layer's pools, the block tables and the visibility mask; returns a
    new contiguous ``[B, T, H * D]``."""
    return paged_attention_reference(q, k_pool, v_pool, block_tables, visible, scaling).contiguous()


# ---------------------------------------------------------------- decode attention that stops at seq_len

def _context_geometry(q: torch.Tensor, k_pool: torch.Tensor, block_tables: torch.Tensor):
    """``(B, T, H, D, KV heads, group size, block tables as int64, S = P * page, key positions [S])`` of a step
    whose references gather the full block-table width."""
    b, t, h, d = q.shape
    kvh = k_pool.shape[-2]
    s = block_tables.shape[1] * k_pool.shape[1]
    return b, t, h, d, kvh, h // kvh, block_tables.long(), s, torch.arange(s, device=q.device)


def paged_decode_attention_reference(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                                     block_tables: torch.Tensor, seq_lens: torch.Tensor,
                                     scaling: float) -> torch.Tensor:
    """The numerics of the Triton decode kernel in PyTorch: ``q [B, 1, H, D]``, pools ``[pages + 1, page, KV, D]``,
    ``block_tables [B, P]``, ``seq_lens [B]`` -> ``[B, 1, H * D]`` in q's dtype.  Row b attends keys
    ``0 .. min(seq_lens[b], P * page) - 1``; scores, softmax and ``P @ V`` in fp32 (probabilities are not rounded
    to q's dtype, unlike :func:`paged_attention_reference`; the kernel's ``P @ V`` is tf32x3, fp32-level), the
    output rounded once; a row with no keys
    (seq_lens 0: inactive) is zeros.  It gathers the full block-table width (static shapes) and masks the keys
    past seq_len (scores -inf, values 0: whatever the pool holds there never reaches the output)."""
    b, t, h, d, kvh, g, idx, s, key = _context_geometry(q, k_pool, block_tables)
    if t != 1:
        raise ValueError(f"paged_decode_attention: one query token per row, got T={t}")
    keep = key[None, :] < seq_lens.to(q.device).long()[:, None]  # [B, S]
    k_ctx = k_pool[idx].view(b, s, kvh, d).float()
    v_ctx = torch.where(keep[:, :, None, None], v_pool[idx].view(b, s, kvh, d).float(), 0.0)
    qg = q.view(b, kvh, g, d).float()  # head h = kv * G + g
    scores = torch.matmul(qg, k_ctx.permute(0, 2, 3, 1)) * scaling  # [B, KV, G, S]
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    e = torch.exp(scores - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))  # empty rows: all 0
    denom = e.sum(dim=-1, keepdim=True)
    out = torch.matmul(e, v_ctx.transpose(1, 2))  # [B, KV, G, D]
    out = torch.where(denom > 0, out / torch.where(denom > 0, denom, torch.ones_like(denom)), 0.0)
    return out.reshape(b, 1, h * d).to(q.dtype)


@opaque_op("paged_decode_attention", mutates_args=(), fake=_attention_output_fake)
def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, scaling: float) -> torch.Tensor:
    """Decode attention (one query token per row) over each row's first ``seq_lens[b]`` keys: reads ``q [B, 1, H,
    D]``, one layer's pools, the block tables and ``seq_lens [B]``; returns a new contiguous ``[B, 1, H * D]``
    (zeros for rows with seq_lens 0).  CUDA: the Triton flash-decoding kernel (work proportional to seq_lens, not
    to the block-table width; its fp32 split workspaces are allocated per call from the caching allocator, so
    the call is capturable); elsewhere :func:`paged_decode_attention_reference` (same numerics)."""
    return paged_decode_attention_reference(q, k_pool, v_pool, block_tables, seq_lens, scaling).contiguous()


@paged_decode_attention.register_kernel("cuda")
def _paged_decode_attention_cuda(q, k_pool, v_pool, block_tables, seq_lens, scaling):
    from ignition.components.kernels.paged_decode import paged_decode_attention_triton  # imports triton: CUDA only

    return paged_decode_attention_triton(q, k_pool, v_pool, block_tables, seq_lens, scaling)


# ---------------------------------------------------------------- prefill / verify attention that stops at the context

def paged_prefill_attention_reference(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                                      block_tables: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor,
                                      scaling: float) -> torch.Tensor:
    """The numerics of the Triton prefill kernel (FlashAttention-2 style) in PyTorch: ``q [B, T, H, D]``, pools
    ``[pages + 1, page, KV, D]``, ``block_tables [B, P]``, ``positions [B, T]``, ``seq_lens [B]`` -> ``[B, T, H * D]``
    in q's dtype.  Query i of row b attends keys ``j <= positions[b, i]`` and ``j < seq_lens[b]``.  Scores
    ``q.k`` of the bf16 inputs in fp32, times ``scaling``; softmax in fp32: ``e = exp(s - max)``, the sum ``l`` of
    the fp32 ``e``; ``e`` is rounded to q's dtype before ``e @ v`` (fp32 accumulation), then divided by ``l`` and
    rounded once -- the kernel rounds ``exp2(s - running max)`` the same way (it differs only by the running max
    and the fp32 summation order).  A query that sees no key (padding, rows with seq_lens 0) is zeros.  It gathers
    the full block-table width (static shapes; the kernel stops at the context) and zeroes masked values."""
    b, t, h, d, kvh, g, idx, s, key = _context_geometry(q, k_pool, block_tables)
    lens = seq_lens.to(q.device).long()
    vis = (key[None, None, :] <= positions.to(q.device).long()[:, :, None]) & (key[None, None, :] < lens[:, None, None])
    keep = key[None, :] < lens[:, None]  # [B, S]
    k_ctx = torch.where(keep[:, :, None, None], k_pool[idx].view(b, s, kvh, d), 0).float()
    v_ctx = torch.where(keep[:, :, None, None], v_pool[idx].view(b, s, kvh, d), 0).float()
    qg = q.view(b, t, kvh, g, d).permute(0, 2, 3, 1, 4).float()  # [B, KV, G, T, D]; head h = kv * G + g
    scores = torch.matmul(qg, k_ctx.permute(0, 2, 3, 1)[:, :, None]) * scaling  # [B, KV, G, T, S]
    scores = scores.masked_fill(~vis[:, None, None], float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    e = torch.exp(scores - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))  # no key: all 0
    denom = e.sum(dim=-1, keepdim=True)
    out = torch.matmul(e.to(q.dtype).float(), v_ctx.permute(0, 2, 1, 3)[:, :, None])  # [B, KV, G, T, D]
    out = torch.where(denom > 0, out / torch.where(denom > 0, denom, torch.ones_like(denom)), 0.0)
    return out.permute(0, 3, 1, 2, 4).reshape(b, t, h * d).to(q.dtype)


@opaque_op("paged_prefill_attention", mutates_args=(), fake=_attention_output_fake)
def paged_prefill_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                            positions: torch.Tensor, seq_lens: torch.Tensor, scaling: float) -> torch.Tensor:
    """Prefill / chunked-prefill / verify attention (T query tokens per row at ``positions [B, T]``) over each row's
    first ``seq_lens[b]`` keys, causal by position: reads ``q [B, T, H, D]``, one layer's pools, the block tables,
    positions and ``seq_lens [B]``; returns a new contiguous ``[B, T, H * D]`` (zeros where a query sees no key).
    CUDA: the Triton FlashAttention-2 style kernel (work follows the context, not the block-table width);
    elsewhere :func:`paged_prefill_attention_reference` (same numerics)."""
    return paged_prefill_attention_reference(q, k_pool, v_pool, block_tables, positions, seq_lens,
                                             scaling).contiguous()


@paged_prefill_attention.register_kernel("cuda")
def _paged_prefill_attention_cuda(q, k_pool, v_pool, block_tables, positions, seq_lens, scaling):
    # imports triton: CUDA only
    from ignition.components.kernels.prefill_attention import paged_prefill_attention_triton

    return paged_prefill_attention_triton(q, k_pool, v_pool, block_tables, positions, seq_lens, scaling)


class TritonPagedAttention(PyTorchPagedAttention):
    """Attention backend "triton": the KV write of :class:`PyTorchPagedAttention`; decode steps (T == 1) through
    ``flare::paged_decode_attention`` (reads each row's ``seq_lens`` keys only: decode cost follows the context,
    not the graph's maximum context); prefill, chunked-prefill and verify steps (T > 1) through
    ``flare::paged_prefill_attention`` (a FlashAttention-2 style Triton kernel on CUDA: causal by query position,
    key blocks up to the tile's largest position and seq_len only).  The path is chosen from the static shape T,
    never at run time from data.

    Numerics differ from "pytorch": decode uses fp32 scores and probabilities; prefill fp32 scores and softmax
    with the unnormalized probabilities rounded to bf16 before P @ V (the reference rounds scores and normalized
    probabilities to bf16); both with the kernels' own reduction order.  The decode kernel has run on the H200
    (bytewise compiled == uncompiled over 256 steps); the registry still ranks it below "pytorch" (the GPU matrix
    runs the default), so it serves only when asked for by name."""

    name = "triton"
    features = frozenset({"paged_decode", "chunked_prefill", "gqa", "capturable"})
    prefill_kernel = True  # T > 1 through flare::paged_prefill_attention (False: the reference flare::paged_attention)
    fused_decode = True  # T == 1 through flare::rope_decode_attention_ (False: rope_write_, then the decode op)

    def rope_attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor,
                    sin: torch.Tensor, batch: AttentionBatch, overlap_bytes: int | None = None,
                    prefetch_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Decode steps (T == 1, a static shape): norms, rotary, KV write and attention as ONE op
        (``flare::rope_decode_attention_``: the composition of ``rope_write_`` and ``paged_decode_attention``;
        ``overlap_bytes`` decides its K/V prefetch, ``prefetch_weight`` is the weight its reduce prefetches the last
        :func:`~ignition.components.decode_attention.decode_reduce_prefetch_bytes` of, read here, when the step is
        traced); other steps as the base class."""
        if q.shape[1] != 1 or not self.fused_decode:
            return super().rope_attend(layer, q, k, v, q_norm, k_norm, eps, cos, sin, batch, overlap_bytes)
        from ignition.components.decode_attention import decode_reduce_prefetch_bytes, rope_decode_attention_

        ahead = decode_reduce_prefetch_bytes() if prefetch_weight is not None else 0
        return rope_decode_attention_(q, k, v, q_norm, k_norm, eps, cos, sin, batch.cache.k[layer],
                                      batch.cache.v[layer], batch.slots, batch.block_tables, batch.decode_lens(),
                                      self.scaling, overlap_bytes, prefetch_weight if ahead else None, ahead)

    def uses_visible(self, tokens: int) -> bool:
        """Only the reference attention of T > 1 without the prefill kernel reads ``visible``; decode steps and the
        prefill kernel take ``seq_lens`` and the positions."""
        return tokens != 1 and not self.prefill_kernel

    def attend(self, layer: int, q: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        t = q.shape[1]
        if self.uses_visible(t):  # the reference attention: the one path that reads ``visible``
            return super().attend(layer, q, batch)
        if t != 1:  # prefill / verify
            return paged_prefill_attention(q, batch.cache.k[layer], batch.cache.v[layer], batch.block_tables,
                                           batch.query_positions(), batch.decode_lens(), self.scaling)
        return paged_decode_attention(q, batch.cache.k[layer], batch.cache.v[layer], batch.block_tables,
                                      batch.decode_lens(), self.scaling)


class TritonDecodePagedAttention(TritonPagedAttention):
    """Attention backend "triton-decode": the Triton decode kernel for T == 1, the reference
    ``flare::paged_attention`` for T > 1 -- the side-by-side baseline of the prefill kernel (and what "triton"
    was before it)."""

    name = "triton-decode"
    prefill_kernel = False


class TritonUnfusedPagedAttention(TritonPagedAttention):
    """Attention backend "triton-unfused": "triton" with a decode step's ``rope_write_`` and decode attention as
    separate launches (three kernels per layer instead of two) -- the side-by-side baseline of the fused decode op;
    the same numerics (on the GPU the norm statistics may sum in another order: ulp-level differences)."""

    name = "triton-unfused"
    fused_decode = False
