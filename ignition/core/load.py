"""Loading a core: validate everything, then give lazy access to its files and tensors.

:func:`load_core` checks, in this order, and raises :class:`CoreFormatError` naming the file at fault:

1. ``core.pb`` is present, complete (its SHA-256 trailer matches) and parses;
2. ``format_version`` is supported; the manifest is migrated to current semantics (``versions.py``);
3. required fields are present and the manifest is consistent (``manifest.check_structure``);
4. every listed file exists with the listed size;
5. every shard's safetensors header is intact and lists exactly the manifest's tensors for that shard,
   with the same dtypes and shapes;
6. every listed file's SHA-256 matches (``verify_checksums=True``, the default; hashed in parallel).

Tensors are read only on request, through ``safetensors.safe_open`` (memory-mapped).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ignition.recipes.base import FrontendSpec, SamplingDefaults

from . import core_pb2 as pb
from .errors import CoreFormatError
from .manifest import MANIFEST_NAME, check_structure, read_manifest
from .schema import dtype_name, frontend_from_proto, proto_to_torch_dtype, sampling_from_proto
from .shards import progress_bar, read_header
from .versions import migrate


@dataclass
class LoadedCore:
    path: Path
    manifest: pb.Core  # migrated to the current format version
    format_version: int  # the version the core was written with
    files: dict[str, Path]  # every listed file (assets and shards) -> its path
    _handles: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)
    _entries: dict[str, pb.TensorEntry] | None = field(default=None, repr=False)

    # -- frontend -------------------------------------------------------------------------------------
    @property
    def tokenizer_path(self) -> Path:
        return self.files[self.manifest.frontend.tokenizer_file]

    @property
    def template_path(self) -> Path:
        return self.files[self.manifest.frontend.template_file]

    def template_text(self) -> str:
        return self.template_path.read_text(encoding="utf-8")

    def frontend_spec(self) -> FrontendSpec:
        return frontend_from_proto(self.manifest.frontend)

    def sampling_defaults(self) -> SamplingDefaults:
        return sampling_from_proto(self.manifest.sampling)

    @property
    def special_token_variables(self) -> dict[str, str]:
        return dict(self.manifest.frontend.special_token_variables)

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self.manifest.frontend.eos_token_ids)

    # -- weights --------------------------------------------------------------------------------------
    @property
    def tensor_entries(self) -> dict[str, pb.TensorEntry]:
        if self._entries is None:
            self._entries = {t.name: t for t in self.manifest.weights.tensors}
        return self._entries

    def tensor_names(self) -> list[str]:
        return [t.name for t in self.manifest.weights.tensors]

    def _handle(self, file: str, device: str):
        from safetensors import safe_open

        key = (file, device)
        if key not in self._handles:
            self._handles[key] = safe_open(str(self.files[file]), framework="pt", device=device)
        return self._handles[key]

    def get_tensor(self, name: str, device: str = "cpu"):
        entry = self.tensor_entries.get(name)
        if entry is None:
            raise KeyError(f"core {self.path} has no tensor {name!r}")
        return self._handle(entry.file, device).get_tensor(name)

    def map_tensor(self, name: str):
        """A CPU tensor over a private (copy-on-write) memory map of the shard: pages are read from disk
        only when touched (rows gathered from an embedding table), nothing is loaded up front."""
        import numpy as np
        import torch

        entry = self.tensor_entries.get(name)
        if entry is None:
            raise KeyError(f"core {self.path} has no tensor {name!r}")
        path = self.files[entry.file]
        header = read_header(path)
        start = path.stat().st_size - max(t.end for t in header.values())  # data follow the header
        t = header[name]
        raw = np.memmap(path, dtype=np.uint8, mode="c", offset=start + t.begin, shape=(t.end - t.begin,))
        return torch.from_numpy(raw).view(proto_to_torch_dtype(entry.dtype)).view(tuple(entry.shape))

    def iter_tensors(self, device: str = "cpu") -> Iterator[tuple[str, Any]]:
        """(name, tensor) in write order, one shard handle at a time."""
        for t in self.manifest.weights.tensors:
            yield t.name, self._handle(t.file, device).get_tensor(t.name)

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> "LoadedCore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _sha256_file(path: Path, bar) -> str:
    digest = hashlib.sha256()
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            digest.update(view[:n])
            if bar is not None:
                bar.update(n)
    return digest.hexdigest()


def _check_shard(core: Path, entry: pb.FileEntry, expected: list[pb.TensorEntry]) -> None:
    where = core / entry.name
    header = read_header(where)
    listed = {t.name: t for t in expected}
    missing = [n for n in listed if n not in header]
    extra = [n for n in header if n not in listed]
    if missing or extra:
        raise CoreFormatError(f"safetensors header does not match core.pb: tensors missing from the file "
                              f"{missing[:5]}, tensors not in core.pb {extra[:5]}", where)
    for name, t in listed.items():
        h = header[name]
        if dtype_name(t.dtype) != h.dtype:
            raise CoreFormatError(f"tensor {name!r}: file has dtype {h.dtype}, core.pb lists {dtype_name(t.dtype)}",
                                  where)
        if tuple(t.shape) != h.shape:
            raise CoreFormatError(f"tensor {name!r}: shape mismatch: file has {list(h.shape)}, core.pb lists "
                                  f"{list(t.shape)}", where)


def load_core(path: str | os.PathLike, *, verify_checksums: bool = True, progress: bool = True,
              workers: int | None = None) -> LoadedCore:
    """Validate the core at ``path`` and return it (see the module docstring for what is checked)."""
    root = Path(path).absolute()
    if not root.is_dir():
        raise CoreFormatError("not a core directory (missing or not a directory)", root)
    manifest_path = root / MANIFEST_NAME
    manifest = read_manifest(manifest_path)
    written = migrate(manifest, path=manifest_path)
    check_structure(manifest, manifest_path)

    entries = list(manifest.assets) + list(manifest.weights.files)
    files: dict[str, Path] = {}
    for entry in entries:
        p = root / entry.name
        if not p.is_file():
            raise CoreFormatError("missing: listed in core.pb but not present", p)
        size = p.stat().st_size
        if size != entry.bytes:
            state = "truncated" if size < entry.bytes else "wrong size"
            raise CoreFormatError(f"{state}: {size} bytes, core.pb lists {entry.bytes}", p)
        files[entry.name] = p

    by_file: dict[str, list[pb.TensorEntry]] = {f.name: [] for f in manifest.weights.files}
    for t in manifest.weights.tensors:
        by_file[t.file].append(t)
    for entry in manifest.weights.files:
        _check_shard(root, entry, by_file[entry.name])

    if verify_checksums:
        total = sum(e.bytes for e in entries)
        n = workers or min(len(entries), os.cpu_count() or 1, 8)
        with progress_bar(total, f"verify {root.name}", progress) as bar, ThreadPoolExecutor(max(n, 1)) as pool:
            digests = list(pool.map(lambda e: _sha256_file(files[e.name], bar), entries))
        for entry, digest in zip(entries, digests):
            if digest != entry.sha256:
                raise CoreFormatError(f"corrupted: SHA-256 {digest} does not match core.pb's {entry.sha256}",
                                      files[entry.name])
    return LoadedCore(path=root, manifest=manifest, format_version=written, files=files)
