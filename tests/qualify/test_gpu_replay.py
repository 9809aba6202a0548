"""``qualify.gpu_replay`` on CPU (the tool's mechanics; the timings mean nothing here): raw samples archived in
the report format, and ``--check-compiled`` both passing on the real compiled step and catching a planted defect."""

from __future__ import annotations

import json
import math

import pytest

from ignition.graphs.catalog import PreparedGraphs
from qualify import gpu_replay


@pytest.fixture(scope="module")
def core():
    from helios.runtime.engine import default_core

    return str(default_core())


def test_replay_archives_raw_samples_and_compiled_equals_uncompiled(core, tmp_path, capsys):
    rc = gpu_replay.main(["--core", core, "--capacities", "1", "--context", "20", "--samples", "4", "--warmup", "1",
                          "--seeds", "0,1", "--check-compiled", "--steps", "4", "--device", "cpu", "--widths", "1,2", "--greedy-variant",
                          "--topk-variant", "8", "--out", str(tmp_path)])
    assert rc == 0
    (run,) = tmp_path.iterdir()
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    timed = [s for s in samples if s["case"]["tool"] == "gpu_replay"]
    assert [(s["case"]["variant"], s["seed"]) for s in timed] == [("decode", 0), ("decode", 1), ("decode_greedy", 0),
                                                                  ("decode_greedy", 1), ("decode_topk", 0),
                                                                  ("decode_topk", 1)]
    assert all(len(s["replay_s"]) == 4 and all(t > 0 for t in s["replay_s"]) for s in timed)
    # the case's traffic against a count of its own: every tensor of the core's shards (their safetensors headers),
    # the tied embedding read whole as the head plus one gathered row per batch row, K and V of every layer over
    # the context -- and the total the ratio divides by is those two
    from safetensors import safe_open

    from ignition.core import load_core

    loaded = load_core(core, verify_checksums=False, progress=False)
    stored = 0
    for name, path in loaded.files.items():
        if name.endswith(".safetensors"):
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    part = f.get_slice(key)
                    stored += math.prod(part.get_shape()) * {"BF16": 2, "F16": 2, "F32": 4}[part.get_dtype()]
    g = loaded.manifest.geometry
    assert g.tie_word_embeddings
    for s in timed:
        traffic, rows = s["traffic"], s["case"]["capacity"]
        assert traffic["weight_bytes_read"] == stored + rows * g.hidden_size * 2
        assert traffic["kv_bytes"] == 2 * g.num_layers * g.num_kv_heads * g.head_dim * 2 * 20 * rows
        assert s["traffic_bytes"] == traffic["weight_bytes_read"] + traffic["kv_bytes"]
    # and one layer's four projections (packed qkv, o, packed gate/up, down) for the per-kernel floors: the layers'
    # projection bytes are their weights less the norms (hidden 2 x, head_dim 2 x per layer, the final norm)
    proj = timed[0]["traffic"]["layer_projection_bytes"]
    layers = timed[0]["traffic"]["num_layers"]
    assert len(proj) == 4 and proj[2] == 2 * proj[3]  # gate/up: two [inter, hidden]; down: one
    assert layers * sum(proj) < timed[0]["traffic"]["weight_bytes_read"] - timed[0]["traffic"]["lm_head_bytes"]
    rounds = [s for s in samples if s["case"]["tool"] == "gpu_replay.round"]
    assert sorted((s["case"]["width"], s["seed"]) for s in rounds) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(len(s["replay_s"]) == 4 and s["vs_decode"] > 0 for s in rounds)
    (check,) = [s for s in samples if s["case"]["tool"] == "gpu_replay.check_compiled"]
    assert check["passed"] and check["result"]["compiled_vs_uncompiled"]["kv_bytewise"]
    assert "PASS" in capsys.readouterr().out


def test_check_compiled_catches_a_planted_logit_defect(core, monkeypatch):
    def planted_compile(self, *a, **k):  # "compiled" steps that move one logit by one ulp-ish amount
        for s in self.steps:
            inner = s.fn

            def fn(*inputs, inner=inner, **kw):  # a new logits tensor: the step copies it into its own
                logits, tokens = inner(*inputs, **kw)
                return logits.index_add(1, logits.new_zeros(1, dtype=int), logits.new_full((logits.shape[0], 1), 1e-3)), tokens
            s.fn = fn
        self.stage = "compiled"
        return self

    bench = gpu_replay.ReplayBench(core, (1,), 20, extra=4, compile=False, device="cpu")
    monkeypatch.setattr(PreparedGraphs, "compile", planted_compile)
    result = gpu_replay.check_compiled(bench, 1, 4)
    assert not result["passed"]
    assert not result["compiled_vs_uncompiled"]["logits_bytewise"]
    assert result["repeatability"]["logits_bytewise"]


