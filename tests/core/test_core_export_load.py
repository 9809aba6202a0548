"""Export -> load round trip, sharding, memory bound, overwrite rules and atomicity."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from safetensors import safe_open

from ignition.core import CURRENT_FORMAT_VERSION, CoreFormatError, export_core, load_core
from ignition.core import core_pb2 as pb

from core_kit import SAMPLING, SPEC, TEMPLATE, core_message, synthetic_tensors


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous().reshape(-1)
    return t.to(torch.uint8) if t.dtype == torch.bool else t.view(torch.uint8)


def test_round_trip(make_core, tokenizer_file):
    path = make_core()
    expected = synthetic_tensors()
    with load_core(path, progress=False) as core:
        assert core.format_version == CURRENT_FORMAT_VERSION
        m = core.manifest
        # what the caller declared comes back unchanged
        declared = core_message()
        for name in ("recipe", "source", "geometry", "kv_layout", "graph_catalog", "sampling"):
            assert getattr(m, name) == getattr(declared, name), name
        assert m.weights.format == pb.WEIGHT_FORMAT_FP8_BLOCK and list(m.weights.block_shape) == [128, 128]
        assert core.frontend_spec() == SPEC and core.sampling_defaults() == SAMPLING
        assert core.eos_token_ids == [3, 5]
        assert core.special_token_variables == {"bos_token": "<s>", "eos_token": "</s>"}
        assert m.created.utc.endswith("Z") and m.created.tool_version.startswith("flare")
        # files
        assert core.tokenizer_path.read_bytes() == tokenizer_file.read_bytes()
        assert core.template_text() == TEMPLATE
        assert len(m.weights.files) > 1 and all(f.name.startswith("weights/") for f in m.weights.files)
        # tensors: names in write order, dtypes, shapes and bytes
        assert core.tensor_names() == [n for n, _ in expected]
        for (name, want), (got_name, got) in zip(expected, core.iter_tensors()):
            assert got_name == name and got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(_bits(got), _bits(want)), name
        assert torch.equal(core.get_tensor("step"), torch.tensor(7))
        with pytest.raises(KeyError, match="no tensor 'nope'"):
            core.get_tensor("nope")


def test_shards_are_plain_safetensors(make_core):
    """An independent reader (safetensors.safe_open) sees exactly the manifest's tensors in each shard."""
    path = make_core()
    core = load_core(path, progress=False)
    want = dict(synthetic_tensors())
    seen = []
    for entry in core.manifest.weights.files:
        listed = [t.name for t in core.manifest.weights.tensors if t.file == entry.name]
        with safe_open(str(path / entry.name), framework="pt") as f:
            assert sorted(f.keys()) == sorted(listed)
            for name in f.keys():
                assert torch.equal(_bits(f.get_tensor(name)), _bits(want[name]))
        seen += listed
    assert sorted(seen) == sorted(want)


def test_shard_size_bounds_shards(make_core):
    path = make_core(shard_bytes=1 << 30)
    assert len(load_core(path, progress=False).manifest.weights.files) == 1
    path = make_core("one-per-tensor", shard_bytes=1)
    core = load_core(path, progress=False)
    nonempty = [t for t in synthetic_tensors()]
    assert len(core.manifest.weights.files) == len(nonempty)  # a tensor larger than a shard gets its own


def test_export_holds_at_most_one_shard_of_tensors(tmp_path, tokenizer_file):
    """The iterator is consumed lazily and written tensors are released: never 2x the weights."""
    alive: list[weakref.ref] = []
    peak = 0

    def tensors():
        nonlocal peak
        for i in range(12):
            gc.collect()
            peak = max(peak, sum(r() is not None for r in alive))
            t = torch.full((256,), i, dtype=torch.float32)  # 1 KiB each
            alive.append(weakref.ref(t))
            yield f"t{i}", t
            del t

    export_core(tmp_path / "c", core_message(), tokenizer_file, TEMPLATE, tensors(), shard_bytes=2048, progress=False)
    assert peak <= 2, f"{peak} yielded tensors alive at once with 2-tensor shards"


def test_progress_bar_runs(make_core, capsys):
    path = make_core(progress=True, total_bytes=sum(t.numel() * t.element_size() for _, t in synthetic_tensors()))
    load_core(path, progress=True)


def test_caller_message_is_not_modified(make_core):
    core = core_message()
    before = core.SerializeToString(deterministic=True)
    make_core(core=core)
    assert core.SerializeToString(deterministic=True) == before


def test_refuses_existing_core_unless_overwrite(make_core):
    path = make_core()
    first = (path / "core.pb").read_bytes()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        make_core()
    assert (path / "core.pb").read_bytes() == first
    make_core(tensors=synthetic_tensors(seed=1), overwrite=True)
    core = load_core(path, progress=False)
    assert torch.equal(core.get_tensor("rotary.inv_freq"), torch.arange(8, dtype=torch.float64))
    assert not torch.equal(core.get_tensor("model.norm.weight"), dict(synthetic_tensors())["model.norm.weight"])
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


def test_overwrite_never_replaces_a_directory_that_is_not_a_core(make_core, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not a core directory"):
        make_core("data", overwrite=True)
    assert (tmp_path / "data" / "precious.txt").read_text() == "keep"


class Boom(RuntimeError):
    pass


def _failing(after: int):
    for i, item in enumerate(synthetic_tensors()):
        if i == after:
            raise Boom("checkpoint read failed")
        yield item


def _leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("after", [0, 3, 9])
def test_failure_mid_export_leaves_no_partial_core(make_core, tmp_path, after):
    with pytest.raises(Boom):
        make_core(tensors=_failing(after), shard_bytes=64)  # several shards written before the failure
    assert not (tmp_path / "core").exists()
    assert _leftovers(tmp_path) == []


def test_failure_while_replacing_keeps_the_old_core(make_core, tmp_path):
    path = make_core()
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    with pytest.raises(Boom):
        make_core(tensors=_failing(5), overwrite=True)
    assert {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()} == before
    load_core(path, progress=False)
    assert _leftovers(tmp_path) == []


def test_invalid_manifest_is_never_exported(make_core, tmp_path):
    core = core_message()
    core.geometry.ClearField("hidden_size")
    with pytest.raises(CoreFormatError, match="geometry.hidden_size"):
        make_core(core=core)
    assert not (tmp_path / "core").exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("bad,match", [
    ([("a", torch.zeros(1)), ("a", torch.zeros(1))], "yielded twice"),
    ([("", torch.zeros(1))], "non-empty"),
    ([("c", torch.zeros(1, dtype=torch.complex64))], "no core DType"),
    ([], "no tensors"),
])
def test_bad_tensor_streams_are_rejected(make_core, tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        make_core(tensors=bad)
    assert not (tmp_path / "core").exists() and _leftovers(tmp_path) == []
