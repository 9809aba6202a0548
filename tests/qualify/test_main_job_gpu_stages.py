"""``flare qualify``'s GPU stages, driven with a stand-in for gpu_replay (no GPU here): the archived replay run is
compared with the class baseline when one is accepted, and without one the job says how to accept it."""

from __future__ import annotations

import json

from qualify import gpu_replay, main_job


def _fake_replay(root, name, median_s):
    def main(argv):
        run = root / name
        run.mkdir()
        (run / "environment.json").write_text(json.dumps({"gpu": {"gpu_class": "sm90"}}))
        rec = {"case": {"tool": "gpu_replay", "core": "flare-default", "capacity": 1}, "seed": 0, "replay_s": [median_s * f for f in (0.99, 1, 1.01)]}
        (run / "samples.jsonl").write_text(json.dumps(rec) + "\n")
        return 0
    return main


def test_without_a_baseline_the_job_says_how_to_accept_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_replay, "main", _fake_replay(tmp_path, "20261130T000000Z-sm90-abc-gpu-replay", 1e-3))
    (tmp_path / "baselines").mkdir()  # a class baseline of another core only: not this replay's
    (tmp_path / "baselines" / "sm90.json").write_text(json.dumps({"run": "r8b", "cores": {"Qwen/Qwen3-8B": "r8b"}}))
    monkeypatch.setattr("qualify.report.BASELINES", tmp_path / "baselines")
    assert main_job.gpu_stages(tmp_path) == 0
    out = capsys.readouterr().out
    assert "no accepted baseline for flare-default on sm90" in out
    assert '"cores": {"flare-default": "20261130T000000Z-sm90-abc-gpu-replay"}' in out


def test_with_a_baseline_the_report_is_written_and_its_place_printed(tmp_path, monkeypatch, capsys):
    _fake_replay(tmp_path, "20261129T000000Z-sm90-old-gpu-replay", 2e-3)(None)
    monkeypatch.setattr(gpu_replay, "main", _fake_replay(tmp_path, "20261130T000000Z-sm90-new-gpu-replay", 1e-3))
    asked = []
    monkeypatch.setattr("qualify.report.class_baseline",
                        lambda cls, core=None: asked.append((cls, core)) or str(tmp_path / "20261129T000000Z-sm90-old-gpu-replay"))
    assert main_job.gpu_stages(tmp_path) == 0
    report = tmp_path / "20261130T000000Z-sm90-new-gpu-replay" / "report" / "report.md"
    assert report.is_file() and "faster" in report.read_text()
    assert str(report) in capsys.readouterr().out
    assert asked == [("sm90", "flare-default")]  # the baseline of the replayed core
