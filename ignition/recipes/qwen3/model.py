"""The prepared Qwen3 model: transformers' Qwen3 modules with instance-local replacements.

Composition (what is reused, what is replaced, and why):

* The canonical ``Qwen3ForCausalLM`` is built on the meta device.  Its embedding, norms' weights, the
  activation and ``rotary_emb`` are reused as they are; ``apply_rotary_pos_emb``'s expression (same rounding
  points, tested against it) runs inside ``flare::rope_write_`` together with ``q_norm`` / ``k_norm`` and the
  K/V write -- one launch per layer instead of five.
* Per instance (no class or module-global patch), ``self_attn`` becomes ``PagedQwen3Attention`` and ``mlp``
  becomes ``PackedQwen3MLP``: the smallest modules that own the dataflow we must change -- Q/K/V and gate/up
  fused into one projection each (packed once at load), the KV state in the paged pool instead of a
  ``Cache`` object, and attention without a dense mask built per call.  Each ``Qwen3DecoderLayer`` becomes
  ``PreparedQwen3DecoderLayer``: the same residual structure, but its norms and skip connections are handed
  to the neighbouring projections so that a decode step can run norm + projection (+ SiLU gate) (+ residual)
  as one kernel (``flare::fused_linear``, by the measured rule of ``fused_linear.prefers_fused``).
  ``lm_head`` becomes a ``Projection`` (tied to the embedding where the config says so).
* ``Qwen3Model.forward`` is not called: it builds a ``DynamicCache`` and a causal mask from Python
  values per call.  ``PreparedQwen3.forward`` is the thin replacement: embed and the rotary (on CUDA one launch,
  ``flare::embed_rotary``: the table's rows and the module's cos/sin bit for bit), then
  each prepared decoder layer, which hands the step's ``AttentionBatch`` to our attention as
  ``paged_batch=`` (no ``Cache`` argument: the ``past_key_values``/``cache`` rename between transformers
  versions never matters).
* RMSNorm (every instance: layer norms, ``q_norm``/``k_norm``, the final norm) becomes
  ``ignition.components.norms.RMSNorm`` -- same weight, canonical semantics -- calling the opaque
  ``flare::rms_norm``, and the attention reduction is the opaque ``flare::paged_attention``: reductions
  Inductor cannot re-derive, so a compiled step equals the uncompiled one bytewise on the GPU too (Inductor
  reorders fp32 sums it traces).  The canonical ``residual + h`` (rounded to bf16) stays traced; the graph
  catalog compiles with ``emulate_precision_casts`` so elementwise fusions keep the bf16 rounding points.

Only the modules that survive replacement are materialized (``to_empty``), then the checkpoint is
streamed into them (``ignition.checkpoints.loading``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from ignition.checkpoints.loading import CheckpointError, CheckpointReader, load_checkpoint
from ignition.components.attention import AttentionBatch, PagedKVCache, PyTorchPagedAttention, step_needs_visible
from ignition.components.decode_attention import decode_reduce_prefetch_bytes
from ignition.components.fused_linear import (carries_prenorm, gated_mlp_block, head_logits_block, linear_block,
                                              mlp_publishes_prenorm, mlp_takes_prenorm, published_norm, takes_prenorm)
from ignition.components.norms import RMSNorm
from ignition.components.rotary import embed_position_embeddings, embed_rotary_batch, embed_rotary_batch_applies
from ignition.components.rotary import position_embeddings as rotary_position_embeddings
from ignition.components.sampling import argmax_last
from ignition.components.projections import (
    BF16, PackedProjection, Quantization, UnquantizedProjection, format_for, make_projection,
    quantization_from_config,
)

#: Hugging Face leaf name -> (packed module, shard).  Fusion is data: the loader reads it.
PACKED_MODULES_MAPPING: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}
_STATIC_ROPE = ("default", "linear", "yarn", "llama3")  # inv_freq fixed at init (no per-call update)

Sampler = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def greedy(logits: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Default in-step sampler: argmax (first maximum, as ``torch.argmax``; two-stage, see ``argmax_last``); -1 for
    inactive rows."""
    return torch.where(active, argmax_last(logits), torch.full_like(active, -1, dtype=torch.long))


