"""GPU class detection, resolved in one place."""

from __future__ import annotations

import os
from functools import lru_cache

GPU_CLASSES = ("cpu", "sm90", "sm100", "sm120", "sm121")
_BY_CAPABILITY = {(9, 0): "sm90", (10, 0): "sm100", (12, 0): "sm120", (12, 1): "sm121"}


@lru_cache(maxsize=None)
def detect_gpu_class() -> str:
    """``cpu`` without CUDA, else ``sm<major><minor>`` of device 0 (``FLARE_GPU_CLASS`` overrides)."""
    forced = os.environ.get("FLARE_GPU_CLASS")
    if forced:
        return forced
    try:
        import torch
    except ImportError:
        return "cpu"
    if not torch.cuda.is_available():
        return "cpu"
    major, minor = torch.cuda.get_device_capability(0)
    return _BY_CAPABILITY.get((major, minor), f"sm{major}{minor}")


def gpu_description() -> dict:
    info = {"gpu_class": detect_gpu_class()}
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(name=p.name, total_memory=p.total_memory, multiprocessors=p.multi_processor_count,
                        capability=list(torch.cuda.get_device_capability(0)), cuda=torch.version.cuda,
                        device_count=torch.cuda.device_count())
    except Exception as exc:  # report, never hide
        info["error"] = repr(exc)
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            info["driver"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return info
