"""``ignition synth-checkpoint``: seeded random checkpoints of real (shrunk) geometry, no downloads.

Expected names, shapes and dtypes come from transformers itself (the model built from the written
config, loaded with ``from_pretrained``), and the file format from ``safetensors.torch.save_file``:
never from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ignition import cli
from ignition.checkpoints import synth, writer
from ignition.checkpoints.synth import EMBEDDED_REPO_ID, SynthError, synthesize_checkpoint
from ignition.checkpoints.writer import TensorSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL = "Qwen/Qwen3-0.6B"  # tie_word_embeddings: true
UNTIED = "Qwen/Qwen3-8B"  # tie_word_embeddings: false
#: Shrunk Qwen3 geometry for CPU (the vocabulary stays: it must cover the copied tokenizer).
TINY = {"layers": 2, "hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2, "head_dim": 16}
TINY_FIELDS = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16}


def _needs(hub_cache, repo_id: str, filename: str = "config.json") -> str:
    from huggingface_hub import try_to_load_from_cache

    found = hub_cache and try_to_load_from_cache(repo_id, filename, cache_dir=hub_cache)
    if not isinstance(found, str):
        pytest.skip(f"{repo_id}/{filename} is not in the hub cache")
    return found


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _build(tmp, repo_id=SMALL, name="ckpt", **kw) -> Path:
    kw.setdefault("overrides", TINY)
    kw.setdefault("progress", False)
    return synthesize_checkpoint(repo_id, Path(tmp) / name, **kw)


def _load(folder: Path):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k != "error_msgs"} | (
        {"error_msgs": info["error_msgs"]} if info.get("error_msgs") else {})
    assert not problems, f"loading {folder}: {problems}"
    return model.eval()


@pytest.fixture(scope="module")
def tiny(hub_cache, tmp_path_factory) -> Path:
    """Qwen3-0.6B shrunk to TINY, seed 0, one shard."""
    _needs(hub_cache, SMALL)
    return _build(tmp_path_factory.mktemp("tiny"), hub_cache=hub_cache)


# -- file format -----------------------------------------------------------------------------------

def test_streamed_shard_is_byte_identical_to_safetensors_save_file(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "BLOCK_ELEMENTS", 100)  # several blocks per tensor, and a partial last block
    specs = [
        TensorSpec("model.b.weight", (7, 33), torch.bfloat16, "normal", 0.02),
        TensorSpec("model.a_norm.weight", (33,), torch.bfloat16, "ones", 1.0),
        TensorSpec("model.c.bias", (5,), torch.float32, "zeros", 0.0),
        TensorSpec("model.d.scale", (), torch.float32, "normal", 1.0),
        TensorSpec("model.e.weight", (3, 250), torch.float16, "normal", 0.5),
        TensorSpec("model.f.payload", (4, 9), torch.float8_e4m3fn, "normal", 50.0, clamp=448.0),
    ]
    digest = writer.write_shard(tmp_path / "streamed.safetensors", specs, seed=7, metadata={"format": "pt"},
                                workers=3)
    tensors = {
        s.name: torch.cat([writer.block_values(s, 7, b) for b in range(writer.num_blocks(s))]).reshape(s.shape)
        for s in specs
    }
    save_file(tensors, tmp_path / "reference.safetensors", metadata={"format": "pt"})
    streamed = (tmp_path / "streamed.safetensors").read_bytes()
    assert streamed == (tmp_path / "reference.safetensors").read_bytes()
    assert digest == hashlib.sha256(streamed).hexdigest()
    assert writer.write_shard(tmp_path / "serial.safetensors", specs, seed=7, metadata={"format": "pt"},
                              workers=1) == digest  # the thread count does not change the bytes


def test_apply_overrides_places_fields_and_keeps_the_rest():
    raw = {"model_type": "x", "vocab_size": 10, "text_config": {"num_hidden_layers": 4, "hidden_size": 8,
                                                                "layer_types": ["a", "a", "a", "b"]}}
    out = synth.apply_overrides(raw, {"num_hidden_layers": 6, "vocab_size": 12, "head_dim": 4, "hidden_size": None},
                                {"head_dim"}, "r/x")
    assert out == {"model_type": "x", "vocab_size": 12, "text_config": {
        "num_hidden_layers": 6, "layer_types": ["a", "a", "a", "b", "a", "a"], "head_dim": 4}}
    assert raw["text_config"]["num_hidden_layers"] == 4, "the input is not modified"
    assert synth.apply_overrides(raw, {"num_hidden_layers": 2}, set(), "r/x")["text_config"]["layer_types"] == [
        "a", "a"]
    with pytest.raises(SynthError, match="r/x: config.json has no field 'nope'"):
        synth.apply_overrides(raw, {"nope": 1}, set(), "r/x")
    with pytest.raises(SynthError, match="num_hidden_layers given twice"):
        synth.normalize_overrides({"layers": 2, "num_hidden_layers": 2})


def test_block_values_follow_the_rules():
    normal = writer.block_values(TensorSpec("w", (1000, 100), torch.float32, "normal", 0.02), 0, 0)
    assert abs(normal.std().item() - 0.02) < 0.001 and abs(normal.mean().item()) < 0.001
    assert synth.init_rule("model.layers.0.self_attn.q_norm.weight", 0.02) == ("ones", 1.0)
    assert synth.init_rule("model.layers.0.input_layernorm.weight", 0.02) == ("ones", 1.0)
    assert synth.init_rule("model.layers.0.self_attn.q_proj.bias", 0.02) == ("zeros", 0.0)
    assert synth.init_rule("model.layers.0.self_attn.q_proj.weight", 0.03) == ("normal", 0.03)
    # per-block seeds are stable across processes (sha256, not hash())
    assert writer.block_seed(0, "x", 0) == int.from_bytes(
        hashlib.sha256(b"flare-synth/1\x000\x00x\x000").digest()[:8], "little") & ((1 << 63) - 1)


# -- a real geometry, shrunk -----------------------------------------------------------------------

def test_tiny_checkpoint_loads_runs_and_tokenizes(tiny, hub_cache):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = json.loads((tiny / "config.json").read_text())
    upstream = json.loads(Path(_needs(hub_cache, SMALL)).read_text())
    assert {k: v for k, v in config.items() if k not in TINY_FIELDS} == {
        k: v for k, v in upstream.items() if k not in TINY_FIELDS}, "every other config field is kept"
    assert all(config[k] == v for k, v in TINY_FIELDS.items())
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "vocab.json", "merges.txt"):
        assert (tiny / name).read_bytes() == Path(_needs(hub_cache, SMALL, name)).read_bytes(), name

    # exactly the tensors transformers expects, with its shapes and dtypes (tied lm_head omitted)
    with torch.device("meta"):
        ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny), dtype=torch.bfloat16)
    expected = {k: (tuple(v.shape), v.dtype) for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    stored = load_file(tiny / "model.safetensors")
    assert {k: (tuple(v.shape), v.dtype) for k, v in stored.items()} == expected
    assert "lm_head.weight" not in stored
    assert torch.equal(stored["model.layers.0.self_attn.q_norm.weight"], torch.ones(16, dtype=torch.bfloat16))
    assert torch.equal(stored["model.norm.weight"], torch.ones(64, dtype=torch.bfloat16))
    std = stored["model.layers.1.mlp.down_proj.weight"].float().std().item()
    assert 0.018 < std < 0.022, std

    model = _load(tiny)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tok = AutoTokenizer.from_pretrained(tiny)
    assert len(tok) <= model.config.vocab_size
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hello there"}], tokenize=False,
                                     add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all() and 0 < logits.float().abs().max() < 50


def test_same_seed_same_bytes_other_seed_other_weights(tiny, hub_cache, tmp_path):
    again = _build(tmp_path, name="again", hub_cache=hub_cache)
    assert _files(again) == _files(tiny)
    other = _build(tmp_path, name="other", hub_cache=hub_cache, seed=1)
    a, b = _files(tiny), _files(other)
    assert a["model.safetensors"] != b["model.safetensors"]
    assert {k: v for k, v in a.items() if k not in ("model.safetensors", "flare-synth.json")} == {
        k: v for k, v in b.items() if k not in ("model.safetensors", "flare-synth.json")}


@pytest.fixture(scope="module")
def fresh_process(hub_cache, tmp_path_factory):
    """One fresh process (other hash seed, one torch thread, serial generation) builds TINY, then,
    measuring peak RSS before and after, a ~300 MB checkpoint (full hidden size, one layer)."""
    _needs(hub_cache, SMALL)
    tmp = tmp_path_factory.mktemp("fresh")
    code = f"""
