"""The conformance plugin: GPU-class skips with reasons, -m gpu on CPU, archived runs."""

import json

import pytest

pytest_plugins = ["pytester"]

TEST_FILE = """
import pytest

@pytest.mark.gpu
@pytest.mark.parametrize("gpu_class", ["sm90", "sm120"])
@pytest.mark.parametrize("capacity", [1, 4])
def test_graph(gpu_class, capacity, flare_samples):
    flare_samples(case={"capacity": capacity}, seed=0, value=1.5)

@pytest.mark.parametrize("n", [1, 2])
def test_cpu(n, flare_samples):
    flare_samples(case={"n": n}, seed=n, value=n * 2)
"""


@pytest.fixture
def tester(pytester, monkeypatch):
    from conformance.gpu import detect_gpu_class

    detect_gpu_class.cache_clear()
    monkeypatch.setenv("FLARE_GPU_CLASS", "cpu")
    yield pytester
    detect_gpu_class.cache_clear()


@pytest.fixture
def _unused(pytester):
    return pytester


@pytest.fixture(autouse=True)
def _files(pytester):
    pytester.makeconftest('pytest_plugins = ["conformance.plugin"]')
    pytester.makepyfile(test_matrix=TEST_FILE)


def _archived(path):
    runs = list(path.iterdir())
    assert len(runs) == 1 and runs[0].name.split("-")[1] == "cpu"
    return runs[0]


def test_gpu_cases_skip_with_reason_and_run_is_archived(tester):
    out = tester.runpytest("-p", "no:cacheprovider", f"--flare-results={tester.path / 'res'}")
    out.assert_outcomes(passed=2, skipped=4)
    run = _archived(tester.path / "res")
    summary = json.loads((run / "summary.json").read_text())
    skipped = [t for t in summary["tests"].values() if t["outcome"] == "skipped"]
    assert all("no CUDA device" in t["reason"] for t in skipped) and len(skipped) == 4
    assert all("params" in t for t in summary["tests"].values())
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["value"] for s in samples) == [2, 4]
    env = json.loads((run / "environment.json").read_text())
    assert {"git_sha", "command_line", "packages", "gpu"} <= set(env)


def test_minus_m_gpu_on_cpu_selects_nothing_and_says_why(tester):
    out = tester.runpytest("-m", "gpu", "-p", "no:cacheprovider", "--flare-no-archive")
    assert out.ret == 0
    out.stdout.fnmatch_lines(["*no CUDA device here*GPU cases are deselected*"])
    out.assert_outcomes()


def test_other_gpu_class_is_skipped_with_its_name(tester, monkeypatch):
    from conformance.gpu import detect_gpu_class

    monkeypatch.setenv("FLARE_GPU_CLASS", "sm90")
    detect_gpu_class.cache_clear()
    out = tester.runpytest("-p", "no:cacheprovider", "--flare-no-archive", "-rs")
    out.assert_outcomes(passed=4, skipped=2)
    out.stdout.fnmatch_lines(["*case is for GPU class sm120; this machine is sm90*"])


def test_archive_works_under_xdist(tester):
    out = tester.runpytest("-n", "2", "-p", "no:cacheprovider", f"--flare-results={tester.path / 'res'}")
    out.assert_outcomes(passed=2, skipped=4)
    run = _archived(tester.path / "res")
    samples = (run / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 2


CASE_FILE = """
import pytest
from dataclasses import dataclass

@dataclass(frozen=True)
class Case:
    recipe: str
    gpu_class: str

@pytest.mark.gpu
@pytest.mark.parametrize("case", [Case("r", "sm90"), Case("r", "sm120")], ids=["sm90", "sm120"])
def test_case_object(case):
    pass
"""


def test_gpu_class_read_from_a_case_object(pytester, monkeypatch):
    """Regression: cases carrying gpu_class as an attribute ran on every class (seen on the H200)."""
    from conformance.gpu import detect_gpu_class

    monkeypatch.setenv("FLARE_GPU_CLASS", "sm90")
    detect_gpu_class.cache_clear()
    pytester.makepyfile(test_cases=CASE_FILE)
    out = pytester.runpytest("test_cases.py", "-p", "no:cacheprovider", "--flare-no-archive", "-rs")
    detect_gpu_class.cache_clear()
    out.assert_outcomes(passed=1, skipped=1)
    out.stdout.fnmatch_lines(["*case is for GPU class sm120; this machine is sm90*"])


def test_a_run_that_fails_to_collect_is_archived_with_the_error(tester):
    """pytest stops before any test when a module cannot be imported: the run is still archived, the module an error
    of phase collect with its reason."""
    tester.makepyfile(test_broken="import no_such_module_here\n")
    out = tester.runpytest("-p", "no:cacheprovider", f"--flare-results={tester.path / 'res'}")
    assert out.ret != 0
    run = _archived(tester.path / "res")
    summary = json.loads((run / "summary.json").read_text())
    broken = summary["tests"]["test_broken.py"]
    assert broken["outcome"] == "error" and broken["phase"] == "collect"
    assert "no_such_module_here" in broken["reason"] and summary["counts"] == {"error": 1}
