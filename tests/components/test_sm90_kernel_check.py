"""``scripts/sm90_kernel_check.py``: the decode kernels compiled for sm90 without a GPU (Triton's ptxas).  Runs where
Triton is installed and no CUDA device is (the interpreter tests' machines); the CPU CI image has no Triton."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _one_row_cases() -> list:
    """The script's ``ONE_ROW`` list, read from its source (importing it would set ``TRITON_INTERPRET=0`` in this
    process, for every interpreter test after this one)."""
    tree = ast.parse((ROOT / "scripts" / "sm90_kernel_check.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "ONE_ROW")
    return ast.literal_eval(node.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU half; a GPU machine compiles these for real")
def test_kernels_compile_for_sm90_without_spills_and_the_refactor_check_finds_itself_equal(tmp_path):
    pytest.importorskip("triton", reason="Triton is not installed here")
    out = tmp_path / "check.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "sm90_kernel_check.py"), "--only", "gemv 0.6B",
                          "--against", "HEAD", "--json", str(out)], capture_output=True, text=True, cwd=ROOT,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(out.read_text())
    expected = [name for name, *_ in _one_row_cases() if name.startswith("0.6B")]  # its projections and its head
    assert len(rows) == len(expected) >= 5 and all("Used" in r["ptxas"] and "0 bytes spill stores" in r["ptxas"] for r in rows)
    assert all(1 <= r["per_sm"] <= 32 for r in rows)  # resident programs per SM from the registers and shared memory
    # HEAD's kernels against this tree's: equal unless this tree changed them
    if not subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "ignition/components/kernels"],
                          cwd=ROOT).returncode:
        assert all(r["same_ptx_as_HEAD"] is True for r in rows)
