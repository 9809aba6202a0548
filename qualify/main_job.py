"""``flare qualify``: the main job.

For now it runs the CPU conformance subset (every recipe whose assets are present, plus the
embedded default that needs none), archives the run under ``results/`` and prints a summary.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def run(recipe: str | None = None, results: str | None = None, workers: str | None = None,
        hub_cache: str | None = None, extra: list[str] | None = None) -> int:
    import pytest

    root = Path(results) if results else REPO_ROOT / "results"
    root.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in root.iterdir()}
    if hub_cache:
        os.environ["FLARE_TEST_HUB_CACHE"] = hub_cache
    args = [str(REPO_ROOT / "conformance"), "-m", "not gpu and not benchmark", "-q", "-p", "no:cacheprovider",
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
    return int(code)


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
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
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
