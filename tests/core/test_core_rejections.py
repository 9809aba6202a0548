"""Every bad core is rejected with a CoreFormatError that names the file and the problem."""

from __future__ import annotations

import shutil

import pytest
from core_kit import rewrite_manifest

from ignition.core import CoreFormatError, UnsupportedCoreVersion, load_core
from ignition.core import core_pb2 as pb


@pytest.fixture
def core_dir(make_core):
    return make_core()


def _reject(path, *, match, file, verify=True):
    with pytest.raises(CoreFormatError, match=match) as err:
        load_core(path, progress=False, verify_checksums=verify)
    assert err.value.path == file, err.value
    assert str(file) in str(err.value)
    return err.value


def _first_shard(core_dir):
    return core_dir / load_core(core_dir, progress=False).manifest.weights.files[0].name


def test_the_unmodified_core_loads(core_dir):
    load_core(core_dir, progress=False)


# -- core.pb ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("keep", [0, 1, 10, 0.5, -1, -33, -34, -35])
def test_truncated_manifest(core_dir, keep):
    pb_path = core_dir / "core.pb"
    data = pb_path.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else (keep if keep >= 0 else len(data) + keep)
    pb_path.write_bytes(data[:n])
    _reject(core_dir, match="truncated|corrupted", file=pb_path)


@pytest.mark.parametrize("where", [0, 5, 200, -40, -1])
def test_flipped_byte_in_manifest(core_dir, where):
    pb_path = core_dir / "core.pb"
    data = bytearray(pb_path.read_bytes())
    data[where] ^= 0x01
    pb_path.write_bytes(bytes(data))
    _reject(core_dir, match="corrupted|truncated", file=pb_path)


def test_malformed_protobuf_with_a_valid_trailer(core_dir):
    import hashlib

    pb_path = core_dir / "core.pb"
    payload = b"\x0a\xff\xff\xff\x0f"  # field 1 length-delimited with an impossible length
    pb_path.write_bytes(payload + bytes([0x7A, 32]) + hashlib.sha256(payload).digest())
    _reject(core_dir, match="malformed protobuf", file=pb_path)


def test_padded_manifest(core_dir):
    pb_path = core_dir / "core.pb"
    pb_path.write_bytes(pb_path.read_bytes() + b"\x00")
    _reject(core_dir, match="truncated or not a core manifest", file=pb_path)


def test_missing_manifest(core_dir):
    (core_dir / "core.pb").unlink()
    _reject(core_dir, match="missing", file=core_dir / "core.pb")


def test_not_a_directory(tmp_path):
    _reject(tmp_path / "nowhere", match="not a core directory", file=tmp_path / "nowhere")


# -- versions -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [2, 7, 1000])
def test_unsupported_version_is_named(core_dir, version):
    rewrite_manifest(core_dir, lambda c: setattr(c, "format_version", version))
    err = _reject(core_dir, match=rf"core format version {version} is not supported \(written by a newer exporter\)",
                  file=core_dir / "core.pb")
    assert isinstance(err, UnsupportedCoreVersion) and err.version == version


def test_missing_version(core_dir):
    rewrite_manifest(core_dir, lambda c: c.ClearField("format_version"))
    _reject(core_dir, match="format_version is missing", file=core_dir / "core.pb")


def test_retired_version_is_named(core_dir, monkeypatch):
    from ignition.core import versions

    monkeypatch.setitem(versions.RETIRED_FORMAT_VERSIONS, 9, "weights were stored transposed")
    rewrite_manifest(core_dir, lambda c: setattr(c, "format_version", 9))
    _reject(core_dir, match="version 9 is no longer supported: weights were stored transposed",
            file=core_dir / "core.pb")


# -- required fields and consistency -----------------------------------------------------------------
@pytest.mark.parametrize("path", ["geometry.hidden_size", "geometry.tie_word_embeddings", "sampling.temperature",
                                  "sampling.top_k", "kv_layout.layout", "weights.format", "recipe.name",
                                  "frontend.eos_token_ids", "graph_catalog.decode_capacities"])
def test_missing_required_field(core_dir, path):
    *parents, last = path.split(".")

    def clear(c):
        m = c
        for p in parents:
            m = getattr(m, p)
        m.ClearField(last)

    rewrite_manifest(core_dir, clear)
    _reject(core_dir, match=rf"required manifest fields missing or empty: .*{path}", file=core_dir / "core.pb")


