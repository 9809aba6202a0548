"""qualify.report on two synthetic archived runs written in tmp_path."""

from __future__ import annotations

import json

import pytest

from qualify import report as rp


def _run(root, name, gpu_class, cases):
    d = root / name
    d.mkdir(parents=True)
    (d / "environment.json").write_text(json.dumps({"gpu": {"gpu_class": gpu_class}, "git_sha": name}))
    with open(d / "samples.jsonl", "w") as f:
        for case, values in cases.items():
            for seed, v in enumerate(values):
                rec = {"case": {"case": case, "gpu_class": gpu_class, "batch": 1}, "seed": seed, "bytewise_equal": True,
                       "step_s": v, "floor_s": 1.0, "test": f"t::{case}"}
                f.write(json.dumps(rec, sort_keys=True) + "\n")
    return d


BASE = {"fast": [2.0, 2.1, 2.2], "slow": [2.0, 2.1, 2.2], "same": [2.0, 2.1, 2.2], "gone": [3.0]}
CAND = {"fast": [1.5, 1.6, 1.9], "slow": [2.3, 2.4, 2.6], "same": [1.9, 2.05, 2.3], "new": [1.0]}


def test_verdicts_table_and_rule(tmp_path, monkeypatch):
    _run(tmp_path, "base", "sm90", BASE)
    _run(tmp_path, "cand", "sm90", CAND)
    rep = rp.compare("base", "cand", results=tmp_path)
    assert rep["metric"] == "step_s"  # first *_s field, floor_s excepted
    by = {json.loads(r["case"])["case"]: r for r in rep["cases"]}
    assert by["fast"]["verdict"] == "faster"
    assert by["slow"]["verdict"] == "slower"
    assert by["same"]["verdict"] == "within noise"
    assert by["gone"]["verdict"] == "only in baseline" and by["new"]["verdict"] == "only in candidate"
    assert by["fast"]["ratio"] == pytest.approx(1.6 / 2.1)
    assert by["slow"]["candidate"] == {"median": 2.4, "min": 2.3, "max": 2.6, "n": 3}
    assert by["fast"]["floor_s"] == 1.0
    assert "gpu_class" not in json.loads(by["fast"]["case"])  # run-specific fields do not split cases

    out = tmp_path / "out"
    monkeypatch.setattr(rp, "RESULTS", tmp_path)
    assert rp.main(["base", "cand", "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert rp.RULE in md and "| faster |" in md and "| slower |" in md and "| within noise |" in md
    # matplotlib is a dependency: the PNG is always there, a real image with one column of points per case
    png = (out / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and "report.png" in md
    import matplotlib.image

    img = matplotlib.image.imread(out / "report.png")
    assert img.shape[0] > 100 and img.shape[1] > 100 and img[..., :3].std() > 0  # not blank


def test_plot_labels_keep_only_what_differs():
    cases = [json.dumps({"tool": "replay", "capacity": 1, "variant": "decode", "attention": "triton"}),
             json.dumps({"tool": "replay", "capacity": 4, "variant": "decode", "attention": "triton"}),
             json.dumps({"tool": "replay.round", "capacity": 1, "width": 2})]
    assert rp.short_labels(cases) == ["capacity=1, tool=replay", "capacity=4, tool=replay",
                                      "capacity=1, tool=replay.round"]  # width: one value
    assert rp.short_labels(["plain", "text"]) == ["plain", "text"]
    same = [json.dumps({"a": 1})] * 2
    assert rp.short_labels(same) == same


def test_markdown_only_when_matplotlib_missing(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    _run(tmp_path, "base", "sm90", BASE)
    _run(tmp_path, "cand", "sm90", CAND)
    written = rp.write_report(rp.compare("base", "cand", results=tmp_path), tmp_path / "out")
    assert written["png"] is None
    assert "matplotlib is not installed" in (tmp_path / "out" / "report.md").read_text()


def test_gpu_class_mismatch_refused(tmp_path, monkeypatch, capsys):
    _run(tmp_path, "base", "sm90", BASE)
    _run(tmp_path, "cand", "sm100", CAND)
    with pytest.raises(rp.ReportError, match="different GPU classes.*sm90.*sm100"):
        rp.compare("base", "cand", results=tmp_path)
    monkeypatch.setattr(rp, "RESULTS", tmp_path)
    assert rp.main(["base", "cand", "--out", str(tmp_path / "o")]) == 2
    assert "different GPU classes" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_explicit_metric_lists_and_baseline_file(tmp_path):
    d = _run(tmp_path, "base", "cpu", {"a": [1.0]})
    with open(d / "samples.jsonl", "a") as f:
        f.write(json.dumps({"case": {"case": "a", "batch": 1}, "seed": 9, "raw_ns": [5, 6, 7]}) + "\n")
    _run(tmp_path, "cand", "cpu", {"a": [1.0]})
    rep = rp.compare(str(d), tmp_path / "cand", metric="raw_ns", results=tmp_path)
    (row,) = rep["cases"]
    assert row["baseline"]["median"] == 6 and row["verdict"] == "only in baseline"
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "cpu.json").write_text(json.dumps({"run": "base"}))
    assert rp.class_baseline("cpu", tmp_path / "baselines") == "base"
    assert rp.class_baseline("cpu", tmp_path / "baselines", core="Qwen/Qwen3-8B") is None  # no per-core entry
    (tmp_path / "baselines" / "cpu.json").write_text(json.dumps({"run": "base", "cores": {"Qwen/Qwen3-8B": "r8"}}))
    assert rp.class_baseline("cpu", tmp_path / "baselines", core="Qwen/Qwen3-8B") == "r8"
    assert rp.class_baseline("cpu", tmp_path / "baselines", core="Qwen/Qwen3-0.6B") is None
    assert rp.class_baseline("sm90", tmp_path / "baselines") is None
    assert rep["common_cases"] == 0 and "no case in common" in rp.markdown(rep, "none")  # raw_ns: only the baseline
    with pytest.raises(rp.ReportError, match="no samples.jsonl"):
        rp.compare("missing", "cand", results=tmp_path)


def test_default_metric_is_a_duration_not_the_floor_or_a_rate():
    from qualify.report import default_metric

    sample = {"case": {}, "floor_bandwidth_bytes_per_s": 4.3e12, "floor_s": 0.0035, "floor_samples_s": [0.0035],
              "median_ms": 5.6, "replay_s": [0.0056, 0.0057]}  # a gpu_replay record (sorted: floor_* first)
    assert default_metric([sample]) == "replay_s"


def test_every_accepted_baseline_names_a_committed_run_of_its_class():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "results"
    from qualify.main_job import replay_core

    for path in sorted((root / "baselines").glob("*.json")):
        data = json.loads(path.read_text())
        for core, name in [(None, data["run"]), *data.get("cores", {}).items()]:
            run = root / name
            assert (run / "samples.jsonl").is_file() and (run / "environment.json").is_file(), f"{path.name}: {run}"
            env = json.loads((run / "environment.json").read_text())
            assert env["gpu"]["gpu_class"] == path.stem, f"{path.name} names a run of class {env['gpu']['gpu_class']}"
            assert core is None or replay_core(run) == core, f"{path.name}: {name} is not a replay of {core}"


def test_ignored_fields_match_side_by_side_variants(tmp_path):
    """Two variants of one run that differ in one case field (the attention backend): matched only when that field
    is ignored, and the report says so."""
    for name, backend, values in (("a", "triton-unfused", [2.0, 2.1]), ("b", "triton", [1.0, 1.1])):
        d = tmp_path / name
        d.mkdir()
        (d / "environment.json").write_text(json.dumps({"gpu": {"gpu_class": "sm90"}}))
        (d / "samples.jsonl").write_text("".join(json.dumps({"case": {"capacity": 1, "attention": backend},
                                                             "replay_s": v}) + "\n" for v in values))
    apart = rp.compare(tmp_path / "a", tmp_path / "b")
    assert sorted(r["verdict"] for r in apart["cases"]) == ["only in baseline", "only in candidate"]
    rep = rp.compare(tmp_path / "a", tmp_path / "b", ignore=frozenset({"attention"}))
    (row,) = rep["cases"]
    assert row["verdict"] == "faster" and row["ratio"] == pytest.approx(1.05 / 2.05)
    assert "case fields ignored (side-by-side variants): attention" in rp.markdown(rep, "none")


def test_devices_of_one_class_are_not_compared(tmp_path):
    """An H100 and an H200 are both sm90, with different bandwidths: refused by name (``DeviceMismatch``, which the
    main job reports as "no baseline comparison for this device" instead of a failure); the same device compares."""
    for name, device, cases in (("base", "NVIDIA H200", BASE), ("cand", "NVIDIA H100 80GB HBM3", CAND),
                                ("same", "NVIDIA H200", CAND)):
        d = _run(tmp_path, name, "sm90", cases)
        env = json.loads((d / "environment.json").read_text())
        env["gpu"]["name"] = device
        (d / "environment.json").write_text(json.dumps(env))
    with pytest.raises(rp.DeviceMismatch, match="baseline base ran on NVIDIA H200, candidate cand on NVIDIA H100"):
        rp.compare("base", "cand", results=tmp_path)
    assert rp.compare("base", "same", results=tmp_path)["common_cases"] == 3


def test_a_timeline_the_floor_cannot_split_keeps_the_report(tmp_path, monkeypatch):
    """A critical path whose regions cannot be set against the floor (e.g. an eager timeline without layer ranges)
    is said in its section; the timing table and the rest of the report are still written."""
    _run(tmp_path, "base", "sm90", BASE)
    _run(tmp_path, "cand", "sm90", CAND)
    monkeypatch.setattr(rp.critical_path, "from_run", lambda run, tag: {"run": run.name} if tag == "b1" else None)

    def no_region(r, samples, rows):
        raise ValueError("gap to the floor: the timeline has no region ['layers (all)', 'head']")

    monkeypatch.setattr(rp.critical_path, "gap_from_samples", no_region)
    monkeypatch.setattr(rp.critical_path, "compare", lambda b, c: [f"{b['run']} against {c['run']}"])
    rep = rp.compare("base", "cand", results=tmp_path)
    assert "no region" in rep["critical_path"]["b1"]["floor_error"] and len(rep["cases"]) == 5
    text = rp.markdown(rep, "none")
    assert "base against cand" in text and "Not set against the floor: gap to the floor" in text
