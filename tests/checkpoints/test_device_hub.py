"""``scripts/device_hub.py``: the hub files a device call carries -- the snapshot layout, links resolved, the slow
tokenizer's files left out -- and, on the real hub cache, a trimmed copy that tokenizes as the full one does."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("device_hub", ROOT / "scripts" / "device_hub.py")
device_hub = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_hub)


def _fake_hub(root: Path, repo: str, files: dict[str, str]) -> None:
    """A hub cache entry as huggingface_hub lays it out: blobs, a snapshot of links to them, refs/main."""
    folder = root / ("models--" + repo.replace("/", "--"))
    (folder / "blobs").mkdir(parents=True)
    snap = folder / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("abc123")
    for i, (name, text) in enumerate(files.items()):
        (folder / "blobs" / f"blob{i}").write_text(text)
        os.symlink(f"../../blobs/blob{i}", snap / name)


def test_copies_what_the_export_reads_without_the_slow_tokenizer_files(tmp_path):
    files = {"config.json": "{}", "tokenizer.json": "T" * 100, "tokenizer_config.json": "{}", "vocab.json": "V",
             "merges.txt": "M", "generation_config.json": "{}", "model.safetensors": "W" * 1000}
    _fake_hub(tmp_path / "cache", "Org/Model", files)
    size = device_hub.copy_model("Org/Model", tmp_path / "cache", tmp_path / "out")
    snap = tmp_path / "out" / "models--Org--Model" / "snapshots" / "abc123"
    assert sorted(p.name for p in snap.iterdir()) == ["config.json", "generation_config.json", "tokenizer.json",
                                                       "tokenizer_config.json"]
    assert not any(p.is_symlink() for p in snap.iterdir()) and (snap / "tokenizer.json").read_text() == "T" * 100
    assert (tmp_path / "out" / "models--Org--Model" / "refs" / "main").read_text() == "abc123"
    assert size == 2 + 100 + 2 + 2  # config, tokenizer, tokenizer_config, generation_config
    with pytest.raises(SystemExit, match="Org/Missing"):
        device_hub.copy_model("Org/Missing", tmp_path / "cache", tmp_path / "out")


def test_the_trimmed_qwen3_hub_tokenizes_as_the_full_one(tmp_path, hub_cache, monkeypatch):
    if not hub_cache or not (Path(hub_cache) / "models--Qwen--Qwen3-0.6B").is_dir():
        pytest.skip("no Qwen/Qwen3-0.6B in the hub cache")
    from transformers import AutoTokenizer

    device_hub.copy_model("Qwen/Qwen3-0.6B", Path(hub_cache), tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    full = AutoTokenizer.from_pretrained("Qwen/Qwen3-0.6B", cache_dir=hub_cache)
    trimmed = AutoTokenizer.from_pretrained("Qwen/Qwen3-0.6B", cache_dir=str(tmp_path))
    text = "Flare serves Qwen3: déjà vu, 東京, <think> tokens </think> and emoji 🚀 at 4.14 TB/s."
    assert trimmed(text)["input_ids"] == full(text)["input_ids"]
    chat = [{"role": "user", "content": text}]
    assert trimmed.apply_chat_template(chat, tokenize=False) == full.apply_chat_template(chat, tokenize=False)