@pytest.mark.parametrize("mutate,match", [
    (lambda c: setattr(c.weights, "format", 9), "weights.format 9"),
    (lambda c: c.weights.ClearField("block_shape"), "block_shape must be"),
    (lambda c: setattr(c.frontend, "renderer", 4), "frontend.renderer 4"),
    (lambda c: setattr(c.frontend, "content_format", "xml"), "content_format 'xml'"),
    (lambda c: setattr(c.weights.files[0], "name", "../escape.safetensors"), "not a plain relative path"),
    (lambda c: setattr(c.weights.tensors[0], "file", "weights/other.safetensors"), "not in weights.files"),
    (lambda c: setattr(c.assets[0], "sha256", "XYZ"), "64 lowercase hex"),
    (lambda c: c.sampling.ranges.add(name="bogus", lo=0.0, hi=1.0), "range for unknown parameter 'bogus'"),
    (lambda c: setattr(c.sampling, "presence_penalty", 3.0), "range for 'presence_penalty' must contain"),
    (lambda c: c.sampling.ranges.add(name="temperature", lo=1.0, hi=2.0), "must contain its default"),
])
def test_inconsistent_manifest(core_dir, mutate, match):
    rewrite_manifest(core_dir, mutate)
    _reject(core_dir, match=match, file=core_dir / "core.pb")


# -- files --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tokenizer.json", "chat_template.jinja", "weights/shard-00001.safetensors"])
def test_missing_file(core_dir, name):
    (core_dir / name).unlink()
    _reject(core_dir, match="missing: listed in core.pb", file=core_dir / name)


def test_missing_weights_directory(core_dir):
    shutil.rmtree(core_dir / "weights")
    _reject(core_dir, match="missing", file=core_dir / "weights/shard-00000.safetensors")


def test_flipped_byte_in_weights(core_dir):
    shard = _first_shard(core_dir)
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x40  # tensor data, not the header
    shard.write_bytes(bytes(data))
    _reject(core_dir, match="corrupted: SHA-256", file=shard)


def test_flipped_byte_in_weights_header(core_dir):
    shard = _first_shard(core_dir)
    data = bytearray(shard.read_bytes())
    data[20] ^= 0x20  # inside the JSON header
    shard.write_bytes(bytes(data))
    _reject(core_dir, match="safetensors header|corrupted", file=shard)


@pytest.mark.parametrize("verify", [True, False])
def test_truncated_weights(core_dir, verify):
    shard = _first_shard(core_dir)
    shard.write_bytes(shard.read_bytes()[:-5])
    _reject(core_dir, match="truncated", file=shard, verify=verify)


def test_truncated_weights_with_a_matching_manifest_size(core_dir):
    """Even if core.pb were edited to the cut size, the safetensors header exposes the truncation."""
    shard = _first_shard(core_dir)
    shard.write_bytes(shard.read_bytes()[:-5])
    name = shard.relative_to(core_dir).as_posix()

    def fix(c):
        for f in c.weights.files:
            if f.name == name:
                f.bytes -= 5

    rewrite_manifest(core_dir, fix)
    _reject(core_dir, match="truncated: tensors need", file=shard, verify=False)


def test_flipped_template_byte(core_dir):
    path = core_dir / "chat_template.jinja"
    path.write_bytes(path.read_bytes().replace(b"mark", b"mork"))
    _reject(core_dir, match="corrupted: SHA-256", file=path)


# -- safetensors headers vs the manifest --------------------------------------------------------------
def _edit_tensor(core_dir, tensor, **changes):
    def mutate(c):
        for t in c.weights.tensors:
            if t.name == tensor:
                for k, v in changes.items():
                    if k == "shape":
                        del t.shape[:]
                        t.shape.extend(v)
                    else:
                        setattr(t, k, v)
                return
        raise AssertionError(tensor)

    rewrite_manifest(core_dir, mutate)
    entries = {t.name: t for t in pb.Core.FromString((core_dir / "core.pb").read_bytes()).weights.tensors}
    return core_dir / entries[changes.get("name", tensor)].file


def test_tensor_shape_mismatch(core_dir):
    shard = _edit_tensor(core_dir, "model.layers.0.self_attn.qkv_proj.weight", shape=[16, 48])
    _reject(core_dir, match=r"'model.layers.0.self_attn.qkv_proj.weight': shape mismatch: file has \[48, 16\], "
            r"core.pb lists \[16, 48\]", file=shard)


def test_tensor_dtype_mismatch(core_dir):
    shard = _edit_tensor(core_dir, "model.norm.weight", dtype=pb.DTYPE_F16)
    _reject(core_dir, match="'model.norm.weight': file has dtype BF16, core.pb lists F16", file=shard)


def test_tensor_listed_but_not_in_its_shard(core_dir):
    shard = _edit_tensor(core_dir, "model.norm.weight", name="model.norm.bias")
    _reject(core_dir, match=r"tensors missing from the file \['model.norm.bias'\], tensors not in core.pb "
            r"\['model.norm.weight'\]", file=shard)
