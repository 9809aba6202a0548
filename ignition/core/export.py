"""Writing a core directory atomically.

Everything is written into a hidden sibling ``.<name>.partial-<pid>-<random>`` of the destination, each
file fsync'ed (unless within ``ignition.durability.without_fsync``), the manifest written last and checked with the
loader's own structural checks; then the directory is renamed into place (same file system, so the rename is
atomic). A failure at any point removes the partial directory, so the destination either does not exist or is a
complete core. Replacing an
existing core (``overwrite=True``) moves the old one aside, renames the new one in and then deletes the
old one; only a directory holding ``core.pb`` (or an empty one) is ever replaced.

A process killed outright (SIGKILL, power loss) can leave a ``.<name>.partial-*`` sibling behind; it is
never mistaken for a core (the loader is only ever given the destination) and can be deleted.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from ignition.durability import sync_dir, sync_file

from . import core_pb2 as pb
from .manifest import MANIFEST_NAME, WEIGHTS_DIR, check_structure, write_manifest
from .schema import DTYPES, torch_dtype_to_proto
from .shards import progress_bar, write_shard
from .versions import CURRENT_FORMAT_VERSION

DEFAULT_SHARD_BYTES = 2 << 30  # 2 GiB: an 8B bf16 core is 8 shards; the writer holds at most one shard
TOKENIZER_FILE = "tokenizer.json"
TEMPLATE_FILE = "chat_template.jinja"


def tool_version() -> str:
    from importlib import metadata

    try:
        return f"flare {metadata.version('flare')}"
    except metadata.PackageNotFoundError:
        return "flare (source tree)"


def _copy_hashed(src: Path, dst: Path) -> pb.FileEntry:
    digest, size = hashlib.sha256(), 0
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(8 << 20):
            fout.write(chunk)
            digest.update(chunk)
            size += len(chunk)
        sync_file(fout)
    return pb.FileEntry(sha256=digest.hexdigest(), bytes=size)


def _write_text(path: Path, text: str) -> pb.FileEntry:
    data = text.encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
        sync_file(f)
    return pb.FileEntry(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))


def _write_weights(tmp: Path, manifest: pb.Core, tensors: Iterable[tuple[str, Any]], shard_bytes: int,
                   bar) -> None:
    wdir = tmp / WEIGHTS_DIR
    wdir.mkdir()
    seen: set[str] = set()
    pending: list[tuple[str, Any]] = []
    pending_bytes = 0

    def flush():
        nonlocal pending, pending_bytes
        name = f"{WEIGHTS_DIR}/shard-{len(manifest.weights.files):05d}.safetensors"
        entry = write_shard(tmp / name, pending, progress=bar)
        entry.name = name
        manifest.weights.files.append(entry)
        for tname, t in pending:
            manifest.weights.tensors.add(name=tname, dtype=torch_dtype_to_proto(t.dtype), shape=list(t.shape),
                                         file=name)
        pending, pending_bytes = [], 0

    for name, t in tensors:
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor names must be non-empty strings, got {name!r}")
        if name in seen:
            raise ValueError(f"tensor {name!r} is yielded twice")
        seen.add(name)
        nbytes = t.numel() * DTYPES[torch_dtype_to_proto(t.dtype)][1]
        if pending and pending_bytes + nbytes > shard_bytes:
            flush()
        pending.append((name, t))
        pending_bytes += nbytes
    if pending:
        flush()
    if not manifest.weights.files:
        raise ValueError("no tensors to export")
    sync_dir(wdir)


def export_core(out_dir: str | os.PathLike, core: pb.Core, tokenizer_path: str | os.PathLike, annotated_template: str,
                tensors: Iterable[tuple[str, Any]], *, shard_bytes: int = DEFAULT_SHARD_BYTES,
                overwrite: bool = False, progress: bool = True, total_bytes: int | None = None) -> Path:
    """Write a core to ``out_dir`` atomically and return its path.

    ``core`` carries what the recipe knows (recipe, source, geometry, ``weights.format`` and ``block_shape``,
    kv_layout, graph_catalog, frontend, sampling); this function fills ``format_version``, the file names,
    ``assets``, ``weights.files`` / ``weights.tensors``, ``created`` and the integrity trailer, and leaves
    the caller's message untouched. ``tensors`` is consumed once, shard by shard (at most ``shard_bytes`` of
    tensors are referenced at a time; a larger tensor gets a shard of its own); ``total_bytes``, if known,
    sizes the progress bar. Refuses an existing ``out_dir`` unless ``overwrite``.
    """
    if shard_bytes <= 0:
        raise ValueError("shard_bytes must be positive")
    out = Path(out_dir).absolute()
    tokenizer_path = Path(tokenizer_path)
    if not tokenizer_path.is_file():
        raise FileNotFoundError(f"tokenizer {tokenizer_path} not found")

    def check_destination():
        if out.is_symlink() or out.exists():
            if not overwrite:
                raise FileExistsError(f"{out} exists; pass overwrite=True to replace the core there")
            if not out.is_dir() or out.is_symlink() or (any(out.iterdir()) and not (out / MANIFEST_NAME).is_file()):
                raise FileExistsError(f"{out} exists and is not a core directory; refusing to replace it")
            return True
        return False

    check_destination()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        manifest = pb.Core()
        manifest.CopyFrom(core)
        manifest.format_version = CURRENT_FORMAT_VERSION
        for name in ("assets", "manifest_sha256", "created"):
            manifest.ClearField(name)
        manifest.weights.ClearField("files")
        manifest.weights.ClearField("tensors")
        manifest.frontend.template_file = TEMPLATE_FILE
        manifest.frontend.tokenizer_file = TOKENIZER_FILE

        entry = _copy_hashed(tokenizer_path, tmp / TOKENIZER_FILE)
        entry.name = TOKENIZER_FILE
        manifest.assets.append(entry)
        entry = _write_text(tmp / TEMPLATE_FILE, annotated_template)
        entry.name = TEMPLATE_FILE
        manifest.assets.append(entry)

        with progress_bar(total_bytes, f"export {out.name}: weights", progress) as bar:
            _write_weights(tmp, manifest, tensors, shard_bytes, bar)

        manifest.created.tool_version = tool_version()
        manifest.created.utc = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        check_structure(manifest, f"{out} (manifest being exported)")
        write_manifest(tmp / MANIFEST_NAME, manifest)
        sync_dir(tmp)

        if check_destination():
            old = out.parent / f".{out.name}.replaced-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
            try:
                os.rename(tmp, out)
            except BaseException:
                os.rename(old, out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
        sync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
