"""Compare two archived runs case by case: ``python -m qualify.report BASELINE_RUN CANDIDATE_RUN [--out DIR]``.

A run is a folder written by the results plugin (``conformance/plugin.py``): ``environment.json`` and
``samples.jsonl`` (one record per sample: ``case`` dict, ``seed``, metric fields).  A run is named by its
path or by its folder name under ``results/``.

Samples are grouped by case: the JSON of the ``case`` dict without run-specific fields (``RUN_SPECIFIC``) and
without the fields named by ``--ignore`` (side-by-side variants that differ in one field, e.g. ``--ignore attention``
to compare two attention backends measured in one run; the report states what was ignored).
The metric is ``--metric NAME`` or, by default, the first numeric field (in sorted key order) whose name
ends in ``_s`` or ``_ns``, ``duration_s``, the floor's own fields (``floor_*``) and rates (``*_per_s``)
excepted.  A metric field may hold one number or a
list of raw samples.  Per case: the median of each run, the ratio candidate/baseline, the noise as min-max of
each run, and a verdict by this rule (``RULE``):

- **faster** when the candidate's max < the baseline's min (the ranges are disjoint, candidate below);
- **slower** when the candidate's min > the baseline's max (disjoint, candidate above);
- **within noise** otherwise (the ranges overlap).

Runs of different GPU classes (``environment.json`` ``gpu.gpu_class``) are never compared: that is an
error.  Writes ``report.md`` (the table and the rule) and, when matplotlib is importable, ``report.png``
(each case's two medians with min-max bars, and the floor as a line where samples carry ``floor_s``);
without matplotlib only the Markdown is written and it says so.  ``results/baselines/<gpu class>.json``
(``{"run": "<results dir name>", "cores": {"<core>": "<results dir name>", ...}}``) names the accepted baseline run
per class and, under ``cores``, per core a replay measures (``gpu_replay``'s case field ``core``): a replay is compared
with the baseline of its own core, never with another model's (:func:`class_baseline`).  A report whose two runs have
no case in common says so at its top.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from qualify import critical_path
from qualify.archive import read_samples

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "results"
BASELINES = RESULTS / "baselines"
RUN_SPECIFIC = frozenset({"gpu_class", "run", "git_sha", "utc", "timestamp", "host", "hostname", "device"})
NOT_METRICS = frozenset({"floor_s", "duration_s"})
RULE = ("faster: candidate max < baseline min (ranges disjoint, candidate below); "
        "slower: candidate min > baseline max (ranges disjoint, candidate above); "
        "within noise: the min-max ranges overlap")


class ReportError(Exception):
    """A comparison that cannot be made (missing run, different GPU classes, no metric)."""


def resolve_run(run: str | Path, results: Path | None = None) -> Path:
    path, results = Path(run), Path(results or RESULTS)
    for cand in (path, results / path):
        if (cand / "samples.jsonl").is_file():
            return cand
    raise ReportError(f"run {run!s}: no samples.jsonl at {path} or {results / path}")


def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    env_path = run_dir / "environment.json"
    if not env_path.is_file():
        raise ReportError(f"run {run_dir}: no environment.json (cannot tell its GPU class)")
    env = json.loads(env_path.read_text())
    return env, read_samples(run_dir)


class DeviceMismatch(ReportError):
    """Two runs of one GPU class on different devices (an H100 and an H200 are both sm90): not compared."""


def gpu_class(env: dict) -> str:
    cls = (env.get("gpu") or {}).get("gpu_class")
    if not cls:
        raise ReportError("environment.json has no gpu.gpu_class")
    return cls


def class_baseline(cls: str, baselines: Path | None = None, core: str | None = None) -> str | None:
    """The accepted baseline run name for a GPU class (``results/baselines/<class>.json``'s ``run``) or, with
    ``core``, for that core on that class (its entry under ``cores``); None when none is accepted."""
    path = Path(baselines or BASELINES) / f"{cls}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data.get("cores", {}).get(core) if core is not None else data["run"]


def case_key(case, ignore: frozenset[str] = frozenset()) -> str:
    if isinstance(case, dict):
        case = {k: v for k, v in case.items() if k not in RUN_SPECIFIC and k not in ignore}
    return json.dumps(case, sort_keys=True, default=str)


def _numbers(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in value):
        return [float(v) for v in value]
    return []


def default_metric(samples: list[dict]) -> str:
    for s in samples:
        for key in sorted(s):
            if (key.endswith("_s") or key.endswith("_ns")) and key not in NOT_METRICS and not key.startswith("floor_") \
                    and not key.endswith("per_s") and _numbers(s[key]):
                return key
    raise ReportError("no numeric field ending in _s or _ns in the samples: pass --metric NAME")


def group(samples: list[dict], metric: str, ignore: frozenset[str] = frozenset()) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for s in samples:
        vals = _numbers(s.get(metric))
        if not vals:
            continue
        g = out.setdefault(case_key(s.get("case"), ignore), {"values": [], "floor_s": []})
        g["values"].extend(vals)
        g["floor_s"].extend(_numbers(s.get("floor_s")))
    return out


def verdict(base: list[float], cand: list[float]) -> str:
    if max(cand) < min(base):
        return "faster"
    if min(cand) > max(base):
        return "slower"
    return "within noise"


def compare(baseline: str | Path, candidate: str | Path, metric: str | None = None,
            results: Path | None = None, ignore: frozenset[str] = frozenset(), config: dict | None = None) -> dict:
    """The report of ``candidate`` against ``baseline`` (module doc); ``config``: the model's config, for the
    per-kernel floors of runs archived before their samples carried the projection bytes."""
    bdir, cdir = resolve_run(baseline, results), resolve_run(candidate, results)
    benv, bs = load_run(bdir)
    cenv, cs = load_run(cdir)
    bcls, ccls = gpu_class(benv), gpu_class(cenv)
    if bcls != ccls:
        raise ReportError(f"refusing to compare runs of different GPU classes: baseline {bdir.name} is {bcls}, "
                          f"candidate {cdir.name} is {ccls} (classes are never compared with each other)")
    bdev, cdev = ((env.get("gpu") or {}).get("name") for env in (benv, cenv))
    if bdev and cdev and bdev != cdev:
        raise DeviceMismatch(f"refusing to compare runs of different devices: baseline {bdir.name} ran on {bdev}, "
                             f"candidate {cdir.name} on {cdev} (both {bcls}, but their bandwidths differ: the ratio "
                             "would not be a change of the code)")
    metric = metric or default_metric(bs + cs)
    ignore = frozenset(ignore)
    bg, cg = group(bs, metric, ignore), group(cs, metric, ignore)
    if not bg and not cg:
        raise ReportError(f"no sample in either run carries a numeric {metric!r}")
    rows = []
    common = len(set(bg) & set(cg))
    for key in sorted(set(bg) | set(cg)):
        b, c = bg.get(key), cg.get(key)
        row = {"case": key}
        for tag, g in (("baseline", b), ("candidate", c)):
            if g:
                row[tag] = {"median": statistics.median(g["values"]), "min": min(g["values"]),
                            "max": max(g["values"]), "n": len(g["values"])}
        floors = (b or {}).get("floor_s", []) + (c or {}).get("floor_s", [])
        if floors:
            row["floor_s"] = statistics.median(floors)
        if b and c:
            row["ratio"] = row["candidate"]["median"] / row["baseline"]["median"] if row["baseline"]["median"] else None
            row["verdict"] = verdict(b["values"], c["values"])
        else:
            row["verdict"] = "only in baseline" if b else "only in candidate"
        rows.append(row)
    return {"baseline": str(bdir), "candidate": str(cdir), "gpu_class": bcls, "metric": metric, "rule": RULE,
            "ignored_fields": sorted(ignore), "cases": rows, "common_cases": common,
            "critical_path": _critical_paths(bdir, cdir, bs, cs, config)}


#: Timeline tags whose critical paths a report sets side by side when both runs archived their traces.
TIMELINE_TAGS = critical_path.TIMELINE_TAGS


def _critical_paths(bdir: Path, cdir: Path, bs: list[dict] = (), cs: list[dict] = (),
                    config: dict | None = None) -> dict:
    """Per timeline tag both runs archived: the two critical paths (``qualify.critical_path``) and, for each run
    whose samples carry the per-region traffic (``critical_path.gap_from_samples``), its time above the floor per
    region, and per layer position where the projection bytes are known (its samples', or ``config``'s); or the
    reason they could not be read."""
    out = {}
    for tag in TIMELINE_TAGS:
        try:
            b, c = critical_path.from_run(bdir, tag), critical_path.from_run(cdir, tag)
        except ValueError as exc:
            out[tag] = {"error": str(exc)}
            continue
        if b is not None and c is not None:
            out[tag] = {"baseline": b, "candidate": c}
            rows = int(tag[1:])  # b<rows>
            try:  # a timeline whose regions cannot be set against the floor: said, the rest of the report kept
                gaps = {k: critical_path.gap_from_samples(r, samples, rows)
                        for k, r, samples in (("baseline", b, bs), ("candidate", c, cs))}
                if any(gaps.values()):
                    out[tag]["gap_to_floor"] = gaps
                pos = {k: critical_path.position_gaps_from_samples(r, samples, rows, config)
                       for k, r, samples in (("baseline", b, bs), ("candidate", c, cs))}
                if any(pos.values()):
                    out[tag]["position_gaps"] = pos
            except ValueError as exc:
                out[tag]["floor_error"] = str(exc)
    return out


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.6g}"


def markdown(rep: dict, png_note: str) -> str:
    m = rep["metric"]
    lines = [f"# Report: {Path(rep['candidate']).name} vs {Path(rep['baseline']).name}", "",
             f"- GPU class: `{rep['gpu_class']}`", f"- baseline: `{rep['baseline']}`",
             f"- candidate: `{rep['candidate']}`", f"- metric: `{m}` (median per case; noise = min–max)",
             f"- verdict rule: {rep['rule']}", f"- plot: {png_note}"]
    if rep.get("ignored_fields"):
        lines.append(f"- case fields ignored (side-by-side variants): {', '.join(rep['ignored_fields'])}")
    if rep.get("common_cases") == 0:
        lines.append("- **no case in common**: the two runs measured different things (another core, other cases) -- "
                     "nothing below is a comparison")
    lines += ["",
             "| case | baseline median | baseline min–max | candidate median | candidate min–max | ratio c/b "
             "| floor_s | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rep["cases"]:
        b, c = r.get("baseline"), r.get("candidate")
        rng = lambda g: f"{_fmt(g['min'])}–{_fmt(g['max'])} (n={g['n']})" if g else "–"  # noqa: E731
        lines.append(f"| `{r['case']}` | {_fmt(b and b['median'])} | {rng(b)} | {_fmt(c and c['median'])} "
                     f"| {rng(c)} | {_fmt(r.get('ratio'))} | {_fmt(r.get('floor_s'))} | {r['verdict']} |")
    counts: dict[str, int] = {}
    for r in rep["cases"]:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    lines += ["", "Verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), ""]
    for tag, cp in rep.get("critical_path", {}).items():
        lines += [f"## Critical path, timeline {tag}", ""]
        if "error" in cp:
            lines += [f"Not compared: {cp['error']}", ""]
            continue
        lines += ["Each kernel's end minus the previous kernel's end in the graph replay (`qualify/critical_path.py`):",
                  "what it adds to the step, overlap included; medians over replays (and layers).", ""]
        lines += critical_path.compare(cp["baseline"], cp["candidate"]) + [""]
        for key, title, text, table in _FLOOR_SECTIONS:
            if cp.get(key):
                lines += [f"### {title}, timeline {tag}", "", text, ""] + table(cp[key]) + [""]
        if cp.get("floor_error"):
            lines += [f"Not set against the floor: {cp['floor_error']}", ""]
    return "\n".join(lines)


#: The report's sections of a timeline against the floor: (key in its critical-path entry, title, text, table).
_FLOOR_SECTIONS = (
    ("gap_to_floor", "Time above the floor",
     "Each region's critical-path time against its share of the floor: the bytes it must read "
     "(`qualify.replay_floor.region_bytes`: the layers' weights and KV cache, the vocabulary projection, the gathered "
     "embedding rows) over the floor's measured bandwidth; regions that read nothing the floor counts (sampler, "
     "metadata) have a floor of 0.", critical_path.gap_lines),
    ("position_gaps", "Per kernel against its own floor",
     "Each layer position's critical-path time against the bytes it must read over the floor's measured bandwidth: "
     "the projection kernels the layer's projections in order (`replay_floor`'s `layer_projection_bytes`), the "
     "attention kernel the layer's KV cache, every other kernel nothing (`critical_path.position_gaps`).",
     critical_path.position_gap_lines),
)


def short_labels(cases: list[str]) -> list[str]:
    """Plot labels of the cases (JSON objects): only the fields that take more than one value among the cases that
    have them, ``k=v`` joined (the whole case when it is not JSON or nothing differs) -- the Markdown table keeps the
    full case."""
    try:
        parsed = [json.loads(c) for c in cases]
    except ValueError:
        return list(cases)
    if not all(isinstance(c, dict) for c in parsed):
        return list(cases)
    keys = sorted({k for c in parsed for k in c})
    varying = [k for k in keys if len({json.dumps(c[k], sort_keys=True) for c in parsed if k in c}) > 1]
    if not varying:
        return list(cases)
    return [", ".join(f"{k}={c[k]}" for k in varying if k in c) for c in parsed]


def plot(rep: dict, path: Path) -> str:
    """Write the PNG; returns a note for the Markdown (what was written, or why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no report.png written (Markdown only)"
    rows = [r for r in rep["cases"] if r.get("baseline") or r.get("candidate")]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 6.0))
    for i, r in enumerate(rows):
        for dx, tag, color in ((-0.15, "baseline", "tab:blue"), (0.15, "candidate", "tab:orange")):
            g = r.get(tag)
            if g:
                ax.errorbar(i + dx, g["median"], yerr=[[g["median"] - g["min"]], [g["max"] - g["median"]]],
                            fmt="o", color=color, capsize=4, label=tag if i == 0 else None)
        if "floor_s" in r:
            ax.hlines(r["floor_s"], i - 0.35, i + 0.35, colors="k", linestyles="--",
                      label="floor" if not any("floor_s" in q for q in rows[:i]) else None)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(short_labels([r["case"] for r in rows]), rotation=35, ha="right", fontsize=7)
    ax.set_ylabel(rep["metric"])
    ax.set_title(f"{Path(rep['candidate']).name} vs {Path(rep['baseline']).name} ({rep['gpu_class']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"`{path.name}` (medians with min–max bars; dashed line: floor where samples carry floor_s)"


def write_report(rep: dict, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    note = plot(rep, out / "report.png")
    (out / "report.md").write_text(markdown(rep, note))
    (out / "report.json").write_text(json.dumps(rep, indent=2) + "\n")
    return {"markdown": str(out / "report.md"),
            "png": str(out / "report.png") if (out / "report.png").is_file() else None, "note": note}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qualify.report", description=__doc__.split("\n\n")[0])
    p.add_argument("baseline", help="baseline run: a results folder path or its name under results/")
    p.add_argument("candidate", help="candidate run: a results folder path or its name under results/")
    p.add_argument("--metric", default=None, help="metric field (default: first numeric *_s / *_ns field)")
    p.add_argument("--results", default=None, help="folder holding the runs (default: <repo>/results)")
    p.add_argument("--out", default=None, help="output folder (default: <candidate run>/report-vs-<baseline>)")
    p.add_argument("--ignore", default="", metavar="FIELD[,FIELD]",
                   help="case fields left out of the matching (side-by-side variants, e.g. attention)")
    p.add_argument("--config", default=None, metavar="CONFIG_JSON",
                   help="the model's config.json: per-kernel floors for runs archived without their projection bytes")
    args = p.parse_args(argv)
    try:
        config = critical_path.read_config(args.config)
    except ValueError as exc:
        print(f"qualify.report: error: {exc}", file=sys.stderr)
        return 2
    try:
        rep = compare(args.baseline, args.candidate, args.metric, args.results,
                      frozenset(f for f in args.ignore.split(",") if f), config)
    except ReportError as exc:
        print(f"qualify.report: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(rep["candidate"]) / f"report-vs-{Path(rep['baseline']).name}"
    written = write_report(rep, out)
    print(f"qualify.report: {written['markdown']}" + (f", {written['png']}" if written["png"] else "")
          + f" ({written['note']})" * (not written["png"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