import resource, torch
torch.set_num_threads(1)
from ignition.checkpoints import synthesize_checkpoint
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
synthesize_checkpoint({SMALL!r}, {str(tmp / 'tiny')!r}, overrides={TINY!r}, hub_cache={hub_cache!r},
                      progress=False, workers=1)
before = rss()
synthesize_checkpoint({SMALL!r}, {str(tmp / 'big')!r}, overrides=dict({TINY!r}, layers=1, hidden=1024),
                      hub_cache={hub_cache!r}, progress=False)
print(before, rss())
"""
    env = dict(os.environ, PYTHONHASHSEED="12345", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after = map(int, proc.stdout.split()[-2:])
    return tmp, before, after


def test_same_bytes_in_a_fresh_process_with_other_threads_and_hash_seed(tiny, fresh_process):
    assert _files(fresh_process[0] / "tiny") == _files(tiny)


def test_peak_memory_does_not_grow_with_the_checkpoint(fresh_process):
    """Resident memory after a ~300 MB synthesis stays far below the weights' size (fp32 would be 2x)."""
    tmp, before, after = fresh_process
    weights = (tmp / "big" / "model.safetensors").stat().st_size
    assert weights > 300e6
    assert after - before < weights / 2, f"peak RSS grew {(after - before) / 2**20:.0f} MiB for " \
                                         f"{weights / 2**20:.0f} MiB of weights"


