"""``python -m qualify.serve_overhead`` on CPU: runs the scheduler without HTTP and prints sane JSON."""

from __future__ import annotations

import json

from qualify.serve_overhead import main


def test_serve_overhead_prints_per_step_wall_and_marks_gpu_unavailable_on_cpu(tmp_path, capsys):
    out = tmp_path / "o.json"
    assert main(["--requests", "1,3", "--max-tokens", "6", "--json", str(out), "--device", "cpu",
                 "--out", str(tmp_path / "res")]) == 0
    printed = json.loads(capsys.readouterr().out)
    (run,) = (tmp_path / "res").iterdir()  # archived: one record per decode-only step
    archived = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(archived) == printed["decode_steps"] and archived[0]["case"]["tool"] == "serve_overhead"
    assert printed == json.loads(out.read_text())
    assert printed["requests"] == [1, 3] and printed["max_tokens"] == 6
    assert printed["gpu_timing"].startswith("unavailable")
    steps = printed["steps"]
    assert steps and printed["decode_steps"] == len(steps)
    # a lone request of 6 tokens: its first comes from the prefill, its second from the first decode, which shares
    # the prefill's iteration -- 4 decode-only iterations, at batch 1 (each request generated all 6: the tool
    # refuses a run where one stops early)
    alone = [s["rows"] for s in steps if s["requests"] == 1]
    assert alone == [1, 1, 1, 1]
    assert sum(s["rows"] for s in steps if s["requests"] == 3) <= 15
    assert all(1 <= s["rows"] <= 3 and s["wall_ms"] > 0 and s["gpu_ms"] is None and s["host_ms"] is None
               for s in steps)
    # per run, the steps its whole batch ran: not the 3-request run's wind-down at 1 or 2 rows
    assert set(printed["by_batch"]) == {"1", "3"}
    for n, b in printed["by_batch"].items():
        assert b["steps"] == sum(s["requests"] == int(n) and s["rows"] == int(n) for s in steps) > 0
        assert b["wall_ms_median"] > 0 and b["gpu_ms_median"] is None and b["host_over_gpu"] is None


def test_serve_overhead_refuses_requests_longer_than_the_context(capsys):
    assert main(["--requests", "1", "--max-tokens", "64", "--max-context", "48", "--device", "cpu",
                 "--no-archive"]) == 2
    err = capsys.readouterr().err
    assert "--prompt-tokens 32 + --max-tokens 64 exceed the engine's context of 48" in err


def test_serve_overhead_refuses_bad_request_counts(capsys):
    import pytest

    for bad in ("0", "x", "2,-1"):
        with pytest.raises(SystemExit):
            main(["--requests", bad, "--device", "cpu"])
        assert "--requests" in capsys.readouterr().err
