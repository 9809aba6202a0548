"""ignition export -> core -> load_prepared: the loaded core decodes exactly like the checkpoint it came from,
and bad checkpoints / cores are rejected with a clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ignition.core import CoreFormatError, load_core
from ignition.graphs.catalog import GraphCatalog
from ignition.preparation import export, load_prepared
from ignition.recipes.qwen3.model import PreparedQwen3
from tiny_qwen3 import Row, prepared_greedy

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [(i * 29 + 5) % 4000 + 10 for i in range(24)]
CATALOG = GraphCatalog(decode_capacities=(1, 4), prefill_chunks=(256,))


@pytest.fixture(scope="module")
def embedded():
    from ignition.checkpoints import embedded_default_checkpoint

    return embedded_default_checkpoint()


@pytest.fixture(scope="module")
def core(embedded, tmp_path_factory):
    out = tmp_path_factory.mktemp("cores") / "embedded"
    report = export(str(embedded), str(out), decode=(1, 4), prefill=(256,), device="cpu", compile=False,
                    progress=False)
    assert report.graphs == ["decode-1x1", "decode-4x1", "prefill-1x256"]
    return out


def _greedy(model):
    model.allocate_kv_cache(num_pages=32, page_size=16, max_context=512)
    graphs = CATALOG.prepare(model)
    return prepared_greedy(graphs, Row(list(range(3, 9)), 16), PROMPT, 32, chunk=256)


def test_loaded_core_decodes_exactly_like_the_checkpoint(embedded, core):
    ref_tokens, ref_logits = _greedy(PreparedQwen3.from_pretrained(embedded))
    model, loaded = load_prepared(str(core))
    tokens, logits = _greedy(model)
    assert tokens == ref_tokens
    assert all(torch.equal(a, b) for a, b in zip(logits, ref_logits))  # same weights, same kernels: bytewise
    m = loaded.manifest
    assert list(m.graph_catalog.decode_capacities) == [1, 4] and m.recipe.name == "qwen3"
    assert loaded.frontend_spec().content_format == "string"
    assert loaded.eos_token_ids == [json.loads((embedded / "config.json").read_text())["eos_token_id"]]
    assert "{%- mark %}" in loaded.template_text()  # the annotated template travels with the core


def test_tied_embedding_is_stored_once(core):
    names = load_core(core, progress=False).tensor_names()
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_truncated_core_is_rejected(core, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(core, bad)
    shard = next((bad / "weights").glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(CoreFormatError) as err:
        load_prepared(str(bad))
    assert shard.name in str(err.value)


def test_checkpoint_missing_a_tensor_is_rejected(embedded, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "ckpt"
    shutil.copytree(embedded, bad)
    weights = load_file(bad / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(Exception) as err:
        export(str(bad), str(tmp_path / "core"), decode=(1,), prefill=(), device="cpu", compile=False, progress=False)
    assert "model.layers.1.mlp.up_proj.weight" in str(err.value)
    assert not (tmp_path / "core").exists()


def test_export_cli_reports_a_missing_checkpoint_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ignition.cli", "export", "--checkpoint", "Qwen/Qwen3-8B",
                          "--out", str(tmp_path / "c")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1 and "synth-checkpoint" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_export_cli_no_fsync_writes_the_same_core_without_a_single_fsync(embedded, core, tmp_path, monkeypatch):
    """``ignition export --no-fsync`` (a scratch core on a benchmark machine): no ``os.fsync`` call, and the same
    core -- every weight shard, the tokenizer and the template byte for byte, the same manifest but its creation
    time -- as the durable export of the same checkpoint."""
    import os

    from ignition import cli, durability

    calls, real = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or real(fd))
    out = tmp_path / "scratch"
    assert cli.main(["export", "--checkpoint", str(embedded), "--out", str(out), "--capacities", "1,4",
                     "--prefill-chunks", "256", "--device", "cpu", "--eager", "--no-fsync"]) == 0
    assert calls == [] and durability.fsync_enabled()
    files = lambda root: {p.relative_to(root).as_posix(): p.read_bytes()  # noqa: E731
                          for p in sorted(root.rglob("*")) if p.is_file() and p.name != "core.pb"}
    assert files(out) == files(core) and any(name.endswith(".safetensors") for name in files(out))
    a, b = load_core(out).manifest, load_core(core).manifest
    a.ClearField("created"), b.ClearField("created")
    a.ClearField("manifest_sha256"), b.ClearField("manifest_sha256")
    assert a == b


def test_export_refuses_an_unknown_capacity(embedded, tmp_path):
    with pytest.raises(ValueError, match="not declared"):
        export(str(embedded), str(tmp_path / "c"), decode=(3,), prefill=(), device="cpu", compile=False,
               progress=False)