def test_sharded_checkpoint_has_a_correct_index_and_the_same_tensors(tiny, hub_cache, tmp_path):
    out = _build(tmp_path, hub_cache=hub_cache, shard_size=32 * 1024)
    single = load_file(tiny / "model.safetensors")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    n = len(shards)
    assert n >= 3 and not (out / "model.safetensors").exists()
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert set(index["weight_map"]) == set(single) and set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in single.values())
    limit = 32 * 1024
    for shard in shards:
        with safe_open(out / shard, "pt") as f:
            assert f.metadata() == {"format": "pt"}
            names = set(f.keys())
            assert names == {k for k, v in index["weight_map"].items() if v == shard}
            for name in names:  # values do not depend on the shard layout
                assert torch.equal(f.get_tensor(name), single[name]), name
        data = sum(single[k].numel() * single[k].element_size() for k in names)
        assert data <= limit or len(names) == 1, f"{shard}: {data} bytes over the limit"
    _load(out)


def test_untied_embeddings_write_lm_head(hub_cache, tmp_path):
    _needs(hub_cache, UNTIED)
    out = _build(tmp_path, UNTIED, hub_cache=hub_cache)
    with safe_open(out / "model.safetensors", "pt") as f:
        assert "lm_head.weight" in f.keys()
    model = _load(out)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    # and the tied 0.6B with tying switched off by an override also gets one
    out2 = _build(tmp_path, name="untied", hub_cache=hub_cache, overrides={**TINY, "tie_word_embeddings": False})
    with safe_open(out2 / "model.safetensors", "pt") as f:
        assert "lm_head.weight" in f.keys()


