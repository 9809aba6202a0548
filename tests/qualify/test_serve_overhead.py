"""``python -m qualify.serve_overhead`` on CPU: runs the scheduler without HTTP and prints sane JSON."""

from __future__ import annotations

import json

from qualify.serve_overhead import main


def test_serve_overhead_prints_per_step_wall_and_marks_gpu_unavailable_on_cpu(tmp_path, capsys):
    out = tmp_path / "o.json"
    assert main(["--requests", "1,3", "--max-tokens", "6", "--json", str(out), "--device", "cpu"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["requests"] == [1, 3] and printed["max_tokens"] == 6
    assert printed["gpu_timing"].startswith("unavailable")
    steps = printed["steps"]
    assert steps and printed["decode_steps"] == len(steps)
    # every request decodes 5 tokens after its first (sampled by the prefill): 5 + 15 row-steps in all,
    # the single request's run alone at batch 1
    alone = [s["rows"] for s in steps if s["requests"] == 1]
    assert 1 <= len(alone) <= 5 and set(alone) == {1}
    assert sum(s["rows"] for s in steps if s["requests"] == 3) <= 15
    assert all(1 <= s["rows"] <= 3 and s["wall_ms"] > 0 and s["gpu_ms"] is None and s["host_ms"] is None
               for s in steps)
    for rows, b in printed["by_batch"].items():
        assert b["steps"] == sum(s["rows"] == int(rows) for s in steps)
        assert b["wall_ms_median"] > 0 and b["gpu_ms_median"] is None and b["host_over_gpu"] is None


def test_serve_overhead_refuses_bad_request_counts(capsys):
    import pytest

    for bad in ("0", "x", "2,-1"):
        with pytest.raises(SystemExit):
            main(["--requests", bad, "--device", "cpu"])
        assert "--requests" in capsys.readouterr().err
