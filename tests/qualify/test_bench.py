"""``ignition bench`` on CPU with the embedded default core (the mechanics; the timings mean nothing here): raw
samples archived per case and seed, the score recomputed from ``samples.jsonl``, restored state making repeated
rounds identical (and its absence not), exact prefill chunks, and bad arguments exiting 2 naming the flag."""

from __future__ import annotations

import json
import statistics

import pytest

from ignition import bench as bench_mod
from ignition.cli import main as ignition_main
from qualify.gpu_replay import ReplayBench


@pytest.fixture(scope="module")
def core():
    from helios.runtime.engine import default_core

    return str(default_core())


def _run(tmp_path) -> tuple[dict, list[dict]]:
    (run,) = tmp_path.iterdir()
    env = json.loads((run / "environment.json").read_text())
    return env, [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def test_score_is_the_equal_weight_mean_of_per_case_medians_with_seeds_pooled():
    """By hand: case A's seeds pool to 1, 2, 3, 4 ms (median 2.5), case B's one seed to 10, 30, 11 ms (median 11): the
    score is (2.5 + 11) / 2 = 6.75 ms -- not the mean of per-seed medians (A: 2 and 4), not a pooled median over
    cases."""
    a, b = {"capacity": 1}, {"capacity": 4}
    samples = [{"case": a, "seed": 0, "round_s": [0.001, 0.002, 0.003]}, {"case": a, "seed": 1, "round_s": [0.004]},
               {"case": b, "seed": 0, "round_s": [0.010, 0.030, 0.011]}]
    total, medians = bench_mod.score(samples)
    assert total == pytest.approx(6.75) and sorted(medians.values()) == pytest.approx([2.5, 11.0])


def _score(samples: list[dict]) -> float:  # the archived samples' score, by the rule tested above
    return bench_mod.score(samples)[0]


def test_decode_rounds_archived_per_case_and_seed_with_the_score(core, tmp_path, capsys):
    rc = ignition_main(["bench", core, "--capacities", "1,2", "--context", "24", "--samples", "4", "--warmup", "1",
                        "--seeds", "0,1", "--device", "cpu", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    env, samples = _run(tmp_path)
    assert sorted((s["case"]["capacity"], s["seed"]) for s in samples) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for s in samples:
        assert s["case"]["mode"] == "decode" and s["case"]["context"] == 24
        assert len(s["round_s"]) == 4 and all(t > 0 for t in s["round_s"])
        # the round repeated from the restored state: same tokens (and logits), one step since the restore
        assert s["identical"] and s["state_restored"] and s["tokens_first"] == s["tokens_last"]
        assert len(s["tokens_first"]) == s["case"]["capacity"]
    # real contexts: each seed reads a different window of the tokenized corpus
    heads = {s["seed"]: s["context_token_head"][0] for s in samples if s["case"]["capacity"] == 1}
    assert heads[0] != heads[1]
    assert env["bench"]["score_ms"] == pytest.approx(_score(samples), rel=1e-12)
    assert env["command_line"][:2] == ["ignition", "bench"]
    assert "score:" in out


def test_without_restoration_rounds_do_not_repeat(core):
    """The restoration is what makes rounds repeat: without it the sampling counters run on and sampled tokens
    change (the embedded core's defaults sample at temperature 1)."""
    b = ReplayBench(core, (4,), 16, compile=False, device="cpu", prefill=(256,))
    stream = bench_mod.context_tokens(b.loaded, "corpus")
    kept = bench_mod.decode_case(b, stream, 4, 0, samples=3, warmup=1)
    assert kept["identical"] and kept["state_restored"]
    lost = bench_mod.decode_case(b, stream, 4, 0, samples=3, warmup=1, restore=False)
    assert not lost["state_restored"] and not lost["identical"]
    assert lost["tokens_first"] == kept["tokens_first"]  # same state before the first round
    assert lost["tokens_last"] != lost["tokens_first"]


def test_prefill_chunks(core, tmp_path, capsys):
    rc = ignition_main(["bench", core, "--prefill", "--prefill-chunk-size", "256", "--context", "20", "--samples", "3",
                        "--warmup", "1", "--seeds", "0,1", "--context-source", "examples", "--device", "cpu",
                        "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr()
    env, samples = _run(tmp_path)
    assert [(s["case"]["mode"], s["case"]["chunk"], s["seed"]) for s in samples] == [("prefill", 256, 0),
                                                                                      ("prefill", 256, 1)]
    for s in samples:
        assert len(s["round_s"]) == 3
        assert s["identical"] and s["state_restored"] and s["kv_rewritten_identically"]
    pooled = [t for s in samples for t in s["round_s"]]
    assert env["bench"]["score_ms"] == pytest.approx(statistics.median(pooled) * 1e3, rel=1e-12)
    # the examples the embedded core refuses (its template takes no images) are named, not silently dropped
    refused = env["bench"]["context_examples_refused"]
    assert refused and all(r["field"].startswith("messages[") and "image" in r["reason"] for r in refused)
    assert env["bench"]["score_ms"] == pytest.approx(_score(samples), rel=1e-12)


@pytest.mark.parametrize("argv, flag", [
    (["--capacities", "3"], "--capacities"),
    (["--prefill", "--prefill-chunk-size", "256", "--capacities", "4"], "--capacities"),
    (["--prefill", "--prefill-chunk-size", "256", "--widths", "2"], "--widths"),
    (["--prefill", "--prefill-chunk-size", "100"], "--prefill-chunk-size"),
    (["--prefill"], "--prefill-chunk-size"),
    (["--prefill-chunk-size", "256"], "--prefill-chunk-size"),
    (["--context", "5000"], "--context"),
])
def test_bad_arguments_exit_2_naming_the_flag(core, tmp_path, capsys, argv, flag):
    rc = ignition_main(["bench", core, *argv, "--device", "cpu", "--samples", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and flag in err, err
    assert not any(tmp_path.iterdir())


def test_replay_bench_checks_the_prefill_chunk(core):
    with pytest.raises(ValueError, match="--prefill-chunk-size"):
        ReplayBench(core, (1,), 8, compile=False, device="cpu", prefill=(100,))


def test_speculative_rounds_per_capacity_and_width_with_state_restored(core, tmp_path):
    rc = ignition_main(["bench", core, "--capacities", "2", "--widths", "1,4", "--context", "24", "--samples", "3",
                        "--warmup", "1", "--seeds", "0", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0
    _, samples = _run(tmp_path)
    rounds = {s["case"]["width"]: s for s in samples if s["case"]["mode"] == "round"}
    assert sorted(rounds) == [1, 4]
    for width, s in rounds.items():
        assert s["identical"] and s["state_restored"] and len(s["round_s"]) == 3
        assert all(0 <= a <= width - 1 for a in s["accepted_first"])
    assert ignition_main(["bench", core, "--widths", "9", "--device", "cpu", "--no-archive"]) == 2
