"""The results plugin: every pytest run is archived under ``results/``.

``results/<UTC timestamp>-<gpu class>-<git short sha>/`` holds ``environment.json`` (versions, GPU,
driver, git sha, command line), ``samples.jsonl`` (one record per measured case and seed, with its
full configuration) and ``summary.json`` (outcome per test id with parameters).  Tests report
samples through the one ``flare_samples`` fixture; samples travel on the test reports, so runs
under pytest-xdist are archived by the controller.

GPU cases: tests marked ``gpu`` with a ``gpu_class`` parameter run only on that GPU class; other
classes, and every GPU case on a machine without CUDA, are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from qualify.archive import git_sha

from .gpu import detect_gpu_class

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_KEY = "flare_sample"
PARAMS_KEY = "flare_params"


def pytest_addoption(parser):
    group = parser.getgroup("flare")
    group.addoption("--flare-results", default=os.environ.get("FLARE_RESULTS_DIR"),
                    help="folder that receives the archived run (default: <repo>/results)")
    group.addoption("--flare-no-archive", action="store_true", default=False, help="do not archive this run")


def environment_record(config) -> dict:
    from qualify.archive import environment

    return environment([sys.executable, "-m", "pytest", *config.invocation_params.args],
                       str(config.invocation_params.dir))


class ResultsArchive:
    def __init__(self, config):
        self.config = config
        self.started = time.time()
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        root = Path(config.getoption("--flare-results") or (REPO_ROOT / "results"))
        self.run_dir = root / f"{stamp}-{detect_gpu_class()}-{git_sha()}"
        self.samples: list[dict] = []
        self.outcomes: dict[str, dict] = {}

    # Reports arrive here from this process or from xdist workers.
    def pytest_runtest_logreport(self, report):
        entry = self.outcomes.setdefault(report.nodeid, {"outcome": "passed", "duration_s": 0.0})
        entry["duration_s"] = round(entry["duration_s"] + report.duration, 6)
        for key, value in report.user_properties:
            if key == PARAMS_KEY:
                entry["params"] = value
            elif key == SAMPLE_KEY and report.when == "call":
                self.samples.append({"test": report.nodeid, **value})
        if report.skipped:
            entry["outcome"] = "skipped"
            if isinstance(report.longrepr, tuple):
                entry["reason"] = report.longrepr[2]
        elif report.failed:
            entry["outcome"] = "failed" if report.when == "call" else "error"
            entry["phase"] = report.when

    # A module that fails to collect is an outcome of the run too (pytest then stops before any test runs).
    def pytest_collectreport(self, report):
        if report.failed:
            self.outcomes[report.nodeid or "<collection>"] = {
                "outcome": "error", "phase": "collect", "duration_s": 0.0,
                "reason": str(report.longrepr)[-2000:]}

    def pytest_sessionfinish(self, session, exitstatus):
        if not self.outcomes:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = environment_record(self.config)
        env["duration_s"] = round(time.time() - self.started, 3)
        (self.run_dir / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
        with open(self.run_dir / "samples.jsonl", "w") as f:
            for s in self.samples:
                f.write(json.dumps(s, sort_keys=True, default=str) + "\n")
        counts: dict[str, int] = {}
        for o in self.outcomes.values():
            counts[o["outcome"]] = counts.get(o["outcome"], 0) + 1
        summary = {"exitstatus": int(exitstatus), "counts": counts, "tests": self.outcomes}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")

    def pytest_terminal_summary(self, terminalreporter):
        if self.outcomes:
            terminalreporter.write_line(f"flare: archived run -> {self.run_dir}")


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU of the case's GPU class")
    if not _is_worker(config) and not config.getoption("--flare-no-archive"):
        config.pluginmanager.register(ResultsArchive(config), "flare-results-archive")


def _wants_gpu(config) -> bool:
    markexpr = config.getoption("markexpr", "") or ""
    return "gpu" in markexpr and "not gpu" not in markexpr


def pytest_collection_modifyitems(config, items):
    here = detect_gpu_class()
    deselected = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            item.user_properties.append((PARAMS_KEY, {k: _plain(v) for k, v in callspec.params.items()}))
        if item.get_closest_marker("gpu") is None:
            continue
        wanted = None
        for name, value in (callspec.params.items() if callspec else ()):
            if name == "gpu_class" or hasattr(value, "gpu_class"):
                wanted = getattr(value, "gpu_class", value)
        if here == "cpu":
            if _wants_gpu(config):
                deselected.append(item)
            else:
                item.add_marker(pytest.mark.skip(reason="no CUDA device on this machine (GPU class cpu)"))
        elif wanted is not None and wanted != here:
            item.add_marker(pytest.mark.skip(reason=f"case is for GPU class {wanted}; this machine is {here}"))
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [i for i in items if i not in deselected]


def pytest_report_header(config):
    here = detect_gpu_class()
    lines = [f"flare: GPU class {here}"]
    if here == "cpu" and _wants_gpu(config):
        lines.append("flare: no CUDA device here: GPU cases are deselected, so -m gpu selects nothing (not an error)")
    return lines


def pytest_sessionfinish(session, exitstatus):
    # `pytest -m gpu` on a CPU machine selects no runnable case: that is expected, not a failure.
    if (exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and detect_gpu_class() == "cpu"
            and _wants_gpu(session.config)):
        session.exitstatus = pytest.ExitCode.OK


def _plain(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return getattr(value, "id", None) or repr(value)


@pytest.fixture
def flare_samples(request):
    """Report measured samples: ``flare_samples(case={...}, seed=0, metric=value, ...)``."""

    def record(case: dict, seed=None, **values):
        request.node.user_properties.append((SAMPLE_KEY, {"case": case, "seed": seed, **values}))

    return record