def _stored_bytes(module: nn.Module) -> int:
    """The bytes of ``module``'s parameters and buffers (a projection's weight as stored, whatever its format)."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def _norm_weight(norm: nn.Module) -> torch.Tensor | None:
    """A per-head norm's weight for ``flare::rope_write_``; None for ``nn.Identity`` (no norm)."""
    return None if isinstance(norm, nn.Identity) else norm.weight


class PagedQwen3Attention(nn.Module):
    """Replaces one ``Qwen3Attention``: fused QKV, canonical q/k norms and rotary, paged attention, o_proj."""

    def __init__(self, canonical: nn.Module, qkv_proj: PackedProjection, o_proj: nn.Module, backend):
        super().__init__()
        self.layer_idx = canonical.layer_idx
        self.head_dim = canonical.head_dim
        self.scaling = canonical.scaling
        self.qkv_proj = qkv_proj
        self.qkv_bytes = _stored_bytes(qkv_proj)  # the attention's scheduling hint (forward), fixed by the formats
        self.q_norm = RMSNorm.from_canonical(canonical.q_norm)  # same weights (applied by flare::rope_write_)
        self.k_norm = RMSNorm.from_canonical(canonical.k_norm)
        if self.q_norm.variance_epsilon != self.k_norm.variance_epsilon:
            raise ValueError("q_norm and k_norm eps differ: flare::rope_write_ takes one")
        self.eps = self.q_norm.variance_epsilon
        self.o_proj = o_proj
        self.backend = backend

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None, paged_batch: AttentionBatch | None = None,
                kv_layer: int | None = None, input_norm: nn.Module | None = None,
                residual: torch.Tensor | None = None, prenorm: tuple[torch.Tensor, torch.Tensor] | None = None,
                publish_norm: torch.Tensor | None = None, **_):
        """``kv_layer``: the layer of ``paged_batch.cache`` holding this layer's K/V (default ``layer_idx``);
        regional compilation passes a one-layer view of the pool and ``kv_layer=0`` so that no
        layer-specific integer is traced (one compiled layer graph then serves every layer).
        ``input_norm`` (applied to ``hidden_states`` first) and ``residual`` (added to the output) are the
        decoder layer's, handed in so that the QKV and output projections may fuse them
        (:func:`ignition.components.fused_linear.linear_block`).  ``prenorm``: ``input_norm`` of ``hidden_states`` as
        the launch that wrote them published it (:meth:`takes_prenorm`); ``publish_norm``: the next norm's weights --
        the output projection then returns the published norm of its output in place of the attention weights (None
        where its launch publishes nothing)."""
        if paged_batch is None:
            raise ValueError("PagedQwen3Attention needs the step's paged_batch (call PreparedQwen3.forward)")
        b, t = hidden_states.shape[:2]
        q, k, v = (x.view(b, t, -1, self.head_dim)
                   for x in linear_block(hidden_states, self.qkv_proj, norm=input_norm, prenorm=prenorm))
        cos, sin = position_embeddings
        layer = self.layer_idx if kv_layer is None else kv_layer
        # q_norm / k_norm, the canonical rotary on the [B, T, heads, D] layout (cos/sin [B, T, D] broadcast over
        # heads), the K/V write into the pools (flare::rope_write_, the same rounding points) and attention: the
        # backend's rope_attend (a decode step of the "triton" backend runs all of it as one launch)
        # overlap_bytes: the QKV projection's weight, which its kernel streams while the attention's launches --
        # a scheduling hint (the decode kernel prefetches K/V only behind a long enough stream)
        # prefetch_weight: the output projection's, when its reduce prefetches part of it (DECODE_REDUCE_PREFETCH_MB)
        ahead = getattr(self.o_proj, "weight", None) if t == 1 and decode_reduce_prefetch_bytes() > 0 else None
        out = self.backend.rope_attend(layer, q, k, v, _norm_weight(self.q_norm), _norm_weight(self.k_norm), self.eps,
                                       cos, sin, paged_batch, overlap_bytes=self.qkv_bytes, prefetch_weight=ahead)
        # early: the post-attention norm / MLP after it reads only weights before its wait
        if publish_norm is not None:
            return linear_block(out, self.o_proj, residual=residual, early=True, publish_norm=publish_norm)
        return linear_block(out, self.o_proj, residual=residual, early=True), None

    def takes_prenorm(self, rows: int) -> bool:
        """Whether :meth:`forward` on ``rows`` rows takes its input's published norm (the QKV launch)."""
        return takes_prenorm(rows, self.qkv_proj)


