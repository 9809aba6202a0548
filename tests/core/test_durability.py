"""``ignition.durability``: every writer's fsync goes through one switch; ``without_fsync`` skips them and restores
the setting on the way out (also on an exception), nested or not."""

from __future__ import annotations

import os

import pytest

from ignition import durability


@pytest.fixture
def fsyncs(monkeypatch):
    """The file descriptors ``os.fsync`` was called on (the real call still made)."""
    calls, real = [], os.fsync

    def counting(fd):
        calls.append(fd)
        return real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


def test_sync_file_and_dir_fsync_by_default_and_not_within_without_fsync(tmp_path, fsyncs):
    with open(tmp_path / "a", "wb") as f:
        f.write(b"x" * 10)
        durability.sync_file(f)
        assert len(fsyncs) == 1 and fsyncs[0] == f.fileno()
        with durability.without_fsync():
            f.write(b"y")
            durability.sync_file(f)
            durability.sync_dir(tmp_path)
            assert not durability.fsync_enabled()
        assert len(fsyncs) == 1 and durability.fsync_enabled()
    assert (tmp_path / "a").read_bytes() == b"x" * 10 + b"y"  # flushed either way
    durability.sync_dir(tmp_path)
    assert len(fsyncs) == 2


def test_without_fsync_restores_on_error_nests_and_can_be_a_no_op(fsyncs):
    with pytest.raises(RuntimeError):
        with durability.without_fsync():
            raise RuntimeError("boom")
    assert durability.fsync_enabled()
    with durability.without_fsync(False):
        assert durability.fsync_enabled()
    with durability.without_fsync():
        with durability.without_fsync(False):  # an inner "no change" keeps the outer skip
            assert not durability.fsync_enabled()
        assert not durability.fsync_enabled()
    assert durability.fsync_enabled()
