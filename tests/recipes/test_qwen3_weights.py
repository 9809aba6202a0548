"""Weight formats and checkpoint mapping for the qwen3 recipe: FP8 block projections, packing, geometry errors,
quantization_config validation.  References are independent: an explicit per-block dequantization loop and
transformers' canonical forward on the dequantized weights."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ignition.checkpoints.loading import CheckpointError
from ignition.components.projections import (
    BF16, FP8_BLOCK, BlockFP8Projection, PackedProjection, QuantizationConfigError, UnquantizedProjection,
    quantization_from_config,
)
from ignition.graphs.catalog import GraphCatalog
from ignition.recipes.qwen3.model import PreparedQwen3
from tiny_qwen3 import (
    Row, canonical_greedy, dequantize_fp8_block, logit_bound, make_checkpoint, make_model, prepared_greedy,
    quantize_fp8_block, write_fp8_checkpoint,
)


def _fp8(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-2, 0, n)[:, None]  # blocks of very different scales
    return quantize_fp8_block(w)


@pytest.mark.parametrize("n,k", [(256, 384), (200, 130)], ids=["aligned", "ragged-blocks"])
def test_fp8_block_projection_matches_dequantized_reference(n, k):
    q, s = _fp8(n, k, seed=n)
    proj = BlockFP8Projection(k, n)
    proj.load_checkpoint_tensor("weight", q)
    proj.load_checkpoint_tensor("weight_scale_inv", s)
    assert torch.equal(proj.weight.view(torch.uint8), q.view(torch.uint8))  # stored bytes untouched
    x = torch.randn(3, 5, k).to(torch.bfloat16)
    ref = F.linear(x, dequantize_fp8_block(q, s))
    assert torch.equal(proj(x), ref)
    linear = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
    linear.weight.data.copy_(dequantize_fp8_block(q, s))
    assert torch.equal(proj(x), linear(x))


def test_packed_projection_loads_each_part_into_its_slice():
    k = 64
    parts = [torch.randn(n, k).to(torch.bfloat16) for n in (64, 32, 32)]
    packed = PackedProjection(k, (64, 32, 32), BF16)
    assert packed.packed and packed.proj.weight.shape == (128, 64)
    for i, w in enumerate(parts):
        packed.load_checkpoint_tensor("weight", w, i)
    x = torch.randn(2, 3, k).to(torch.bfloat16)
    for out, w in zip(packed(x), parts):
        assert torch.equal(out, F.linear(x, w))  # same rounding as a separate nn.Linear
    with pytest.raises(ValueError, match=r"expected \[32, 64\]"):
        packed.load_checkpoint_tensor("weight", parts[0], 1)


def test_fp8_packing_only_when_scale_blocks_align():
    k = 192
    aligned = [_fp8(n, k, seed=i) for i, n in enumerate((256, 128))]
    packed = PackedProjection(k, (256, 128), FP8_BLOCK)
    assert packed.packed and packed.proj.weight_scale_inv.shape == (3, 2)
    for i, (q, s) in enumerate(aligned):
        packed.load_checkpoint_tensor("weight", q, i)
        packed.load_checkpoint_tensor("weight_scale_inv", s, i)
    x = torch.randn(4, k).to(torch.bfloat16)
    for out, (q, s) in zip(packed(x), aligned):
        assert torch.equal(out, F.linear(x, dequantize_fp8_block(q, s)))
    # 64 rows would split a scale block between parts: kept separate, scales untouched
    assert not PackedProjection(k, (128, 64), FP8_BLOCK).packed
    assert not PackedProjection(k, (128, 128), (FP8_BLOCK, BF16)).packed


def test_fp8_model_matches_canonical_on_dequantized_weights(tmp_path):
    """FP8 checkpoint (decoder projections block-quantized) vs transformers on the dequantized bf16 weights.
    Geometry with 128-aligned MLP rows (gate/up packed) and 64-row K/V (Q/K/V kept separate)."""
    model = make_model(seed=3, hidden_size=128, intermediate_size=256, head_dim=32)
    write_fp8_checkpoint(model, tmp_path / "fp8", tmp_path / "dequant")
    prompt, steps = [(i * 53 + 5) % 512 for i in range(12)], 8
    ref_tokens, ref_logits = canonical_greedy(tmp_path / "dequant", prompt, steps)
    prepared = PreparedQwen3.from_pretrained(tmp_path / "fp8")
    layer = prepared.hf.model.layers[0]
    assert layer.mlp.gate_up_proj.packed and layer.mlp.gate_up_proj.format == FP8_BLOCK
    assert not layer.self_attn.qkv_proj.packed and layer.self_attn.o_proj.format == FP8_BLOCK
    assert isinstance(prepared.hf.lm_head, UnquantizedProjection)  # stored bf16 stays bf16
    prepared.allocate_kv_cache(num_pages=8, page_size=8, max_context=32)
    graphs = GraphCatalog((1,), (16,)).prepare(prepared)
    tokens, logits = prepared_greedy(graphs, Row([3, 1, 5], 8), prompt, steps, chunk=16)
    assert tokens == ref_tokens
    bound = logit_bound(ref_logits)
    assert max(float((a - b).abs().max()) for a, b in zip(logits, ref_logits)) <= bound


@pytest.fixture()
def tiny(tmp_path):
    return make_checkpoint(tmp_path / "tiny", seed=0)


def test_checkpoint_geometry_errors_list_every_tensor(tiny):
    path = tiny / "model.safetensors"
    state = load_file(str(path))
    del state["model.layers.1.self_attn.k_proj.weight"]
    del state["model.norm.weight"]
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64, dtype=torch.bfloat16)
    state["model.layers.0.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"][:127].contiguous()
    state["model.layers.1.input_layernorm.weight"] = state["model.layers.1.input_layernorm.weight"].float()
    save_file(state, str(path))
    with pytest.raises(CheckpointError) as err:
        PreparedQwen3.from_pretrained(tiny)
    msg = str(err.value)
    assert "missing (2)" in msg and "unexpected (1)" in msg and "misshapen or mistyped (2)" in msg
    assert "model.layers.1.self_attn.k_proj.weight: expected [32, 64] bfloat16" in msg
    assert "model.norm.weight: expected [64] bfloat16" in msg
    assert "model.layers.0.self_attn.q_proj.bias: [64] bfloat16" in msg
    assert "model.layers.0.mlp.up_proj.weight: expected [128, 64] bfloat16, found [127, 64] bfloat16" in msg
    assert "model.layers.1.input_layernorm.weight: expected [64] bfloat16, found [64] float32" in msg


def test_checkpoint_without_weights_is_named(tmp_path):
    make_checkpoint(tmp_path / "t", seed=0)
    (tmp_path / "t" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="neither model.safetensors.index.json nor model.safetensors"):
        PreparedQwen3.from_pretrained(tmp_path / "t")


@pytest.mark.parametrize("qc,field", [
    ({"quant_method": "awq", "bits": 4}, "quantization_config.quant_method='awq'"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "quantization_config.weight_block_size=None"),
    ({"quant_method": "fp8", "weight_block_size": [1, 128]}, "quantization_config.weight_block_size=[1, 128]"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"},
     "quantization_config.activation_scheme='static'"),
])
def test_unknown_quantization_config_rejected(tiny, qc, field):
    config = json.loads((tiny / "config.json").read_text())
    config["quantization_config"] = qc
    (tiny / "config.json").write_text(json.dumps(config))
    with pytest.raises(QuantizationConfigError) as err:
        PreparedQwen3.from_pretrained(tiny)
    assert field in str(err.value)


def test_fp8_tensor_without_declaration_rejected(tiny):
    path = tiny / "model.safetensors"
    state = load_file(str(path))
    q, s = quantize_fp8_block(state["model.layers.0.mlp.down_proj.weight"])
    state["model.layers.0.mlp.down_proj.weight"], state["model.layers.0.mlp.down_proj.weight_scale_inv"] = q, s
    save_file(state, str(path))
    with pytest.raises(QuantizationConfigError, match="model.layers.0.mlp.down_proj.weight is stored as float8"):
        PreparedQwen3.from_pretrained(tiny)


def test_quantization_from_config_absent_is_bf16():
    assert not quantization_from_config(None).declared
    assert quantization_from_config({"quant_method": "fp8", "weight_block_size": [128, 128]}).method == "fp8"