class PackedQwen3MLP(nn.Module):
    """Replaces one ``Qwen3MLP``: fused gate/up, the canonical ``act_fn``, down projection."""

    def __init__(self, canonical: nn.Module, gate_up_proj: PackedProjection, down_proj: nn.Module, act_name: str):
        super().__init__()
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj
        self.act_fn = canonical.act_fn
        self.act_name = act_name

    def forward(self, x: torch.Tensor, input_norm: nn.Module | None = None,
                residual: torch.Tensor | None = None, prenorm: tuple[torch.Tensor, torch.Tensor] | None = None,
                publish_norm: torch.Tensor | None = None):
        """``input_norm`` / ``residual``: the decoder layer's, for the projections to fuse (see the attention);
        ``prenorm``: x's published norm (:meth:`takes_prenorm`); ``publish_norm``: the next norm's weights -- return
        ``(out, published)`` (:meth:`publishes_prenorm`)."""
        # early: what follows (the next layer's qkv projection, or the final norm) reads only weights before its wait
        return gated_mlp_block(x, self.gate_up_proj, self.down_proj, norm=input_norm, residual=residual,
                               act_fn=self.act_fn, act_name=self.act_name, early=True, prenorm=prenorm,
                               publish_norm=publish_norm)

    def takes_prenorm(self, rows: int) -> bool:
        """Whether :meth:`forward` on ``rows`` rows behind its norm takes x's published norm."""
        return mlp_takes_prenorm(rows, self.gate_up_proj, self.down_proj, self.act_name)

    def publishes_prenorm(self, rows: int) -> bool:
        """Whether :meth:`forward` on ``rows`` rows asked to ``publish_norm`` publishes it."""
        return mlp_publishes_prenorm(rows, self.gate_up_proj, self.down_proj, self.act_name)


