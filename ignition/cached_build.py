"""One mechanism for cached build folders: verify, else build into a temporary sibling and rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def build_cached(final: Path, build: Callable[[Path], Path], verify: Callable[[Path], bool]) -> Path:
    """Return ``final`` when ``verify(final)``; otherwise ``build(tmp)`` (which returns the built folder
    inside ``tmp``) and rename it into place atomically.  A damaged folder is moved aside first; losing a
    race to a concurrent builder is fine when the winner's folder verifies."""
    if verify(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        built = build(tmp)
        if final.exists() and not verify(final):
            try:
                os.rename(final, tmp / "stale")
            except OSError:
                pass
        try:
            os.rename(built, final)
        except OSError:
            if not verify(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