# -- errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, needle", [
    ({**TINY, "kv_heads": 3}, "num_key_value_heads=3 must divide num_attention_heads=4"),
    ({**TINY, "layers": 0}, "num_hidden_layers must be a positive integer"),
    ({**TINY, "hidden": -64}, "hidden_size must be a positive integer"),
    ({**TINY, "heads": 2.5}, "num_attention_heads must be a positive integer"),
    ({**TINY, "vocab": 1000}, "vocab_size=1000 is smaller than the tokenizer's 151669 token IDs"),
    ({**TINY, "no_such_field": 1}, "config.json has no field 'no_such_field'"),
])
def test_bad_overrides_are_rejected_naming_the_field(hub_cache, tmp_path, overrides, needle):
    _needs(hub_cache, SMALL)
    with pytest.raises(SynthError, match=re.escape(needle)):
        _build(tmp_path, hub_cache=hub_cache, overrides=overrides)
    assert list(tmp_path.iterdir()) == [], "no output and no staging folder is left behind"


def test_missing_repo_or_config_is_a_clear_error(hub_cache, tmp_path, monkeypatch):
    if not hub_cache:
        pytest.skip("no hub cache")
    with pytest.raises(SynthError, match=r"no-such/model: config.json \(refs/main\) is not in the hub cache"):
        _build(tmp_path, "no-such/model", hub_cache=hub_cache)
    _needs(hub_cache, "deepseek-ai/DeepSeek-R1", "tokenizer.json")  # in the cache, but without a config.json
    with pytest.raises(SynthError, match="deepseek-ai/DeepSeek-R1: config.json"):
        _build(tmp_path, "deepseek-ai/DeepSeek-R1", hub_cache=hub_cache)
    with pytest.raises(SynthError, match="no-such/model: config.json"):
        _build(tmp_path, "no-such/model", hub_cache=tmp_path / "empty-cache")
    from ignition import hub

    monkeypatch.setattr(hub, "default_hub_cache", lambda: None)
    with pytest.raises(SynthError, match=f"{SMALL}: no hub cache found for config.json"):
        _build(tmp_path, SMALL)
    assert list(tmp_path.iterdir()) == []


def test_quantized_config_is_rejected_unless_overridden(hub_cache, tmp_path):
    _needs(hub_cache, "deepseek-ai/DeepSeek-V3")
    small = {"layers": 2, "hidden": 64, "intermediate": 64, "heads": 2, "kv_heads": 2,
             "n_routed_experts": 4, "moe_intermediate_size": 32, "first_k_dense_replace": 1, "q_lora_rank": 32,
             "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
             "n_group": 1, "topk_group": 1, "num_experts_per_tok": 2}
    with pytest.raises(SynthError, match="quantization_config.*'fp8'"):
        _build(tmp_path, "deepseek-ai/DeepSeek-V3", hub_cache=hub_cache, overrides=small)
    out = _build(tmp_path, "deepseek-ai/DeepSeek-V3", hub_cache=hub_cache,
                 overrides={**small, "quantization_config": None})
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    with safe_open(out / "model.safetensors", "pt") as f:  # per-expert tensors, as upstream stores them
        assert "model.layers.1.mlp.experts.3.down_proj.weight" in f.keys()
    _load(out)


def test_non_empty_out_needs_force(tiny, hub_cache, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SynthError, match="is not empty; pass --force"):
        _build(tmp_path, name="taken", hub_cache=hub_cache)
    assert (out / "keep.txt").read_text() == "mine"
    _build(tmp_path, name="taken", hub_cache=hub_cache, force=True)
    assert _files(out) == _files(tiny)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    (tmp_path / "empty").mkdir()  # an empty folder is fine without --force
    _build(tmp_path, name="empty", hub_cache=hub_cache)


# -- bounded memory --------------------------------------------------------------------------------

