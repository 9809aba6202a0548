"""Streaming safetensors shards: write tensor by tensor while hashing, and read headers strictly.

The writer emits the standard safetensors layout (8-byte little-endian header length, a JSON header padded
with spaces to a multiple of 8, then the tensors' bytes back to back in header order), so
``safetensors.safe_open`` reads the shards. Writing it here rather than through ``safetensors.torch.save_file``
lets the export hash each shard while it is written (no second read of gigabytes) and never makes a byte copy
of a whole shard: a shard holds references to its tensors until it is flushed, one tensor is moved to the
CPU at a time.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ignition.durability import sync_file

from . import core_pb2 as pb
from .errors import CoreFormatError
from .schema import DTYPES, SAFETENSORS_DTYPES, torch_dtype_to_proto

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the limit safetensors itself enforces


@dataclass(frozen=True)
class HeaderTensor:
    name: str
    dtype: str  # safetensors name, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int
    end: int


def progress_bar(total: int | None, desc: str, enabled: bool):
    """A byte-counting tqdm bar (disabled when ``enabled`` is false)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not enabled,
                leave=False)


def _tensor_bytes(tensor) -> memoryview:
    import torch

    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)  # same 1-byte 0/1 encoding safetensors uses for BOOL
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def write_shard(path: Path, tensors: list[tuple[str, Any]], progress=None) -> pb.FileEntry:
    """Write ``tensors`` (name, torch tensor) to ``path``; returns its FileEntry (name = file name)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    entries = []
    for name, t in tensors:
        dtype = torch_dtype_to_proto(t.dtype)
        nbytes = t.numel() * DTYPES[dtype][1]
        header[name] = {"dtype": DTYPES[dtype][0], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        entries.append((name, t, nbytes))
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for chunk in (struct.pack("<Q", len(blob)), blob):
            f.write(chunk)
            digest.update(chunk)
        for name, t, nbytes in entries:
            if nbytes:
                data = _tensor_bytes(t)
                if len(data) != nbytes:
                    raise AssertionError(f"{name}: {len(data)} bytes, expected {nbytes}")
                f.write(data)
                digest.update(data)
                del data
            if progress is not None:
                progress.update(nbytes)
        sync_file(f)
    return pb.FileEntry(name=path.name, sha256=digest.hexdigest(), bytes=8 + len(blob) + offset)


def read_header(path: Path, display: str | None = None) -> dict[str, HeaderTensor]:
    """Parse and check a safetensors header against the file's size; raises CoreFormatError naming the file."""
    where = display or path
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CoreFormatError(f"truncated safetensors file ({size} bytes, no header length)", where)
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise CoreFormatError(f"truncated or corrupt safetensors header (declares {n} header bytes, file has "
                                  f"{size})", where)
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CoreFormatError(f"corrupt safetensors header: {e}", where) from None
    if not isinstance(header, dict):
        raise CoreFormatError("corrupt safetensors header: not a JSON object", where)
    out: dict[str, HeaderTensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CoreFormatError(f"corrupt safetensors header entry for tensor {name!r}", where) from None
        if dtype not in SAFETENSORS_DTYPES:
            raise CoreFormatError(f"tensor {name!r} has unsupported dtype {dtype!r}", where)
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * DTYPES[SAFETENSORS_DTYPES[dtype]][1] or begin < 0:
            raise CoreFormatError(f"tensor {name!r}: data_offsets {[begin, end]} do not match {dtype} {list(shape)}",
                                  where)
        out[name] = HeaderTensor(name, dtype, shape, begin, end)
    data_len = size - 8 - n
    cursor = 0
    for t in sorted(out.values(), key=lambda t: t.begin):
        if t.begin != cursor:
            raise CoreFormatError(f"tensor {t.name!r} starts at {t.begin}, expected {cursor} (overlap or gap)", where)
        cursor = t.end
    if cursor != data_len:
        state = "truncated" if cursor > data_len else "has trailing bytes"
        raise CoreFormatError(f"{state}: tensors need {cursor} data bytes, file holds {data_len}", where)
    return out
