"""``qualify.compile_time``: every compiled step against the eager one, its exit status, its refusals."""

from __future__ import annotations

import json

import pytest

from qualify import compile_time


def test_a_scope_compares_every_step_and_exits_zero_when_equal(tmp_path):
    out = tmp_path / "ct.json"
    assert compile_time.main(["--layers", "1", "--decode", "1,2", "--prefill", "8", "--scopes", "regional",
                              "--vocab", "256", "--device", "cpu", "--json", str(out),
                              "--out", str(tmp_path / "res")]) == 0
    report = json.loads(out.read_text())
    (run,) = (tmp_path / "res").iterdir()  # archived: one record per scope
    (record,) = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert record["case"]["scope"] == "regional" and record["bytewise_equal_to_eager"]
    r = report["scopes"]["regional"]
    # each prefill chunk and each decode capacity over its full batch (the check covered decode-1x1 alone before)
    assert r["steps_compared"] == ["decode-1x1", "decode-2x1", "prefill-1x8"] and r["steps_differing"] == []
    assert r["bytewise_equal_to_eager"] and report["failures"] == [] and report["config"]["device"] == "cpu"
    assert r["cache_entries"]["batch_tensors"] >= 1


def test_failures_name_each_failed_scope():
    report = {"scopes": {"regional": {"error": "Traceback ... ValueError: boom"},
                         "whole": {"bytewise_equal_to_eager": False, "steps_differing": ["decode-4x1"]},
                         "third": {"timed_out_after_s": 5.0}, "fine": {"bytewise_equal_to_eager": True}}}
    assert compile_time.failures(report) == ["regional: the child failed: Traceback ... ValueError: boom",
                                             "whole: compiled steps differ from eager: ['decode-4x1']",
                                             "third: timed out after 5.0 s"]


@pytest.mark.parametrize("argv,needle", [(["--scopes", "bogus"], "--scopes 'bogus'"), (["--decode", "1,x"], "--decode"),
                                         (["--prefill", "0"], "--prefill '0'"), (["--layers", "0"], "--layers 0")])
def test_bad_arguments_are_refused_by_name_before_any_work(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        compile_time.main(argv)
    assert exc.value.code == 2 and needle in capsys.readouterr().err
