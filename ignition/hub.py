"""Locating the offline Hugging Face hub cache."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_HUB = REPO_ROOT.parent / "shared" / "hub"


@lru_cache(maxsize=None)
def default_hub_cache() -> str | None:
    """``FLARE_HUB_CACHE``/``HF_HUB_CACHE`` if set, else the materialized ``../shared/hub`` cache, else None."""
    for var in ("FLARE_TEST_HUB_CACHE", "HF_HUB_CACHE"):
        if os.environ.get(var):
            return os.environ[var]
    script = SHARED_HUB / "materialize.py"
    if script.is_file():
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[-1]
    return None
