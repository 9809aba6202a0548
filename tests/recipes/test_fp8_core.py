"""FP8 block-scaled checkpoint -> ``ignition export`` -> core -> ``load_prepared``: the core records
FP8_BLOCK with its scale block shape, and the loaded model rebuilds each projection's format from the
stored dtypes and decodes bytewise like ``PreparedQwen3.from_pretrained`` on the checkpoint."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ignition.components.projections import FP8_BLOCK, UnquantizedProjection
from ignition.core import core_pb2 as pb
from ignition.core import load_core
from ignition.graphs.catalog import GraphCatalog
from ignition.preparation import export, load_prepared
from ignition.recipes.qwen3.model import PreparedQwen3
from tiny_qwen3 import Row, prepared_greedy, write_fp8_checkpoint

PROMPT = [(i * 31 + 7) % 4000 + 10 for i in range(20)]
CATALOG = GraphCatalog(decode_capacities=(1,), prefill_chunks=(256,))


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    """The embedded default geometry (untied, seeded weights), decoder projections block-quantized to FP8, with its
    tokenizer and provenance files so that export finds the frontend assets."""
    from ignition.checkpoints import embedded_default_checkpoint

    embedded = embedded_default_checkpoint()
    root = tmp_path_factory.mktemp("fp8")
    config = Qwen3Config.from_pretrained(embedded)
    config.tie_word_embeddings = False  # an untied bf16 lm_head next to the FP8 decoder projections
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    write_fp8_checkpoint(model, root / "fp8", root / "dequant")
    for name in ("tokenizer.json", "tokenizer_config.json", "flare-synth.json"):
        shutil.copy(embedded / name, root / "fp8" / name)
    return root / "fp8"


@pytest.fixture(scope="module")
def fp8_core(fp8_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp8-core") / "core"
    export(str(fp8_checkpoint), str(out), decode=(1,), prefill=(256,), device="cpu", compile=False, progress=False)
    return out


def _greedy(model):
    model.allocate_kv_cache(num_pages=32, page_size=16, max_context=512)
    return prepared_greedy(CATALOG.prepare(model), Row(list(range(2, 6)), 16), PROMPT, 16, chunk=256)


def test_fp8_core_round_trip_decodes_bytewise_like_the_checkpoint(fp8_checkpoint, fp8_core):
    core_dir = fp8_core
    manifest = load_core(core_dir, progress=False).manifest
    assert manifest.weights.format == pb.WEIGHT_FORMAT_FP8_BLOCK
    assert list(manifest.weights.block_shape) == [128, 128]
    dtypes = {t.name: t.dtype for t in manifest.weights.tensors}
    assert dtypes["model.layers.0.mlp.down_proj.weight"] == pb.DTYPE_F8_E4M3
    assert dtypes["model.layers.0.mlp.down_proj.weight_scale_inv"] == pb.DTYPE_F32

    ref = PreparedQwen3.from_pretrained(fp8_checkpoint)
    model, _ = load_prepared(str(core_dir))
    for a, b in zip(model.hf.model.layers, ref.hf.model.layers):  # same per-projection formats and packing
        assert a.self_attn.qkv_proj.formats == b.self_attn.qkv_proj.formats == (FP8_BLOCK,) * 3
        assert a.self_attn.qkv_proj.packed == b.self_attn.qkv_proj.packed
        assert a.mlp.gate_up_proj.packed == b.mlp.gate_up_proj.packed
        assert a.self_attn.o_proj.format == b.self_attn.o_proj.format == FP8_BLOCK
        assert a.mlp.down_proj.format == FP8_BLOCK
    layer = model.hf.model.layers[0]  # both stored layouts: gate/up packed (128-row parts), Q/K/V split (64/32)
    assert layer.mlp.gate_up_proj.packed and not layer.self_attn.qkv_proj.packed
    assert isinstance(model.hf.lm_head, UnquantizedProjection)  # the untied bf16 lm_head stays bf16
    ref_state, state = ref.hf.state_dict(), model.hf.state_dict()
    assert state.keys() == ref_state.keys()
    for name, t in ref_state.items():
        assert state[name].dtype == t.dtype and torch.equal(state[name].view(torch.uint8), t.view(torch.uint8)), name

    ref_tokens, ref_logits = _greedy(ref)
    tokens, logits = _greedy(model)
    assert tokens == ref_tokens
    assert all(torch.equal(a, b) for a, b in zip(logits, ref_logits))  # same bytes, same kernels: bytewise


def test_fp8_core_with_unsupported_block_shape_is_rejected(fp8_core, tmp_path):
    from ignition.core.manifest import read_manifest, write_manifest
    from ignition.preparation import ExportError

    core_dir = tmp_path / "core"
    shutil.copytree(fp8_core, core_dir)
    manifest = read_manifest(core_dir / "core.pb")
    del manifest.weights.block_shape[:]
    manifest.weights.block_shape.extend([64, 64])
    write_manifest(core_dir / "core.pb", manifest)
    with pytest.raises(ExportError, match=r"block_shape \[64, 64\]"):
        load_prepared(str(core_dir))