def test_writer_holds_one_block_and_one_shard_at_a_time(hub_cache, tmp_path, monkeypatch):
    """Spies: shards are written strictly one after another, each complete before the next starts,
    and a generated block is released before the next one is made (workers=1)."""
    _needs(hub_cache, SMALL)
    monkeypatch.setattr(writer, "BLOCK_ELEMENTS", 1 << 16)
    events, live = [], []
    real_write, real_block = writer.write_shard, writer.block_values

    def spy_write(path, specs, *a, **kw):
        events.append(("start", Path(path).name, [p.name for p in Path(path).parent.glob("*.safetensors")]))
        digest = real_write(path, specs, *a, **kw)
        events.append(("end", Path(path).name, Path(path).stat().st_size))
        return digest

    def spy_block(spec, seed, block):  # reference counting frees a dropped block at once (no cycles)
        alive = [r for r in live if r() is not None]
        assert not alive, f"{len(alive)} earlier block(s) still alive while generating {spec.name}[{block}]"
        values = real_block(spec, seed, block)
        assert values.numel() <= writer.BLOCK_ELEMENTS
        live.append(weakref.ref(values))
        return values

    monkeypatch.setattr(writer, "write_shard", spy_write)
    monkeypatch.setattr(writer, "block_values", spy_block)
    out = _build(tmp_path, hub_cache=hub_cache, shard_size=64 * 1024, workers=1)
    starts = [e for e in events if e[0] == "start"]
    assert len(starts) >= 2 and [e[0] for e in events] == ["start", "end"] * len(starts)
    for i, (_, name, existing) in enumerate(starts):
        assert len(existing) == i, f"{name}: shard started before the previous one was finished"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    for _, name, size in (e for e in events if e[0] == "end"):
        with safe_open(out / name, "pt") as f:
            assert set(f.keys()) == {k for k, v in index["weight_map"].items() if v == name}
        assert (out / name).stat().st_size == size
    assert len(live) > len(index["weight_map"]), "large tensors were generated in several blocks"


# -- the embedded default --------------------------------------------------------------------------

@pytest.fixture
def no_hub(tmp_path, monkeypatch):
    """No hub cache anywhere: empty HF_HUB_CACHE, and any attempt to read one fails the test."""
    from ignition import hub

    empty = tmp_path / "empty-hub"
    empty.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(empty))
    monkeypatch.delenv("FLARE_TEST_HUB_CACHE", raising=False)
    monkeypatch.setenv("FLARE_CACHE", str(tmp_path / "flare-cache"))
    hub.default_hub_cache.cache_clear()

    def forbidden(*a, **kw):
        raise AssertionError("the embedded default must not read the hub cache")

    monkeypatch.setattr(synth, "_hub_source", forbidden)
    yield tmp_path / "flare-cache"
    hub.default_hub_cache.cache_clear()


