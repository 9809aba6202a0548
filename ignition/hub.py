"""Locating the offline Hugging Face hub cache."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_HUB = REPO_ROOT.parent / "shared" / "hub"


class HubUnavailable(RuntimeError):
    """``../shared/hub`` is there but could not be materialized (its script failed): named, never taken for an
    absent hub -- that would turn every hub case into a skip."""


@lru_cache(maxsize=None)
def default_hub_cache() -> str | None:
    """``FLARE_TEST_HUB_CACHE``/``HF_HUB_CACHE`` if set, else the materialized ``../shared/hub`` cache, else None (no
    ``../shared/hub``).  Raises :class:`HubUnavailable` -- naming the script, its exit status and its stderr -- when
    the materialize script is there but fails or prints no path."""
    for var in ("FLARE_TEST_HUB_CACHE", "HF_HUB_CACHE"):
        if os.environ.get(var):
            return os.environ[var]
    script = SHARED_HUB / "materialize.py"
    if not script.is_file():
        return None
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        raise HubUnavailable(f"{script} exited {out.returncode} without a cache path: "
                             f"{(out.stderr.strip() or out.stdout.strip() or 'no output')[-2000:]}")
    return out.stdout.strip().splitlines()[-1]
