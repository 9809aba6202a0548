"""Helpers for the core tests: a tiny synthetic core (seeded tensors, template, manifest)."""

from __future__ import annotations

import torch

from ignition.core import core_pb2 as pb
from ignition.core import frontend_to_proto, sampling_to_proto
from ignition.core.manifest import read_manifest, write_manifest
from ignition.recipes.base import FrontendSpec, SamplingDefaults

SPEC = FrontendSpec(content_format="blocks", thinking_kwarg="enable_thinking", default_thinking=False,
                    image_token="<|image|>", reasoning_field="reasoning", text_joiner="", tool_arguments="json",
                    assistant_null_content=True)
SAMPLING = SamplingDefaults(
    values={"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "repetition_penalty": 1.0},
    ranges={"presence_penalty": (0.0, 2.0), "top_k": (1, 40)},
    citation="test card: temperature 0.6",
)
TEMPLATE = "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}{% mark %}\n{%- endfor %}é🚀\n"


def synthetic_tensors(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    return [
        ("model.embed_tokens.weight", r(32, 16).to(torch.bfloat16)),
        ("model.layers.0.self_attn.qkv_proj.weight", r(48, 16).to(torch.bfloat16)),
        ("model.layers.0.mlp.gate_up_proj.weight", r(64, 16).to(torch.float8_e4m3fn)),
        ("model.layers.0.mlp.gate_up_proj.weight_scale_inv", r(1, 1).abs().float()),
        ("model.layers.0.input_layernorm.weight", r(16).float()),
        ("model.norm.weight", r(16).to(torch.bfloat16)),
        ("rotary.inv_freq", torch.arange(8, dtype=torch.float64)),
        ("step", torch.tensor(7, dtype=torch.int64)),  # 0-dim
        ("mask", torch.tensor([True, False, True])),
        ("empty", torch.zeros(0, 4, dtype=torch.int32)),
        ("lm_head.weight", r(32, 16).to(torch.bfloat16)),
    ]


def core_message(spec: FrontendSpec = SPEC, sampling: SamplingDefaults = SAMPLING) -> pb.Core:
    core = pb.Core()
    core.recipe.name, core.recipe.version = "qwen3", "1"
    core.source.repo_id, core.source.revision = "Qwen/Qwen3-0.6B", "c1899de289a04d12100db370d81485cdf75e47ca"
    core.source.checkpoint_files.add(name="model.safetensors", sha256="ab" * 32, bytes=123)
    g = core.geometry
    g.architecture, g.vocab_size, g.hidden_size, g.num_layers = "Qwen3ForCausalLM", 32, 16, 1
    g.num_attention_heads, g.num_kv_heads, g.head_dim, g.intermediate_size = 2, 1, 8, 32
    g.max_position_embeddings, g.rope_theta, g.rms_norm_eps, g.tie_word_embeddings = 128, 1e6, 1e-6, False
    core.weights.format = pb.WEIGHT_FORMAT_FP8_BLOCK
    core.weights.block_shape.extend([128, 128])
    core.kv_layout.page_size, core.kv_layout.dtype, core.kv_layout.layout = 16, pb.DTYPE_BF16, pb.KV_PAGE_LAYOUT_NHD
    core.graph_catalog.decode_capacities.extend([1, 2, 4])
    core.graph_catalog.prefill_chunk_sizes.extend([256, 1024])
    core.frontend.CopyFrom(frontend_to_proto(spec, eos_token_ids=[3, 5],
                                             special_token_variables={"bos_token": "<s>", "eos_token": "</s>"}))
    core.sampling.CopyFrom(sampling_to_proto(sampling))
    return core



def rewrite_manifest(core_dir, mutate) -> None:
    """Edit a core's manifest and write it back with a valid integrity trailer."""
    path = core_dir / "core.pb"
    core = read_manifest(path)
    mutate(core)
    write_manifest(path, core)
