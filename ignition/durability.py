"""Whether the files Flare writes -- core shards, manifests, copied assets, synthesized checkpoints -- are fsynced
before they count as written: one place for every writer (``ignition.core``, ``ignition.checkpoints``).

By default every file is flushed and fsynced (and a core's directories synced after the renames that publish it), so
a core or checkpoint that exists is complete on disk even after a power loss.  :func:`without_fsync` (the ``--no-fsync``
flag of ``ignition export`` and ``ignition synth-checkpoint``) skips the fsyncs for throwaway outputs -- a scratch
core on a benchmark machine: every reader still sees complete files (they are in the page cache once written and the
atomic renames are unchanged), but a power loss could leave files incomplete behind a manifest.  Why: exporting
Qwen3-8B on a device machine, the progress bar stalled about 3 s at the end of each 2 GiB shard, where the shard is
fsynced (run 190's export, an H100: 37.6 s to write 15.3 GB).  Measured since only across machines: the whole
Qwen3-8B export 71.2 s with the fsyncs on an H200 (run 173), 68.7 s without on another (run 192) -- a lead, not a
side-by-side figure."""

from __future__ import annotations

import contextlib
import os
from typing import BinaryIO, Iterator

_fsync = True  # the process-wide setting


def fsync_enabled() -> bool:
    """Whether writes are fsynced now (False inside :func:`without_fsync`)."""
    return _fsync


@contextlib.contextmanager
def without_fsync(skip: bool = True) -> Iterator[None]:
    """Within: files are flushed but not fsynced, directories not synced (``skip`` False: no change)."""
    global _fsync
    before = _fsync
    _fsync = before and not skip
    try:
        yield
    finally:
        _fsync = before


def sync_file(f: BinaryIO) -> None:
    """Flush ``f`` and fsync it (unless within :func:`without_fsync`)."""
    f.flush()
    if _fsync:
        os.fsync(f.fileno())


def sync_dir(path: str | os.PathLike) -> None:
    """Fsync a directory, making the renames and new entries in it durable (unless within :func:`without_fsync`);
    a file system that cannot open or sync a directory is skipped."""
    if not _fsync:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
