"""Reading safetensors checkpoints lazily and loading them into prepared (packed) models.

``CheckpointReader`` parses only the shard headers when opened (names, dtypes, shapes); tensor data is
read when asked for, shard by shard.  ``load_checkpoint`` maps Hugging Face tensor names onto the
model's parameters through a declarative ``packed_modules_mapping`` (``{"q_proj": ("qkv_proj", 0), ...}``),
validates the whole geometry before copying a byte, and streams every tensor into its final storage
once (packed projections copy each part into its slice: no conversion pass, no model copy).

The expected tensors come from the model itself: modules with ``checkpoint_tensors()`` (projections,
packed projections) declare theirs; every other module contributes its direct parameters and
persistent buffers under its own name.
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import torch
from torch import nn

SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
    "BOOL": torch.bool,
}
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that cannot be served; the message names the file, tensor or field."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]


def _read_header(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
    header.pop("__metadata__", None)
    return header


class CheckpointReader:
    """Lazy view of a checkpoint directory (``model.safetensors.index.json`` or ``model.safetensors``)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index = self.path / INDEX_NAME
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        elif (self.path / SINGLE_NAME).is_file():
            weight_map, files = None, [SINGLE_NAME]
        else:
            raise CheckpointError(f"{self.path}: neither {INDEX_NAME} nor {SINGLE_NAME} found")
        self.tensors: dict[str, TensorInfo] = {}
        for fname in files:
            fpath = self.path / fname
            for name, meta in _read_header(fpath).items():
                if meta["dtype"] not in SAFETENSORS_DTYPES:
                    raise CheckpointError(f"{fpath}: tensor {name} has unsupported dtype {meta['dtype']}")
                self.tensors[name] = TensorInfo(name, fpath, SAFETENSORS_DTYPES[meta["dtype"]], tuple(meta["shape"]))
        if weight_map is not None:
            bad = sorted(n for n, f in weight_map.items() if n not in self.tensors or self.tensors[n].file.name != f)
            if bad:
                raise CheckpointError(
                    f"{index}: weight_map names tensors its shards do not hold: {', '.join(bad[:20])}")

    def names(self) -> list[str]:
        return list(self.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo | None:
        return self.tensors.get(name)

    def dtype(self, name: str) -> torch.dtype | None:
        info = self.tensors.get(name)
        return info.dtype if info else None

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        info = self.tensors[name]
        with safe_open(str(info.file), framework="pt") as f:
            return f.get_tensor(name)

    def iter_tensors(self, names: Iterable[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """Tensors shard by shard (each shard opened once), in each shard's stored order."""
        from safetensors import safe_open

        by_file: dict[Path, list[str]] = defaultdict(list)
        for name in names:
            by_file[self.tensors[name].file].append(name)
        for fpath, group in by_file.items():
            with safe_open(str(fpath), framework="pt") as f:
                for name in group:
                    yield name, f.get_tensor(name)


@dataclass(frozen=True)
class Expected:
    """One checkpoint tensor the model needs: where it goes and what it must look like."""

    name: str
    module: nn.Module
    suffix: str
    shard: int | None
    shape: tuple[int, ...]
    dtype: torch.dtype


def expected_tensors(model: nn.Module, packed_modules_mapping: Mapping[str, tuple[str, int]],
                     prefix: str = "") -> dict[str, Expected]:
    """The checkpoint names the model expects, with target module, shard, shape and dtype."""
    inverse = {(packed, shard): leaf for leaf, (packed, shard) in packed_modules_mapping.items()}
    out: dict[str, Expected] = {}
    owned: list[str] = []  # subtrees whose tensors a checkpoint_tensors() module declared
    for path, module in model.named_modules(prefix=prefix.rstrip(".")):
        if any(path == p or path.startswith(p + ".") for p in owned):
            continue
        if hasattr(module, "checkpoint_tensors"):
            owned.append(path)
            for (suffix, shard), (shape, dtype) in module.checkpoint_tensors().items():
                if shard is None:
                    name = f"{path}.{suffix}"
                else:
                    parent, _, leaf = path.rpartition(".")
                    if (leaf, shard) not in inverse:
                        raise KeyError(f"packed_modules_mapping has no entry for ({leaf!r}, {shard}) of {path}")
                    name = f"{parent + '.' if parent else ''}{inverse[(leaf, shard)]}.{suffix}"
                out[name] = Expected(name, module, suffix, shard, tuple(shape), dtype)
            continue
        tensors = list(module.named_parameters(recurse=False))
        tensors += [(n, b) for n, b in module.named_buffers(recurse=False)
                    if n not in module._non_persistent_buffers_set]
        for suffix, t in tensors:
            name = f"{path + '.' if path else ''}{suffix}"
            out[name] = Expected(name, module, suffix, None, tuple(t.shape), t.dtype)
    return out


def _fmt(shape, dtype) -> str:
    return f"[{', '.join(map(str, shape))}] {str(dtype).removeprefix('torch.')}"


def validate_geometry(reader: CheckpointReader, expected: Mapping[str, Expected],
                      ignore: Iterable[str] = (), what: str = "model") -> None:
    """One error listing every missing, unexpected and misshapen (or mistyped) tensor."""
    ignore = set(ignore)
    missing = sorted(n for n in expected if n not in reader)
    unexpected = sorted(n for n in reader.names() if n not in expected and n not in ignore)
    wrong = sorted(n for n in expected if n in reader
                   and (reader.tensors[n].shape, reader.tensors[n].dtype) != (expected[n].shape, expected[n].dtype))
    if not (missing or unexpected or wrong):
        return
    lines = [f"checkpoint {reader.path} does not match the {what} geometry:"]
    if missing:
        lines.append(f"  missing ({len(missing)}):")
        lines += [f"    {n}: expected {_fmt(expected[n].shape, expected[n].dtype)}" for n in missing]
    if unexpected:
        lines.append(f"  unexpected ({len(unexpected)}):")
        lines += [f"    {n}: {_fmt(reader.tensors[n].shape, reader.tensors[n].dtype)}" for n in unexpected]
    if wrong:
        lines.append(f"  misshapen or mistyped ({len(wrong)}):")
        lines += [f"    {n}: expected {_fmt(expected[n].shape, expected[n].dtype)}, "
                  f"found {_fmt(reader.tensors[n].shape, reader.tensors[n].dtype)}" for n in wrong]
    raise CheckpointError("\n".join(lines))


def load_checkpoint(model: nn.Module, reader: CheckpointReader,
                    packed_modules_mapping: Mapping[str, tuple[str, int]], *,
                    ignore: Iterable[str] = (), what: str = "model", progress=None) -> int:
    """Validate, then copy every checkpoint tensor once into the model's storage. Returns bytes read."""
    expected = expected_tensors(model, packed_modules_mapping)
    validate_geometry(reader, expected, ignore, what)
    nbytes = 0
    with torch.no_grad():
        for name, tensor in reader.iter_tensors([n for n in reader.names() if n in expected]):
            e = expected[name]
            if hasattr(e.module, "load_checkpoint_tensor"):
                e.module.load_checkpoint_tensor(e.suffix, tensor, e.shard)
            else:
                getattr(e.module, e.suffix).data.copy_(tensor)
            nbytes += tensor.numel() * tensor.element_size()
            if progress is not None:
                progress(name, nbytes)
    return nbytes
