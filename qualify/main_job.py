"""``flare qualify``: the main job.

1. The conformance matrix this machine supports (every recipe whose assets are present, plus the embedded
   default that needs none; on a GPU the ``gpu`` cases of its class too), archived under ``results/``.
2. With a CUDA GPU: ``qualify.gpu_replay`` on the embedded default core (decode capacities 1 and 4 against
   the measured floor, compiled vs uncompiled over 256 steps), archived; then the comparison with the baseline
   the GPU class accepts for that core (``results/baselines/<class>.json``, ``cores``) by ``qualify.report``, whose
   Markdown/PNG location is printed -- or, without one, how to accept this run as one.  On a machine without CUDA
   these stages are skipped and the summary says so.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from qualify.archive import read_samples

REPO_ROOT = Path(__file__).resolve().parents[1]


def run(recipe: str | None = None, results: str | None = None, workers: str | None = None,
        hub_cache: str | None = None, extra: list[str] | None = None) -> int:
    import pytest

    root = Path(results) if results else REPO_ROOT / "results"
    root.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in root.iterdir()}
    if hub_cache:
        os.environ["FLARE_TEST_HUB_CACHE"] = hub_cache
    import torch

    cuda = torch.cuda.is_available()
    marker = "not benchmark" if cuda else "not gpu and not benchmark"
    args = [str(REPO_ROOT / "conformance"), "-m", marker, "-q", "-p", "no:cacheprovider",
            "--flare-results", str(root), "--rootdir", str(REPO_ROOT)]
    if recipe:
        args += ["-k", recipe]
    if workers and workers != "0":
        args += ["-n", workers]
    args += extra or []
    started = time.time()
    code = pytest.main(args)
    new = sorted(p for p in root.iterdir() if p.name not in before and p.is_dir())
    if not new:
        print("flare qualify: no run was archived", file=sys.stderr)
        return int(code) or 1
    print_summary(new[-1], time.time() - started)
    if not cuda:
        print("\nGPU stages (gpu_replay on the default core, baseline comparison): skipped -- no CUDA device here")
        return int(code)
    return max(int(code), gpu_stages(root))


def gpu_stages(root: Path) -> int:
    """gpu_replay on the embedded default core, archived; the comparison with the class baseline."""
    from helios.runtime.engine import default_core
    from qualify import gpu_replay
    from qualify.report import DeviceMismatch, ReportError, class_baseline, compare, write_report

    before = {p.name for p in root.iterdir()}
    rc = gpu_replay.main(["--core", str(default_core()), "--capacities", "1,4", "--context", "256", "--samples", "100",
                          "--seeds", "0,1", "--check-compiled", "--steps", "256", "--out", str(root)])
    runs = sorted(p for p in root.iterdir() if p.name not in before and p.name.endswith("-gpu-replay"))
    if not runs:
        print("flare qualify: gpu_replay archived nothing", file=sys.stderr)
        return rc or 1
    env = json.loads((runs[-1] / "environment.json").read_text())
    cls = env["gpu"]["gpu_class"]
    core = replay_core(runs[-1])
    baseline = class_baseline(cls, core=core)
    if baseline is None:
        print(f"\nno accepted baseline for {core} on {cls}: to accept this run, add it to "
              f'results/baselines/{cls}.json as "cores": {{"{core}": "{runs[-1].name}"}}')
        return rc
    try:
        paths = write_report(compare(baseline, runs[-1]), runs[-1] / "report")
    except DeviceMismatch as e:  # the class's baseline ran on another device: nothing to compare with, no failure
        print(f"\nno baseline comparison for this device: {e}")
        return rc
    except ReportError as e:
        print(f"flare qualify: baseline comparison failed: {e}", file=sys.stderr)
        return rc or 1
    print(f"\nbaseline comparison ({cls}: {baseline} -> {runs[-1].name}): {paths['markdown']}")
    return rc


def replay_core(run: Path) -> str:
    """The core a ``gpu_replay`` run measured (its timed cases' ``core`` field); raises naming the run when its
    samples name none or several."""
    records = read_samples(run)
    cores = {r["case"].get("core") for r in records if r.get("case", {}).get("tool") == "gpu_replay"}
    if len(cores) != 1 or None in cores:
        raise ValueError(f"{run.name}: expected the timed cases of one core, found {sorted(map(str, cores))}")
    return cores.pop()


def print_summary(run_dir: Path, elapsed: float) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    env = json.loads((run_dir / "environment.json").read_text())
    by_case: dict[str, Counter] = defaultdict(Counter)
    reasons: Counter = Counter()
    for test_id, entry in summary["tests"].items():
        params = entry.get("params", {})
        key = params.get("frontend_case") or params.get("recipe") or test_id.split("::")[0]
        by_case[str(key)][entry["outcome"]] += 1
        if entry["outcome"] == "skipped":
            reasons[entry.get("reason", "?")] += 1
    print()
    print(f"flare qualify — {env['gpu']['gpu_class']} — git {env['git_sha']} — {elapsed:.1f} s — archived {run_dir}")
    print(f"{'case':52} {'passed':>7} {'failed':>7} {'skipped':>8}")
    for key in sorted(by_case):
        c = by_case[key]
        print(f"{key[:52]:52} {c['passed']:7d} {c['failed'] + c['error']:7d} {c['skipped']:8d}")
    rates = []
    for s in read_samples(run_dir):
        if s.get("case", {}).get("metric") == "reusable_prefix_rate":
            rates.append(s)
    if rates:
        print("\nreusable-prefix rate (byte endpoints of turn N, reply included, that stay a prefix of turn N+1):")
        for s in sorted(rates, key=lambda s: (s["case"]["recipe"], s["case"]["variant"])):
            c = s["case"]
            print(f"  {c['recipe']:12} {c['variant']:16} {c['checkpoint']:28} {s['rate']:.3f} ({s['kept']}/{s['total']})")
    if reasons:
        print("\nskipped, by reason:")
        for reason, n in reasons.most_common():
            print(f"  {n:4d}  {reason}")
    counts = summary["counts"]
    print("\n" + ", ".join(f"{counts.get(k, 0)} {k}" for k in ("passed", "failed", "error", "skipped")))