def test_an_attention_backend_that_cannot_run_here_is_refused_by_name(core, capsys):
    rc = gpu_replay.main(["--core", core, "--capacities", "1", "--context", "20", "--samples", "2", "--device", "cpu",
                          "--attention", "triton", "--no-archive"])
    assert rc == 2
    assert "attention backend 'triton' unavailable on cpu" in capsys.readouterr().err


def test_interleaved_blocks_alternate_and_split_the_samples():
    calls = []

    def timer(tag):
        def time(n, warmup):
            calls.append((tag, n, warmup))
            return [float(len(calls))] * n
        return time

    a, b = gpu_replay.interleaved([timer("a"), timer("b")], samples=10, warmup=20, blocks=4)
    assert [c[0] for c in calls] == ["a", "b", "b", "a", "a", "b", "b", "a"]  # A B B A A B B A
    assert [c[1] for c in calls if c[0] == "a"] == [3, 3, 2, 2] and len(a) == len(b) == 10
    assert [c[2] for c in calls] == [20, 20, 5, 5, 5, 5, 5, 5]  # the first block of each warms up fully
    calls.clear()
    raws = gpu_replay.interleaved([timer("a"), timer("b"), timer("a2")], samples=6, warmup=3, blocks=3)
    assert [c[0] for c in calls] == ["a", "b", "a2", "a2", "b", "a", "a", "b", "a2"]  # --ab-null's three
    assert [len(r) for r in raws] == [6, 6, 6]
    assert gpu_replay.parse_ab("FLARE_GEMV_DOT=1:FLARE_PDL=0") == {"FLARE_GEMV_DOT": "1", "FLARE_PDL": "0"}
    for bad in ("GEMV_DOT=1", "FLARE_X", "FLARE_X=", ":"):
        with pytest.raises(ValueError, match="--ab"):
            gpu_replay.parse_ab(bad)


def test_ab_verdict_needs_every_reference_cleared():
    def rng(lo, hi):
        return {"min_ms": lo, "max_ms": hi}

    assert gpu_replay.ab_verdict(rng(1.0, 1.1), [rng(1.2, 1.3)]) == "B faster"
    assert gpu_replay.ab_verdict(rng(1.4, 1.5), [rng(1.2, 1.3)]) == "B slower"
    assert gpu_replay.ab_verdict(rng(1.0, 1.1), [rng(1.05, 1.3)]) == "within noise"
    # faster than A but not than the null A2 (A rebuilt after B, run 28's bias in the other direction): no verdict
    assert gpu_replay.ab_verdict(rng(1.0, 1.1), [rng(1.2, 1.3), rng(0.95, 1.15)]) == "within noise"
    assert gpu_replay.ab_verdict(rng(1.0, 1.1), [rng(1.2, 1.3), rng(1.15, 1.2)]) == "B faster"


@pytest.fixture
def seen(monkeypatch):
    """``FLARE_TRITON_TOPK`` as each decode case's timing saw it (unset when the test starts), in timing order."""
    import os

    monkeypatch.delenv("FLARE_TRITON_TOPK", raising=False)
    seen = []
    real = gpu_replay.ReplayBench.time_case

    def spying(self, cap, seed, samples, warmup, kind="decode"):
        seen.append(os.environ.get("FLARE_TRITON_TOPK"))
        return real(self, cap, seed, samples, warmup, kind)

    monkeypatch.setattr(gpu_replay.ReplayBench, "time_case", spying)
    return seen