class PreparedQwen3DecoderLayer(nn.Module):
    """Replaces one ``Qwen3DecoderLayer``: the canonical residual structure, unchanged --

        h = x + self_attn(input_layernorm(x));  out = h + mlp(post_attention_layernorm(h))

    -- with each norm and skip connection handed to the projection next to it, so that a decode step can run
    norm + QKV, o_proj + residual, norm + gate/up + SiLU gate and down + residual as one kernel each
    (``flare::fused_linear``; which ones fuse is the measured rule of
    :func:`ignition.components.fused_linear.prefers_fused`, by row count and weight shape).  Where nothing
    fuses (prefill chunks, wide batches, rounds) the same canonical modules run in the canonical order."""

    def __init__(self, canonical: nn.Module, self_attn: PagedQwen3Attention, mlp: PackedQwen3MLP):
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm.from_canonical(canonical.input_layernorm)
        self.post_attention_layernorm = RMSNorm.from_canonical(canonical.post_attention_layernorm)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                paged_batch: AttentionBatch | None = None, kv_layer: int | None = None,
                prenorm: tuple[torch.Tensor, torch.Tensor] | None = None, next_norm: torch.Tensor | None = None,
                **_):
        """The layer's output; with ``next_norm`` (the next norm's weights, where the step carries published norms:
        :meth:`carries_prenorm`) ``(output, its published norm)``, and ``prenorm`` this layer's input norm as the
        layer before published it."""
        # the output projection publishes the post-attention norm where the MLP's gate/up takes it (no norm launch)
        rows = hidden_states.numel() // hidden_states.shape[-1]
        mid = self.post_attention_layernorm.weight if self.mlp.takes_prenorm(rows) else None
        h, published = self.self_attn(hidden_states, position_embeddings, paged_batch=paged_batch, kv_layer=kv_layer,
                                      input_norm=self.input_layernorm, residual=hidden_states, prenorm=prenorm,
                                      publish_norm=mid)
        return self.mlp(h, input_norm=self.post_attention_layernorm, residual=h, prenorm=published,
                        publish_norm=next_norm)

    def carries_prenorm(self, rows: int) -> bool:
        """Whether a step of ``rows`` rows carries published norms through its layers (:func:`carries_prenorm`): the
        QKV launch takes them and the MLP's down launch publishes them."""
        return carries_prenorm() and self.self_attn.takes_prenorm(rows) and self.mlp.publishes_prenorm(rows)


def validate_config(config: Qwen3Config) -> None:
    """Structural fields this preparation supports; errors name the config.json field."""
    if getattr(config, "model_type", None) != "qwen3":
        raise CheckpointError(f"config.json model_type={config.model_type!r}: the qwen3 recipe serves 'qwen3'")
    archs = getattr(config, "architectures", None) or ["Qwen3ForCausalLM"]
    if "Qwen3ForCausalLM" not in archs:
        raise CheckpointError(f"config.json architectures={archs!r}: expected Qwen3ForCausalLM")
    if any(t != "full_attention" for t in config.layer_types):
        raise CheckpointError("config.json use_sliding_window/layer_types: sliding-window layers are not supported")
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope_type not in _STATIC_ROPE:
        raise CheckpointError(f"config.json rope_parameters.rope_type={rope_type!r} is not supported "
                              f"(supported: {', '.join(_STATIC_ROPE)})")
    if config.num_attention_heads % config.num_key_value_heads:
        raise CheckpointError("config.json num_attention_heads must be a multiple of num_key_value_heads")


def _gpu_class(device) -> str:
    from conformance.gpu import detect_gpu_class

    return "cpu" if torch.device(device).type != "cuda" else detect_gpu_class()


