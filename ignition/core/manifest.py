"""Reading and writing ``core.pb``: the serialized ``Core`` followed by its own SHA-256.

The exporter serializes the manifest without ``manifest_sha256`` and appends that field by hand as the
last 34 bytes (tag ``0x7a`` = field 15, length-delimited; length ``0x20``; the SHA-256 of every preceding
byte). The result is still one ordinary ``Core`` message (``protoc --decode`` reads it), and the check
works on the raw bytes, so it does not depend on two protobuf runtimes serializing alike.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from google.protobuf.message import DecodeError

from ignition.durability import sync_file

from . import core_pb2 as pb
from .errors import CoreFormatError

MANIFEST_NAME = "core.pb"
_TRAILER_TAG = bytes([(15 << 3) | 2, 32])  # field manifest_sha256 = 15, wire type 2, 32 bytes
_TRAILER_LEN = len(_TRAILER_TAG) + 32


def encode_manifest(core: pb.Core) -> bytes:
    body = pb.Core()
    body.CopyFrom(core)
    body.ClearField("manifest_sha256")
    payload = body.SerializeToString(deterministic=True)
    return payload + _TRAILER_TAG + hashlib.sha256(payload).digest()


def write_manifest(path: Path, core: pb.Core) -> None:
    with open(path, "wb") as f:
        f.write(encode_manifest(core))
        sync_file(f)


def read_manifest(path: Path) -> pb.Core:
    """Parse ``core.pb``; a missing, truncated, padded, corrupted or malformed file raises CoreFormatError."""
    if not path.is_file():
        raise CoreFormatError("missing: a core directory holds core.pb", path)
    data = path.read_bytes()
    if len(data) < _TRAILER_LEN or data[-_TRAILER_LEN:-32] != _TRAILER_TAG:
        raise CoreFormatError(f"truncated or not a core manifest: the integrity trailer (manifest_sha256, last "
                              f"{_TRAILER_LEN} bytes) is missing ({len(data)} bytes read)", path)
    payload, digest = data[:-_TRAILER_LEN], data[-32:]
    if hashlib.sha256(payload).digest() != digest:
        raise CoreFormatError("corrupted or truncated: the SHA-256 of its contents does not match manifest_sha256",
                              path)
    try:
        return pb.Core.FromString(data)
    except DecodeError as e:
        raise CoreFormatError(f"malformed protobuf: {e}", path) from None


# -- structure ----------------------------------------------------------------------------------------
WEIGHT_FORMATS = {pb.WEIGHT_FORMAT_BF16: "BF16", pb.WEIGHT_FORMAT_FP8_BLOCK: "FP8_BLOCK"}
KV_PAGE_LAYOUTS = {pb.KV_PAGE_LAYOUT_NHD: "NHD", pb.KV_PAGE_LAYOUT_HND: "HND"}
RENDERERS = {pb.RENDERER_JINJA_TEXT: "JINJA_TEXT"}
WEIGHTS_DIR = "weights"


def _check_relative(name: str, what: str, where) -> None:
    parts = name.split("/")
    if (not name or name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts)
            or name == MANIFEST_NAME):
        raise CoreFormatError(f"{what} {name!r} is not a plain relative path inside the core", where)


def _check_sha(entry: pb.FileEntry, where) -> None:
    s = entry.sha256
    if len(s) != 64 or any(c not in "0123456789abcdef" for c in s):
        raise CoreFormatError(f"file {entry.name!r}: sha256 {s!r} is not 64 lowercase hex digits", where)


def check_structure(core: pb.Core, where=None) -> None:
    """Everything about a (migrated, current-version) manifest that needs no other file; raises CoreFormatError."""
    from .schema import CONTENT_FORMATS, DTYPES, TOOL_ARGUMENTS, frontend_from_proto, sampling_from_proto
    from .versions import check_required

    check_required(core, where)
    w, kv, fe = core.weights, core.kv_layout, core.frontend
    if w.format not in WEIGHT_FORMATS:
        raise CoreFormatError(f"weights.format {w.format} is not one this runtime serves "
                              f"({sorted(WEIGHT_FORMATS.values())})", where)
    if w.format == pb.WEIGHT_FORMAT_FP8_BLOCK and (len(w.block_shape) != 2 or 0 in w.block_shape):
        raise CoreFormatError(f"weights.block_shape must be [rows, cols] for FP8_BLOCK, got {list(w.block_shape)}",
                              where)
    if w.format != pb.WEIGHT_FORMAT_FP8_BLOCK and len(w.block_shape):
        raise CoreFormatError(f"weights.block_shape is set ({list(w.block_shape)}) for a non-block format", where)
    if kv.layout not in KV_PAGE_LAYOUTS:
        raise CoreFormatError(f"kv_layout.layout {kv.layout} is unknown", where)
    if kv.dtype not in DTYPES:
        raise CoreFormatError(f"kv_layout.dtype {kv.dtype} is unknown", where)
    if fe.renderer not in RENDERERS:
        raise CoreFormatError(f"frontend.renderer {fe.renderer} is not one this runtime has "
                              f"({sorted(RENDERERS.values())})", where)
    if fe.content_format not in CONTENT_FORMATS:
        raise CoreFormatError(f"frontend.content_format {fe.content_format!r} is not one of {CONTENT_FORMATS}", where)
    if fe.tool_arguments not in TOOL_ARGUMENTS:
        raise CoreFormatError(f"frontend.tool_arguments {fe.tool_arguments!r} is not one of {TOOL_ARGUMENTS}", where)
    try:
        frontend_from_proto(fe)
        sampling_from_proto(core.sampling)
    except CoreFormatError as e:
        raise CoreFormatError(e.detail, where) from None

    names: set[str] = set()
    for entry in list(core.assets) + list(w.files):
        _check_relative(entry.name, "file", where)
        _check_sha(entry, where)
        if entry.name in names:
            raise CoreFormatError(f"file {entry.name!r} is listed twice", where)
        names.add(entry.name)
    for entry in w.files:
        if not (entry.name.startswith(WEIGHTS_DIR + "/") and entry.name.endswith(".safetensors")):
            raise CoreFormatError(f"weights file {entry.name!r} is not weights/*.safetensors", where)
    assets = {a.name for a in core.assets}
    for what, name in (("frontend.template_file", fe.template_file), ("frontend.tokenizer_file", fe.tokenizer_file)):
        if name not in assets:
            raise CoreFormatError(f"{what} {name!r} is not listed in assets", where)
    shards = {f.name for f in w.files}
    seen: set[str] = set()
    for t in w.tensors:
        if not t.name or t.name in seen:
            raise CoreFormatError(f"tensor name {t.name!r} is empty or listed twice", where)
        seen.add(t.name)
        if t.dtype not in DTYPES:
            raise CoreFormatError(f"tensor {t.name!r}: dtype {t.dtype} is unknown", where)
        if t.file not in shards:
            raise CoreFormatError(f"tensor {t.name!r}: file {t.file!r} is not in weights.files", where)