def test_ab_side_by_side_in_one_process(core, tmp_path, capsys, seen):
    """``--ab``: each decode case timed on the bench as started (A) and on one built with the switches (B), the
    samples interleaved, both archived; the environment is restored after; without a GPU it needs --eager."""
    import os

    args = ["--core", core, "--capacities", "1", "--context", "20", "--samples", "4", "--warmup", "1",
            "--device", "cpu", "--ab", "FLARE_TRITON_TOPK=0", "--ab-blocks", "2", "--out", str(tmp_path)]
    assert gpu_replay.main(args) == 2 and "needs --eager" in capsys.readouterr().err
    assert gpu_replay.main(args + ["--eager"]) == 0
    assert "FLARE_TRITON_TOPK" not in os.environ
    assert seen == [None, "0", "0", None]  # A B B A, B under its switches
    (run,) = tmp_path.iterdir()
    timed = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["case"].get("ab") for s in timed] == ["A", "B: FLARE_TRITON_TOPK=0"]
    assert all(len(s["replay_s"]) == 4 for s in timed)
    assert "side by side in one process" in capsys.readouterr().out
    # --ab-null: A built once more after B, the three interleaved, A2 archived and printed as the null ratio
    seen.clear()
    assert gpu_replay.main(args + ["--eager", "--ab-null", "--out", str(tmp_path / "null")]) == 0
    assert seen == [None, "0", None, None, "0", None]  # A B A2 A2 B A
    (run,) = (tmp_path / "null").iterdir()
    timed = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["case"].get("ab") for s in timed] == ["A", "B: FLARE_TRITON_TOPK=0", gpu_replay.NULL_LABEL]
    printed = capsys.readouterr().out
    assert "null A2/A" in printed and "paired blocks: " in printed
    assert " vs A (p " in printed and " vs A2 (p " in printed
    b_rec = next(s for s in timed if s["case"]["ab"].startswith("B"))
    assert set(b_rec["paired_blocks"]) == {"A", "A2"} and b_rec["paired_blocks"]["A"]["blocks"] == 2
    assert all("paired_blocks" not in s for s in timed if not s["case"]["ab"].startswith("B"))
    assert gpu_replay.main(["--core", core, "--device", "cpu", "--eager", "--ab-null", "--no-archive"]) == 2
    assert "--ab-null needs --ab" in capsys.readouterr().err


def test_several_ab_entries_share_one_a_side(core, tmp_path, capsys, seen):
    """``--ab`` repeated: one B bench per entry, all interleaved with one A (and the null A2, built after every B);
    each B archived under its own label with its paired blocks against A and A2, each printed with its own header,
    each read back by ``qualify.paired_blocks``; the same switches twice are refused, naming them."""
    import os

    from qualify import paired_blocks

    args = ["--core", core, "--capacities", "1", "--context", "20", "--samples", "4", "--warmup", "1",
            "--device", "cpu", "--eager", "--ab", "FLARE_TRITON_TOPK=0", "--ab", "FLARE_TRITON_TOPK=1",
            "--ab-blocks", "2", "--ab-null", "--out", str(tmp_path)]
    assert gpu_replay.main(args) == 0
    assert "FLARE_TRITON_TOPK" not in os.environ
    assert seen == [None, "0", "1", None, None, "1", "0", None]  # A B1 B2 A2, then the block reversed
    (run,) = tmp_path.iterdir()
    timed = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    labels = ["B1: FLARE_TRITON_TOPK=0", "B2: FLARE_TRITON_TOPK=1"]
    assert [s["case"].get("ab") for s in timed] == ["A", *labels, gpu_replay.NULL_LABEL]
    for rec in timed[1:3]:
        assert set(rec["paired_blocks"]) == {"A", "A2"} and rec["paired_blocks"]["A"]["blocks"] == 2
        assert rec["paired_blocks"]["A"]["median_ratio"] > 0
    printed = capsys.readouterr().out
    headers = [ln for ln in printed.splitlines() if ln.startswith("side by side in one process")]
    assert len(headers) == 2 and all(label in h for label, h in zip(labels, headers))
    entries = paired_blocks.from_samples(timed, 2)
    assert [e["ab"] for e in entries] == labels and all(set(e["vs"]) == {"A", "A2"} for e in entries)
    assert labels[1] in paired_blocks.line(entries[1])
    twice = args[:-2] + ["--ab", "FLARE_TRITON_TOPK=0", "--no-archive"]
    assert gpu_replay.main(twice) == 2
    assert "the same switches given twice" in capsys.readouterr().err
    assert gpu_replay.ab_labels([{"FLARE_X": "1"}]) == ["B: FLARE_X=1"]  # one entry keeps its label


def test_compiled_verdict_bounds_a_non_repeatable_plan_on_logits_kv_and_state():
    """Repeatable uncompiled graph: every field bytewise.  Not repeatable (variable reduction order): logits and KV
    within the two uncompiled runs' difference, tokens and the sampling state equal -- a compiled graph whose KV moved
    past that bound, or whose sampling state differs, fails although its tokens match."""
    exact = {"logits_bytewise": True, "tokens_equal": True, "kv_bytewise": True, "sampling_state_equal": True,
             "logits_max_abs_diff": 0.0, "kv_max_abs_diff": 0.0}
    rule, ok = gpu_replay.compiled_verdict(exact, exact)
    assert ok and "bytewise" in rule
    assert not gpu_replay.compiled_verdict(exact, {**exact, "kv_bytewise": False, "kv_max_abs_diff": 1e-3})[1]
    noisy = {**exact, "logits_bytewise": False, "kv_bytewise": False, "logits_max_abs_diff": 1e-3,
             "kv_max_abs_diff": 2e-3}
    within = {**noisy, "logits_max_abs_diff": 5e-4, "kv_max_abs_diff": 2e-3}
    rule, ok = gpu_replay.compiled_verdict(noisy, within)
    assert ok and "not repeatable" in rule and "0.001" in rule and "0.002" in rule
    assert not gpu_replay.compiled_verdict(noisy, {**within, "kv_max_abs_diff": 3e-3})[1]
    assert not gpu_replay.compiled_verdict(noisy, {**within, "logits_max_abs_diff": 2e-3})[1]
    assert not gpu_replay.compiled_verdict(noisy, {**within, "tokens_equal": False})[1]
    assert not gpu_replay.compiled_verdict(noisy, {**within, "sampling_state_equal": False})[1]


