"""``scripts/h200_run.sh`` (the device call's stages) on this machine, with a stand-in ``nvidia-smi``: ``NEED_GPU``
stops the call before any stage when the card given is not the one asked for (or runs ``OTHER_STAGES`` there), and
still packs what it wrote; the
tests stage cut by its time limit keeps pytest's report and switches off only the kernels whose selected tests did
not pass."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _call(tmp_path: Path, card: str, **env: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """Runs the script (the repository as its working directory, its work folders under ``tmp_path``) with an
    ``nvidia-smi`` on PATH that reports ``card``; returns the process and the archive's text files by name."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   "case \"$*\" in\n"
                   f"  *name,driver_version*) echo 'name, driver_version, memory.total [MiB]'; "
                   f"echo '{card}, 580.0, 81559 MiB' ;;\n"
                   "  *nounits*) echo 81559 ;;\n"
                   f"  *) echo '{card}' ;;\n"
                   "esac\n")
    smi.chmod(0o755)
    out = tmp_path / "out"
    full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out),
                "FLARE_RUN_WORK": str(tmp_path / "work"), "FLARE_RUN_RESULTS": str(tmp_path / "results"), **env}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "h200_run.sh")], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=60)
    files = {}
    archive = out / "h200-run.tgz"
    if archive.is_file():
        with tarfile.open(archive) as tar:
            for m in tar.getmembers():
                if m.isfile() and not m.name.endswith(".tgz"):  # the text files (a stage's inner archives aside)
                    files[Path(m.name).name] = tar.extractfile(m).read().decode()
    return proc, files


def test_need_gpu_stops_on_another_card_before_any_stage(tmp_path):
    proc, files = _call(tmp_path, "NVIDIA H100 80GB HBM3", NEED_GPU="H200", STAGES="no-such-stage")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "NEED_GPU=H200: this card is NVIDIA H100 80GB HBM3" in files["stages.log"]
    assert "no-such-stage" not in files["stages.log"] and "H100" in files["gpu.txt"]


def test_need_gpu_runs_other_stages_on_another_card(tmp_path):
    proc, files = _call(tmp_path, "NVIDIA H100 80GB HBM3", NEED_GPU="H200", STAGES="measure-stage",
                        OTHER_STAGES="other-stage")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = files["stages.log"]
    assert "NEED_GPU=H200: this card is NVIDIA H100 80GB HBM3 -- OTHER_STAGES instead: other-stage" in log
    assert "== other-stage" in log and "measure-stage" not in log.replace("STAGES", "")
    proc, files = _call(tmp_path, "NVIDIA H200", NEED_GPU="H200", STAGES="measure-stage", OTHER_STAGES="other-stage")
    assert "== measure-stage" in files["stages.log"] and "== other-stage" not in files["stages.log"]


def test_need_gpu_lets_the_named_card_run_its_stages(tmp_path):
    proc, files = _call(tmp_path, "NVIDIA H200", NEED_GPU="H200", STAGES="no-such-stage")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== no-such-stage" in files["stages.log"] and "unknown stage no-such-stage" in proc.stdout


@pytest.mark.parametrize("stages", [dict(STAGES="core-8B replayin3-8B"),
                                    dict(STAGES="core-8B", OTHER_STAGES="core-8B replayin3-8B")])
def test_side_by_side_stage_without_entries_stops_the_call_before_any_stage(tmp_path, stages):
    """A ``replayinN-G`` stage of ``STAGES`` or ``OTHER_STAGES`` whose ``AB_INN_G`` / ``AB_INN`` is unset (or was set
    without ``export``): exit 2 before the first stage and before the card is asked, the variable named; with it
    given, the stages run."""
    proc, files = _call(tmp_path, "NVIDIA H200", **stages)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    log = files["stages.log"]
    assert "preflight: replayin3-8B has no entries: export AB_IN3 or AB_IN3_8B" in log
    assert "== core-8B" not in log and "gpu.txt" not in files
    for given in (dict(AB_IN3="FLARE_X=1"), dict(AB_IN3_8B="FLARE_X=1")):  # OTHER_STAGES checked, not run here
        proc, files = _call(tmp_path, "NVIDIA H200", NEED_GPU="H200", STAGES="no-such-stage",
                            OTHER_STAGES="replayin3-8B", **given)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "preflight" not in files["stages.log"] and "== no-such-stage" in files["stages.log"]


def test_tests_stage_cut_by_its_limit_switches_off_only_the_selected_kernels_that_did_not_pass(tmp_path):
    """The tests stage cut by ``TESTS_S``: pytest (here a stand-in ``python3``) is interrupted, so its report of what
    passed survives; a kernel whose test was selected and not reported passed is switched off for the later stages,
    one whose test passed or was not selected stays on (run 185's narrowed selection had switched off all five)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text("#!/bin/sh\n"
                    "case \"$*\" in\n"
                    "  *--collect-only*) echo 'tests/t.py::test_gumbel_argmax_on_this_gpu'; "
                    "echo 'tests/t.py::test_sampler_front_on_this_gpu[True]' ;;\n"
                    "  *) trap 'echo \"PASSED tests/t.py::test_gumbel_argmax_on_this_gpu\"; exit 2' INT\n"
                    "     echo '.'; sleep 5 & wait ;;\n"
                    "esac\n")
    fake.chmod(0o755)
    proc, files = _call(tmp_path, "NVIDIA H200", STAGES="tests", TESTS_S="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASSED tests/t.py::test_gumbel_argmax_on_this_gpu" in files["gpu_tests.log"]  # the interrupted report
    stages = files["stages.log"]
    assert "sampler_front failed or the tests timed out (rc 124): FLARE_SAMPLER_FRONT_KERNEL=0" in stages
    for kept in ("gumbel", "mlp_handoff_chain", "decode_combine_in_kernel", "width_one", "head_logits_into",
                 "embed_rotary_on_this_gpu", "embed_rotary_batch_on_this_gpu", "done-early"):
        assert f"{kept} failed" not in stages, stages
