"""Fixtures for core export/load tests."""

from __future__ import annotations

import json

import pytest
from core_kit import TEMPLATE, core_message, synthetic_tensors

from ignition.core import export_core


@pytest.fixture
def tokenizer_file(tmp_path):
    path = tmp_path / "src" / "tokenizer.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}}))
    return path


@pytest.fixture
def make_core(tmp_path, tokenizer_file):
    """Export the synthetic core to ``tmp_path/<name>`` (small shards, so there are several)."""

    def make(name="core", *, shard_bytes=1024, core=None, tensors=None, progress=False, **kwargs):
        return export_core(tmp_path / name, core if core is not None else core_message(), tokenizer_file, TEMPLATE,
                           iter(tensors if tensors is not None else synthetic_tensors()), shard_bytes=shard_bytes,
                           progress=progress, **kwargs)

    return make