def test_embedded_default_builds_without_a_hub_cache_and_loads(no_hub, monkeypatch):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from ignition import embedded

    calls = []
    real = synth.synthesize_checkpoint
    monkeypatch.setattr(synth, "synthesize_checkpoint", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    folder = synth.embedded_default_checkpoint()
    assert folder.parent == no_hub / "checkpoints" and folder.name.startswith("embedded-default-")
    assert len(calls) == 1

    config = json.loads((folder / "config.json").read_text())
    etok = Tokenizer.from_file(str(embedded.materialize_default() / "tokenizer.json"))
    assert config["vocab_size"] == etok.get_vocab_size(with_added_tokens=True)
    assert (config["architectures"], config["model_type"], config["tie_word_embeddings"]) == (
        ["Qwen3ForCausalLM"], "qwen3", True)
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"], config["intermediate_size"]) == (64, 2, 4, 2, 16, 128)
    assert config["eos_token_id"] == etok.token_to_id("<|im_end|>")
    assert config["bos_token_id"] == config["pad_token_id"] == etok.token_to_id("<|endoftext|>")
    for name in embedded.FILES:
        assert (folder / name).read_bytes() == (embedded.materialize_default() / name).read_bytes()
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "flare-synth.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]

    model = _load(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert len(tok) == model.config.vocab_size
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()

    # cached: the second call reuses the folder; a damaged folder is rebuilt with the same bytes
    assert synth.embedded_default_checkpoint() == folder and len(calls) == 1
    good = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(good[:-2] + b"\0\0")
    assert synth.embedded_default_checkpoint() == folder and len(calls) == 2
    assert (folder / "model.safetensors").read_bytes() == good
    fresh = synth.embedded_default_checkpoint(cache=False)
    assert _files(fresh) == _files(folder)


def test_embedded_default_cli_needs_no_hub_cache(no_hub, tmp_path, capsys):
    assert cli.main(["synth-checkpoint", EMBEDDED_REPO_ID, "--out", str(tmp_path / "e"), "--quiet"]) == 0
    assert "from flare/embedded-default" in capsys.readouterr().out
    assert _files(tmp_path / "e") == _files(synth.embedded_default_checkpoint())


# -- the command line ------------------------------------------------------------------------------

def test_cli_no_fsync_writes_the_same_checkpoint_without_a_single_fsync(tiny, hub_cache, tmp_path, monkeypatch):
    """``--no-fsync`` (throwaway checkpoints on benchmark machines): the same files byte for byte, no ``os.fsync``
    call; without it every shard is fsynced; the setting is restored after the command."""
    from ignition import durability

    flags = ["--layers", "2", "--hidden", "64", "--intermediate", "128", "--heads", "4", "--kv-heads", "2",
             "--head-dim", "16", "--quiet", "--shard-size", "2MiB"]
    calls, real = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or real(fd))
    assert cli.main(["synth-checkpoint", SMALL, "--out", str(tmp_path / "durable"), "--hub-cache", hub_cache]
                    + flags) == 0
    shards = [n for n in _files(tmp_path / "durable") if n.endswith(".safetensors")]
    assert len(shards) > 1 and len(calls) >= len(shards)
    calls.clear()
    assert cli.main(["synth-checkpoint", SMALL, "--out", str(tmp_path / "scratch"), "--hub-cache", hub_cache,
                     "--no-fsync"] + flags) == 0
    assert calls == [] and durability.fsync_enabled()
    assert _files(tmp_path / "scratch") == _files(tmp_path / "durable")


def test_cli_writes_the_same_checkpoint_and_reports_errors(tiny, hub_cache, tmp_path, capsys):
    flags = ["--layers", "2", "--hidden", "64", "--intermediate", "128", "--heads", "4", "--kv-heads", "2",
             "--head-dim", "16"]
    out = tmp_path / "cli"
    assert cli.main(["synth-checkpoint", SMALL, "--out", str(out), "--hub-cache", hub_cache] + flags) == 0
    captured = capsys.readouterr()
    assert f"from {SMALL}@" in captured.out and "synth Qwen/Qwen3-0.6B" in captured.err  # summary, progress bar
    assert _files(out) == _files(tiny)

    assert cli.main(["synth-checkpoint", SMALL, "--out", str(tmp_path / "s"), "--hub-cache", hub_cache,
                     "--shard-size", "2MiB", "--quiet", "--seed", "3"] + flags) == 0
    assert (tmp_path / "s" / "model.safetensors.index.json").is_file()

    assert cli.main(["synth-checkpoint", SMALL, "--out", str(tmp_path / "bad"), "--hub-cache", hub_cache,
                     "--quiet"] + flags + ["--kv-heads", "3"]) == 2
    assert "error:" in capsys.readouterr().err
    assert cli.main(["synth-checkpoint", SMALL, "--out", str(out), "--hub-cache", hub_cache, "--quiet"] + flags) == 2
    assert "is not empty; pass --force" in capsys.readouterr().err
    assert cli.main(["synth-checkpoint", SMALL, "--out", str(tmp_path / "x"), "--set", "rope_theta"]) == 2
    assert "--set 'rope_theta': expected KEY=JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["synth-checkpoint", SMALL, "--out", str(tmp_path / "x"), "--shard-size", "lots"])