class PreparedQwen3(nn.Module):
    """A Qwen3 causal LM prepared for paged, static-shape steps.

    ``forward(input_ids [B, T], positions [B, T], slot_mapping [B, T], block_tables [B, P],
    seq_lens [B], active_rows [B]) -> (logits fp32 [B, V], tokens int64 [B])``: logits of each row's
    last valid token (padding tokens carry ``slot_mapping = -1`` and follow the row's valid tokens);
    inactive rows give zero logits and token -1.  ``seq_lens`` counts each row's context after the step.
    """

    packed_modules_mapping = PACKED_MODULES_MAPPING
    embedding_weight_name = "model.embed_tokens.weight"  # the token-embedding table's name in a core

    def __init__(self, config: Qwen3Config, formats: dict[str, str] | None = None, *,
                 quant: Quantization = Quantization(), device="cpu", dtype=torch.bfloat16, attention_backend=None,
                 host_embedding: bool = False):
        """``host_embedding``: the token-embedding lookup happens outside the step (the step takes
        ``input_embeds [B, T, H]`` after ``active_rows``); the table is not allocated on ``device`` unless a
        tied ``lm_head`` needs it for the vocabulary projection."""
        super().__init__()
        validate_config(config)
        self.config, self.quant, self.dtype = config, quant, dtype
        formats = formats or {}
        fmt = lambda name: formats.get(name, BF16)  # noqa: E731
        attention_cls = PyTorchPagedAttention
        if isinstance(attention_backend, str):  # a registered backend by name: refused with the reason if unusable
            from ignition.components.backends import select

            attention_cls = select("attention", gpu_class=_gpu_class(device), prefer=attention_backend).load()
            attention_backend = None
        with torch.device("meta"):
            hf = Qwen3ForCausalLM(config).to(dtype)
            hd = hf.model.layers[0].self_attn.head_dim if config.num_hidden_layers else config.head_dim
            h, kv, n_h = config.hidden_size, config.num_key_value_heads * hd, config.num_attention_heads * hd
            bias, inter = config.attention_bias, config.intermediate_size
            kw = dict(dtype=dtype, block_size=quant.block_size)
            for i, layer in enumerate(hf.model.layers):
                p = f"model.layers.{i}"
                attn = layer.self_attn
                backend = attention_backend or attention_cls(
                    config.num_attention_heads, config.num_key_value_heads, hd, attn.scaling)
                qkv = PackedProjection(h, (n_h, kv, kv), [fmt(f"{p}.self_attn.{n}_proj") for n in "qkv"],
                                       bias=bias, **kw)
                o = make_projection(fmt(f"{p}.self_attn.o_proj"), n_h, h, bias=bias, **kw)
                gate_up = PackedProjection(h, (inter, inter), [fmt(f"{p}.mlp.gate_proj"), fmt(f"{p}.mlp.up_proj")],
                                           **kw)
                down = make_projection(fmt(f"{p}.mlp.down_proj"), inter, h, **kw)
                hf.model.layers[i] = PreparedQwen3DecoderLayer(
                    layer, PagedQwen3Attention(attn, qkv, o, backend),
                    PackedQwen3MLP(layer.mlp, gate_up, down, config.hidden_act))
            hf.model.norm = RMSNorm.from_canonical(hf.model.norm)
            if config.tie_word_embeddings:
                hf.lm_head = nn.Identity()  # bound to the embedding after materialization
            else:
                hf.lm_head = make_projection(fmt("lm_head"), h, config.vocab_size, **kw)
        # the step takes input_embeds; an untied table stays unallocated (meta) here
        self.takes_input_embeds = host_embedding
        embed = hf.model.embed_tokens
        if host_embedding and not config.tie_word_embeddings:
            hf.model.embed_tokens = None
        hf.to_empty(device=device)  # allocates only the surviving modules, once
        hf.model.embed_tokens = embed
        with torch.device(device):  # non-persistent inv_freq is computed at init: rebuild it for real
            hf.model.rotary_emb = type(hf.model.rotary_emb)(config=config)
        if config.tie_word_embeddings:
            hf.lm_head = UnquantizedProjection(h, config.vocab_size, tied_weight=hf.model.embed_tokens.weight)
        hf.requires_grad_(False)
        hf.eval()
        self.hf = hf
        self.kv_cache: PagedKVCache | None = None
        self.sampler: Sampler = greedy

    # -- construction ------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device="cpu", dtype=torch.bfloat16, attention_backend=None,
                        progress=None) -> "PreparedQwen3":
        path = Path(path)
        raw = json.loads((path / "config.json").read_text())
        quant = quantization_from_config(raw.get("quantization_config"))
        config = Qwen3Config.from_pretrained(path)
        reader = CheckpointReader(path)
        formats = cls.weight_formats(config, reader, quant)
        model = cls(config, formats, quant=quant, device=device, dtype=dtype, attention_backend=attention_backend)
        ignore = ["lm_head.weight"] if config.tie_word_embeddings else []  # a tied copy, if saved, is not read
        load_checkpoint(model.hf, reader, PACKED_MODULES_MAPPING, ignore=ignore, what="qwen3", progress=progress)
        return model

    @staticmethod
    def weight_formats(config: Qwen3Config, reader: CheckpointReader, quant: Quantization) -> dict[str, str]:
        """Each projection's format from its stored weight dtype under the declared quantization."""
        names = ["lm_head"]
        for i in range(config.num_hidden_layers):
            names += [f"model.layers.{i}.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
            names += [f"model.layers.{i}.mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")]
        return {n: format_for(quant, reader.dtype(f"{n}.weight"), f"{n}.weight") for n in names}

    def allocate_kv_cache(self, num_pages: int, page_size: int, max_context: int) -> PagedKVCache:
        c = self.config
        hd = self.hf.model.layers[0].self_attn.head_dim
        self.kv_cache = PagedKVCache.allocate(c.num_hidden_layers, num_pages, page_size, c.num_key_value_heads, hd,
                                              max_context=max_context, dtype=self.dtype, device=self.device)
        return self.kv_cache

    def set_sampler(self, sampler: Sampler) -> None:
        """The in-step sampling hook (``ignition.components.sampling`` plugs in here before compile)."""
        self.sampler = sampler

    @property
    def device(self) -> torch.device:
        return self.hf.model.norm.weight.device

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    # -- the prepared step -------------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                block_tables: torch.Tensor, seq_lens: torch.Tensor, active_rows: torch.Tensor,
                input_embeds: torch.Tensor | None = None):
        batch, hidden = self.body(input_ids, positions, slot_mapping, block_tables, seq_lens, active_rows,
                                  input_embeds)
        logits = self.head(hidden, batch)
        return logits, self.sampler(logits, batch.active)

    def body(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
             block_tables: torch.Tensor, seq_lens: torch.Tensor, active_rows: torch.Tensor,
             input_embeds: torch.Tensor | None = None,
             layer_fn: Callable | None = None, batch_fn: Callable | None = None) -> tuple[AttentionBatch, torch.Tensor]:
        """Embedding (or the given ``input_embeds``: rows gathered outside the step), rotary and every
        decoder layer -> ``(batch, hidden [B, T, H])``.  With ``layer_fn``
        (regional compilation: a compiled :meth:`run_layer`) each layer runs as
        ``layer_fn(layer, hidden, position_embeddings, layer_batch)`` on a one-layer view of the KV pool;
        ``batch_fn``: the attention metadata's tensors (a compiled ``attention.batch_tensors``)."""
        if self.kv_cache is None:
            raise RuntimeError("allocate_kv_cache() before running a step")
        m = self.hf.model
        batch, hidden, position_embeddings = self.step_start(input_ids, positions, slot_mapping, block_tables,
                                                             seq_lens, active_rows, input_embeds, batch_fn)
        # published norms carried from each layer's down launch to the next one's QKV (the first layer's from the
        # embeddings; the last layer publishes the final norm's, unused), where the layers take and publish them
        layers = list(m.layers)
        carry = bool(layers) and layers[0].carries_prenorm(hidden.numel() // hidden.shape[-1])
        published = published_norm(hidden, layers[0].input_layernorm, layers[0].mlp.down_proj) if carry else None
        for i, layer in enumerate(layers):
            next_norm = (layers[i + 1].input_layernorm if i + 1 < len(layers) else m.norm).weight if carry else None
            if layer_fn is None:
                out = layer(hidden, attention_mask=None, position_embeddings=position_embeddings, paged_batch=batch,
                            prenorm=published, next_norm=next_norm)
            else:
                out = layer_fn(layer, hidden, position_embeddings, self.layer_batch(batch, i), published, next_norm)
            hidden, published = out if carry else (out, None)
        return batch, hidden

    def step_start(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor, active_rows: torch.Tensor,
                   input_embeds: torch.Tensor | None = None, batch_fn: Callable | None = None):
        """The step's first launches -> ``(batch, hidden, (cos, sin))``: the attention batch (``batch_fn``: a compiled
        ``attention.batch_tensors``), the embedding (or ``input_embeds``) and the rotary.  On CUDA, where no layer's
        backend reads the ``visible`` mask and ``rotary.embed_rotary_batch_applies``, all three are one launch
        (``flare::embed_rotary_batch``; ``FLARE_FUSED_STEP_BATCH=0``: the batch by ``batch_fn`` and the embedding and
        rotary by ``flare::embed_rotary``, two launches more at a Qwen3 decode step)."""
        m, cache = self.hf.model, self.kv_cache
        needs_visible = step_needs_visible((layer.self_attn.backend for layer in m.layers), positions.shape[1])
        if (input_embeds is None and not needs_visible
                and embed_rotary_batch_applies(m.embed_tokens, m.rotary_emb, input_ids, positions, active_rows)):
            hidden, cos, sin, slots, valid, lens = embed_rotary_batch(
                input_ids, m.embed_tokens.weight, positions, m.rotary_emb.inv_freq,
                float(m.rotary_emb.attention_scaling), slot_mapping, active_rows, seq_lens, cache.sink_slot,
                block_tables.shape[1] * cache.page_size)
            batch = AttentionBatch(cache, slots, block_tables, None, valid, active_rows, lens, positions.long())
            return batch, hidden, (cos, sin)
        batch = AttentionBatch.build(cache, positions, slot_mapping, block_tables, seq_lens, active_rows,
                                     tensors_fn=batch_fn, with_visible=needs_visible)
        if input_embeds is None:  # one launch on CUDA (flare::embed_rotary)
            hidden, position_embeddings = embed_position_embeddings(m.embed_tokens, m.rotary_emb, input_ids, positions)
            return batch, hidden, position_embeddings
        # rows gathered outside the step: the rotary alone, one launch on CUDA
        return batch, input_embeds, rotary_position_embeddings(m.rotary_emb, input_embeds, positions)

    @staticmethod
    def layer_batch(batch: AttentionBatch, i: int) -> AttentionBatch:
        """``batch`` with its cache narrowed to layer ``i`` (views ``[1, pages + 1, ...]``, no copy)."""
        c = batch.cache
        return dataclasses.replace(batch, cache=PagedKVCache(c.k[i:i + 1], c.v[i:i + 1], c.page_size,
                                                             c.max_pages_per_row))

    @staticmethod
    def run_layer(layer: nn.Module, hidden: torch.Tensor, position_embeddings, layer_batch: AttentionBatch,
                  prenorm: tuple[torch.Tensor, torch.Tensor] | None = None, next_norm: torch.Tensor | None = None):
        """One canonical decoder layer on a :meth:`layer_batch` view -- the repeated region: nothing in it
        depends on the layer index, so one compiled graph per shape serves every layer (``prenorm`` /
        ``next_norm``: the published norms carried between layers, given to every layer of a step or to none)."""
        return layer(hidden, attention_mask=None, position_embeddings=position_embeddings, paged_batch=layer_batch,
                     kv_layer=0, prenorm=prenorm, next_norm=next_norm)

    def head_all(self, hidden: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        """Every position: final norm -> vocabulary projection, fp32 logits ``[B, T, V]`` (speculative
        verification); zero for inactive rows, meaningless at padding positions."""
        m = self.hf.model
        return self.hf.lm_head(m.norm(hidden)).float().masked_fill(~batch.active[:, None, None], 0.0)

    #: :meth:`head` takes ``out=`` (``graphs.catalog.head_logits``).
    head_takes_out = True

    def head(self, hidden: torch.Tensor, batch: AttentionBatch, out: torch.Tensor | None = None) -> torch.Tensor:
        """Each row's last valid token -> final norm -> vocabulary projection: fp32 logits ``[B, V]``,
        zero for inactive rows; ``out``: the step's static logits, which the head's launch may write itself (then
        returned; :func:`head_logits_block`)."""
        m = self.hf.model
        hidden = batch.last_valid(hidden)
        # per-token norm: on the kept positions only, like logits_to_keep
        return head_logits_block(hidden, self.hf.lm_head, m.norm, batch.active, out)
