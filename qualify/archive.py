"""Archived runs: ``results/<UTC stamp>-<gpu class>-<git sha>[-<label>]/`` with ``environment.json`` and
``samples.jsonl`` -- the one format the pytest results plugin, the benchmarks and ``qualify.report`` share."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "transformers", "tokenizers", "jinja2", "triton", "safetensors", "huggingface_hub", "protobuf",
            "pytest", "pytest-xdist", "pytest-benchmark", "numpy")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def git_sha() -> str:
    """The checkout's commit -- or ``FLARE_GIT_SHA``, set where the tree was copied from a commit its own ``.git``
    does not know (the device machine's copy: ``scripts/h200_run.sh`` reads it from ``.tree-commit``)."""
    return os.environ.get("FLARE_GIT_SHA", "").strip() or _git("rev-parse", "--short", "HEAD") or "nogit"


def git_dirty() -> bool | None:
    """Whether tracked files differ from the checkout's commit; None when unknown (no git, or ``FLARE_GIT_SHA`` names
    the commit instead: the local ``.git`` cannot tell)."""
    if os.environ.get("FLARE_GIT_SHA", "").strip():
        return None
    out = _git("status", "--porcelain", "--untracked-files=no")
    return None if out is None else bool(out)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(command_line: list[str], cwd: str | None = None) -> dict:
    from conformance.gpu import gpu_description

    return {
        "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(), "git_dirty": git_dirty(),
        "command_line": list(command_line), "cwd": cwd or os.getcwd(),
        "python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
        "cpu_count": os.cpu_count(), "packages": {d: _version(d) for d in PACKAGES}, "gpu": gpu_description(),
        "flare_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("FLARE_")},  # switches of the run
    }


def new_run_dir(root: str | Path | None = None, label: str | None = None) -> Path:
    from conformance.gpu import detect_gpu_class

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    name = f"{stamp}-{detect_gpu_class()}-{git_sha()}" + (f"-{label}" if label else "")
    return Path(root or (REPO_ROOT / "results")) / name


def read_samples(run_dir: str | Path) -> list[dict]:
    """The records of an archived run's ``samples.jsonl``, in order (blank lines skipped); ``FileNotFoundError``
    naming the file when the run has none."""
    return [json.loads(line) for line in (Path(run_dir) / "samples.jsonl").read_text().splitlines() if line.strip()]


def write_run(run_dir: Path, samples: list[dict], command_line: list[str], extra: dict | None = None) -> Path:
    """Write ``environment.json`` (plus ``extra``) and ``samples.jsonl``; returns the folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = environment(command_line)
    env.update(extra or {})
    (run_dir / "environment.json").write_text(json.dumps(env, indent=2, default=str) + "\n")
    with open(run_dir / "samples.jsonl", "w") as f:
        for s in samples:
            f.write(json.dumps(s, sort_keys=True, default=str) + "\n")
    return run_dir
