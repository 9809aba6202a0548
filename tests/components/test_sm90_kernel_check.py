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
    names = [name for name, *_ in _one_row_cases() if name.startswith("0.6B")]  # its projections and its head
    expected = names + [name for name in names if name.endswith("head")]  # the head into float32 logits too
    assert len(rows) == len(expected) >= 5 and all("Used" in r["ptxas"] and "0 bytes spill stores" in r["ptxas"] for r in rows)
    assert all(1 <= r["per_sm"] <= 32 for r in rows)  # resident programs per SM from the registers and shared memory
    # HEAD's kernels against this tree's: equal unless this tree changed them
    if not subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "ignition/components/kernels"],
                          cwd=ROOT).returncode:
        assert all(r["same_ptx_as_HEAD"] is True for r in rows)


def _normalizers():
    """The script's ``code_of`` and ``legacy_code_of`` (with ``DEBUG_LABEL``), read from its source: importing it
    would set ``TRITON_INTERPRET=0`` in this process."""
    import re

    tree = ast.parse((ROOT / "scripts" / "sm90_kernel_check.py").read_text())
    keep = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name in ("_no_debug", "code_of",
                                                                                   "legacy_code_of"))
            or (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "DEBUG_LABEL")]
    space = {"re": re}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "sm90_kernel_check", "exec"), space)
    return space["code_of"], space["legacy_code_of"]


PTX = """
//  a comment
.loc 1 10 4
$L__tmp0:
    setp.lt.s32 %p1, %r1, 4;
    @%p1 bra $L__BB0_{a};
    add.f32 %f1, %f1, %f2;
$L__BB0_{a}:
    st.global.f32 [%rd1], %f1;
$L__BB0_{b}:
    ret;
"""


def test_code_of_keeps_control_flow_and_drops_label_numbering_and_debug_info():
    """Renumbered labels and moved debug locations are the same code; a branch to another place is not -- the old
    normalization (every label name removed) could not tell those apart."""
    code_of, legacy = _normalizers()
    same = PTX.format(a=2, b=3)
    renumbered = PTX.format(a=7, b=9).replace(".loc 1 10 4", ".loc 1 99 1").replace("$L__tmp0:", "$L__tmp5:")
    assert code_of(same) == code_of(renumbered)
    other_target = same.replace("@%p1 bra $L__BB0_2;", "@%p1 bra $L__BB0_3;")  # skips the store instead of the add
    assert code_of(other_target) != code_of(same)
    assert legacy(other_target) == legacy(same)  # what --against compared before
    assert "$L__tmp" not in code_of(same) and ".loc" not in code_of(same) and "comment" not in code_of(same)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU half; a GPU machine tests the bits themselves")
@pytest.mark.parametrize("only,cases", [("fused decode 32x8 splits 17", 11), ("rope write", 2)])
def test_rope_rotation_compiles_for_sm90_with_each_rounding_kept(tmp_path, only, cases):
    """The rotation's ``bf16(bf16(h * cos) + bf16(rotate_half(h) * sin))`` keeps its three roundings in the sm90 PTX:
    no bf16 fma in the rope write nor in Qwen3-8B's fused decode launches, the writer's loads at every
    ``FLARE_DECODE_V_FIRST`` level among them -- the script fails on one (:data:`BF16_FMA`).  And the check can fail:
    the same kernels summed by a plain add (``ADD_RN`` off, the interpreter's form) compile to bf16 fmas (LLVM's
    contraction, run 185's failure)."""
    pytest.importorskip("triton", reason="Triton is not installed here")
    out = tmp_path / "check.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "sm90_kernel_check.py"), "--only", only, "--json",
                          str(out)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert len(rows) == cases and all(r["bf16_fma"] == 0 for r in rows)
    plain = subprocess.run([sys.executable, "-c", f"""
import sys
sys.path.insert(0, "scripts")
import sm90_kernel_check as c
for name, kernel, sig, consts, opts in [case for case in c.cases() if {only!r} in case[0]][:2]:
    ptx = c.compile_sm90(c.kernel_of(kernel), sig, {{**consts, "ADD_RN": False}}, opts).asm["ptx"]
    print(name, len(c.BF16_FMA.findall(ptx)))
"""], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert plain.returncode == 0, plain.stderr[-2000:]
    counts = [int(line.rsplit(" ", 1)[1]) for line in plain.stdout.splitlines()]
    assert len(counts) == 2 and all(n > 0 for n in counts), plain.stdout  # two cases suffice for the control