def test_a_check_that_cannot_run_fails_the_run_and_keeps_the_timings(core, tmp_path, capsys, monkeypatch):
    """``--check-compiled`` raising (here planted) is that check's FAIL with the exception named, exit 1, and the run's
    timed samples still archived."""
    def broken(bench, capacity, steps, seed=0):
        raise RuntimeError("planted: the uncompiled graphs could not be prepared")

    monkeypatch.setattr(gpu_replay, "check_compiled", broken)
    rc = gpu_replay.main(["--core", core, "--capacities", "1", "--context", "20", "--samples", "2", "--warmup", "0",
                          "--check-compiled", "--steps", "2", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 1
    assert "FAIL -- the check could not run: RuntimeError('planted" in capsys.readouterr().out
    (run,) = tmp_path.iterdir()
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["case"]["tool"] for s in samples] == ["gpu_replay", "gpu_replay.check_compiled"]
    assert len(samples[0]["replay_s"]) == 2 and samples[1]["passed"] is False


def test_a_b_that_cannot_be_built_is_named_and_the_others_are_timed(core, tmp_path, capsys, monkeypatch):
    """One of several ``--ab`` entries whose bench cannot be built (here planted: a switch this build refuses): named,
    left out, the other B timed against A as usual and archived -- and the run exits 1."""
    import os

    real = gpu_replay.ReplayBench

    def bench(*a, **kw):
        if os.environ.get("FLARE_PLANTED_BROKEN") == "1":
            raise ValueError("planted: this switch cannot be built")
        return real(*a, **kw)

    monkeypatch.setattr(gpu_replay, "ReplayBench", bench)
    args = ["--core", core, "--capacities", "1", "--context", "20", "--samples", "2", "--warmup", "0",
            "--device", "cpu", "--eager", "--ab", "FLARE_PLANTED_BROKEN=1", "--ab", "FLARE_TRITON_TOPK=0",
            "--ab-blocks", "2", "--out", str(tmp_path)]
    assert gpu_replay.main(args) == 1
    err = capsys.readouterr().err
    assert "B1: FLARE_PLANTED_BROKEN=1 could not be built" in err and "planted: this switch" in err
    (run,) = tmp_path.iterdir()
    timed = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["case"].get("ab") for s in timed] == ["A", "B2: FLARE_TRITON_TOPK=0"]
    env = json.loads((run / "environment.json").read_text())
    assert env["gpu_replay"]["ab_failed"][0]["ab"] == "B1: FLARE_PLANTED_BROKEN=1"


def test_a_run_cut_by_its_time_limit_archives_what_it_timed(core, tmp_path, capsys, monkeypatch):
    """SIGTERM (what ``timeout`` sends at a stage's limit) during the rounds: the decode cases timed before it are
    printed and archived, the summary names what was cut, the run exits 1 -- run 171's replay stage, cut at its limit,
    had archived nothing -- and the previous SIGTERM handler is back."""
    import os
    import signal

    def cut(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not cut the run")

    monkeypatch.setattr(gpu_replay.ReplayBench, "time_round", cut)
    before = signal.getsignal(signal.SIGTERM)
    rc = gpu_replay.main(["--core", core, "--capacities", "1", "--context", "20", "--samples", "2", "--warmup", "0",
                          "--seeds", "0,1", "--widths", "1", "--check-compiled", "--steps", "2", "--device", "cpu",
                          "--out", str(tmp_path)])
    assert rc == 1 and signal.getsignal(signal.SIGTERM) is before
    captured = capsys.readouterr()
    assert "incomplete: cut by signal" in captured.err and "SIGTERM" in captured.err
    assert captured.out.count("decode") == 2  # both seeds' decode cases printed
    (run,) = tmp_path.iterdir()
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [(s["case"]["tool"], s["seed"]) for s in samples] == [("gpu_replay", 0), ("gpu_replay", 1)]
    assert all(len(s["replay_s"]) == 2 for s in samples)
    summary = json.loads((run / "environment.json").read_text())["gpu_replay"]
    assert "cut by signal" in summary["incomplete"] and "check-compiled" in summary["incomplete"]
