"""``qualify.critical_path``: per-kernel increments of a replayed graph, attributed by the ranged run, on synthetic
traces whose answer is known by construction (and on an archived H200 run where one is committed)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from qualify import critical_path as cp

ROOT = Path(__file__).resolve().parents[2]


def _attributed(layout):
    """A ranged run: ``layout`` = [(region or None, [kernel names])] in launch order."""
    ev, t, corr = [], 0.0, 0
    for region, names in layout:
        start = t
        for name in names:
            corr += 1
            ev.append({"cat": "cuda_runtime", "ph": "X", "ts": t + 0.1, "dur": 0.5, "args": {"correlation": corr}})
            ev.append({"cat": "kernel", "ph": "X", "name": name, "ts": 1000 + t, "dur": 1.0,
                       "args": {"correlation": corr}})
            t += 1.0
        if region is not None:
            ev.append({"cat": "user_annotation", "ph": "X", "name": region, "ts": start, "dur": t - start})
    return ev


def _replay(steps):
    """Replayed kernels: ``steps`` = per replay a list of (name, start, duration)."""
    ev, base = [], 0.0
    for step in steps:
        for name, ts, dur in step:
            ev.append({"cat": "kernel", "ph": "X", "name": name, "ts": base + ts, "dur": dur})
        base += 1000.0
    return ev


LAYOUT = [(None, ["embed"]), ("layer.0", ["qkv", "attn", "o"]), ("layer.1", ["qkv", "attn", "o"]),
          ("head", ["lm_head"])]
#: one replay: overlapping kernels (attn launches before qkv ends), a memset node inside layer.1
STEP = [("embed", 0, 2), ("qkv", 2, 10), ("attn", 5, 9), ("o", 14, 4), ("qkv", 18, 10), ("attn", 27, 5),
        ("memset32", 32, 1), ("o", 33, 4), ("lm_head", 37, 20)]


def test_increments_add_up_per_region_and_per_layer_position():
    r = cp.increments(_replay([STEP, STEP]), _attributed(LAYOUT), replays=2)
    assert r["span_us"] == 57 and r["layers"] == 2
    # ends: 2, 12, 14, 18, 28, 32, 33, 37, 57 -> increments 2 | 10 2 4 | 10 4 1 4 | 20; the memset node's 1 us
    # counts with layer.1's attention before it
    assert r["per_region"] == {"eager glue (embedding, rotary, metadata)": 2, "layers (all)": 35, "head": 20}
    assert [(p["name"], p["median_us"]) for p in r["positions"]] == [("qkv", 10), ("attn", 3.5), ("o", 4)]
    assert r["positions"][1]["min_us"] == 2 and r["positions"][1]["max_us"] == 5
    # launch leads: attention started 7 us (layer.0) and 1 us (layer.1) before the qkv before it ended; the rest at
    # their predecessor's end
    assert [p["lead_us"] for p in r["positions"]] == [0, 4, 0]
    late = [(n, ts + 2 * (n == "lm_head"), dur) for n, ts, dur in STEP]  # the head 2 us after the last layer
    assert cp.increments(_replay([late]), _attributed(LAYOUT), replays=1)["region_kernels"]["head"][0]["lead_us"] == -2
    assert r["per_layer_us"] == pytest.approx(17.5)  # layers of 16 and 19 us
    assert sum(r["per_region"].values()) == r["span_us"]
    # outside the layers, each region's kernels in order: the glue's embed, the head's lm_head
    assert {k: [(p["name"], p["median_us"]) for p in v] for k, v in r["region_kernels"].items()} == {
        "eager glue (embedding, rotary, metadata)": [("embed", 2)], "head": [("lm_head", 20)]}


def test_mismatched_runs_and_uneven_replays_are_refused():
    with pytest.raises(ValueError, match="do not split into 4 replays"):
        cp.increments(_replay([STEP, STEP]), _attributed(LAYOUT), replays=4)
    other = [(None, ["embed"]), ("layer.0", ["qkv", "gate"])]
    with pytest.raises(ValueError, match="attributed run"):
        cp.increments(_replay([STEP]), _attributed(other), replays=1)
    # a kernel only the replay runs that is no graph memcpy / memset node: named, not added to layer.0's o
    extra = STEP[:4] + [("gemv_extra", 18, 10)] + [(n, ts + 10, d) for n, ts, d in STEP[4:]]
    with pytest.raises(ValueError, match="kernel 'gemv_extra' is not in the attributed run"):
        cp.increments(_replay([extra]), _attributed(LAYOUT), replays=1)


def test_compare_pairs_layer_positions_by_kernel_name():
    """A launch one side does not run (the decode reduce a switch folds into the attention) pairs with "-", and the
    kernels after it still meet their own; kernels that differ in place pair by index with both names shown."""
    def pos(names):
        return [{"position": j, "name": n, "median_us": 1.0 + j, "min_us": 1.0, "max_us": 9.0, "lead_us": 0.0}
                for j, n in enumerate(names)]

    base = pos(["_fused_gemv_kernel", "_rope_decode_kernel", "_paged_decode_reduce_kernel", "_fused_gemv_kernel",
                "_fused_gemv_kernel"])
    cand = pos(["_fused_gemv_kernel", "_rope_decode_kernel", "_fused_gemv_kernel", "_fused_gemv_kernel"])
    pairs = cp.aligned_positions(base, cand)
    assert [(b and b["position"], c and c["position"]) for b, c in pairs] == [(0, 0), (1, 1), (2, None), (3, 2),
                                                                              (4, 3)]
    rows = cp._position_rows(base, cand)
    assert rows[2] == "| 2 | `_paged_decode_reduce_kernel` | 3.00 (1.00-9.00) | - | - | 0.00 / - |"
    assert rows[3] == "| 3 | `_fused_gemv_kernel` | 4.00 (1.00-9.00) | 3.00 (1.00-9.00) | -1.00 | 0.00 / 0.00 |"
    added = cp._position_rows(cand, base)  # the other way: the candidate's extra kernel at its own position
    assert added[2] == "| -/2 | `_paged_decode_reduce_kernel` | - | 3.00 (1.00-9.00) | - | - / 0.00 |"
    swapped = cp._position_rows(pos(["a", "x", "c"]), pos(["a", "y", "c"]))
    assert swapped[1] == "| 1 | `x / y` | 2.00 (1.00-9.00) | 2.00 (1.00-9.00) | +0.00 | 0.00 / 0.00 |"


def test_compare_and_report_section(tmp_path):
    base = cp.increments(_replay([STEP]), _attributed(LAYOUT), replays=1)
    # layer.0's o_proj 1 us shorter, everything after it 1 us earlier
    faster = [(n, ts - (i > 3), dur - (i == 3)) for i, (n, ts, dur) in enumerate(STEP)]
    cand = cp.increments(_replay([faster]), _attributed(LAYOUT), replays=1)
    md = "\n".join(cp.compare(base, cand))
    assert "| step span | 57.0 | 56.0 | -1.0 |" in md and "| layers (all) | 35.0 | 34.0 | -1.0 |" in md
    assert "| 2 | `o` | 4.00 (4.00-4.00) | 3.50 (3.00-4.00) | -0.50 | 0.00 / 0.00 |" in md
    assert "| 1 | `attn` | 3.50 (2.00-5.00) | 3.50 (2.00-5.00) | +0.00 | 4.00 / 4.00 |" in md
    assert "| head | 0 | `lm_head` | 20.00 (20.00-20.00) | 20.00 (20.00-20.00) | +0.00 |" in md
    for name, b in (("base", base), ("cand", cand)):  # the report reads them from run folders
        d = tmp_path / name
        d.mkdir()
        (d / "replay-b1.trace.json.gz").write_bytes(gzip.compress(json.dumps(
            {"traceEvents": _replay([STEP if name == "base" else faster] * 20)}).encode()))
        (d / "attributed-b1.trace.json").write_text(json.dumps({"traceEvents": _attributed(LAYOUT)}))
    assert cp.from_run(tmp_path / "base", "b1")["per_region"] == base["per_region"]
    assert cp.from_run(tmp_path / "base", "b4") is None

    # the report: both runs' timelines side by side, and the candidate's time above the floor from its decode sample's
    # archived traffic (the baseline's samples predate it: its column is left out)
    from qualify import report

    traffic = {"num_layers": 2, "weight_bytes_read": 40, "lm_head_bytes": 18, "embedding_bytes_gathered": 2,
               "kv_bytes": 0, "total_bytes": 40}
    for name in ("base", "cand"):
        (tmp_path / name / "environment.json").write_text(json.dumps({"gpu": {"gpu_class": "sm90"}}))
        rec = {"case": {"tool": "gpu_replay", "capacity": 1, "variant": "decode"}, "replay_s": [57e-6],
               "floor_s": 40e-6, "floor_bandwidth_bytes_per_s": 1e6}
        if name == "cand":
            rec["traffic"] = traffic
        (tmp_path / name / "samples.jsonl").write_text(json.dumps(rec) + "\n")
    rep = report.compare(tmp_path / "base", tmp_path / "cand")
    gaps = rep["critical_path"]["b1"]["gap_to_floor"]
    assert gaps["baseline"] is None and gaps["candidate"]["over_us"] == pytest.approx(16.0)  # span 56 - floor 40
    md = report.markdown(rep, "none")
    assert "### Time above the floor, timeline b1" in md and "| layers (all) | 20.0 | 34.0 | +14.0 |" in md
    assert "Per kernel against its own floor" not in md  # neither run archived layer_projection_bytes
    # with them: the synthetic layer's kernels (qkv / attn / o) are no projection kernels by name -- said, per run
    rec["traffic"] = {**traffic, "layer_projection_bytes": [4, 6]}
    (tmp_path / "cand" / "samples.jsonl").write_text(json.dumps(rec) + "\n")
    md = report.markdown(report.compare(tmp_path / "base", tmp_path / "cand"), "none")
    assert "### Per kernel against its own floor, timeline b1" in md
    assert "candidate: no per-kernel floor -- 0 projection kernels in a layer () for 2 projections." in md
    # a config stands in for the baseline's missing bytes (its samples carry no traffic at all here: still none)
    config = {"vocab_size": 3, "hidden_size": 2, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 1, "intermediate_size": 5}
    rep = report.compare(tmp_path / "base", tmp_path / "cand", config=config)
    assert rep["critical_path"]["b1"]["position_gaps"]["baseline"] is None
    base_rec = {**rec, "traffic": traffic}  # the baseline's traffic without the projection bytes: the config's
    (tmp_path / "base" / "samples.jsonl").write_text(json.dumps(base_rec) + "\n")
    rep = report.compare(tmp_path / "base", tmp_path / "cand", config=config)
    assert "4 projections" in rep["critical_path"]["b1"]["position_gaps"]["baseline"]["error"]
    (tmp_path / "config.json").write_text("{not json")
    assert report.main([str(tmp_path / "base"), str(tmp_path / "cand"), "--config", str(tmp_path / "config.json"),
                        "--out", str(tmp_path / "rep")]) == 2


def test_short_kernel_names():
    assert cp.short_name("void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortOnesweepKernel<at_cuda_detail::"
                         "cub::detail::radix_sort::policy_hub<float>, true>(int*, float const*)") == \
        "DeviceRadixSortOnesweepKernel"
    assert cp.short_name("at::native::(anonymous namespace)::fill_reverse_indices_kernel(long*, int)") == \
        "fill_reverse_indices_kernel"
    for plain in ("_fused_gemv_kernel", "nvjet_sm90_tst_192x8_64x8_2x1_v_bz_TNT", "triton_poi_fused_copy__16"):
        assert cp.short_name(plain) == plain


def test_gap_to_the_floor_per_region_and_per_layer():
    r = cp.increments(_replay([STEP]), _attributed(LAYOUT), replays=1)
    # 1 byte per us: the layers' floor 20 us (10 per layer), the head's 18, the glue's 2
    gap = cp.gap_to_floor(r, {"layers (all)": 20, "head": 18, "eager glue (embedding, rotary, metadata)": 2}, 1e6)
    assert [(x["region"], x["floor_us"], x["over_us"]) for x in gap["regions"]] == [
        ("layers (all)", 20, 15), ("head", 18, 2), ("eager glue (embedding, rotary, metadata)", 2, 0)]
    assert gap["floor_us"] == 40 and gap["over_us"] == 17 and gap["per_layer_floor_us"] == 10
    md = "\n".join(cp.gap_lines({"candidate": gap}))
    assert "| layers (all) | 20.0 | 35.0 | +15.0 |" in md and "| **step span** | 40.0 | 57.0 | +17.0 |" in md
    assert "candidate 17.50 us against a floor of 10.00 (+7.50 us, 15 us over 2 layers)" in md
    with pytest.raises(ValueError, match="no region"):
        cp.gap_to_floor(r, {"sampler": 5}, 1e6)
    with pytest.raises(ValueError, match="bandwidth"):
        cp.gap_to_floor(r, {"head": 18}, 0)


def test_gap_from_a_runs_own_decode_case_in_the_printed_timeline():
    from qualify import gpu_replay

    r = cp.increments(_replay([STEP]), _attributed(LAYOUT), replays=1)
    traffic = {"num_layers": 2, "weight_bytes_read": 40, "lm_head_bytes": 18, "embedding_bytes_gathered": 2,
               "kv_bytes": 0, "total_bytes": 40}
    case = lambda rows, variant, **kw: {"case": {"capacity": rows, "variant": variant, **kw}, "traffic": traffic,  # noqa
                                        "floor_bandwidth_bytes_per_s": 1e6}
    cases = [case(4, "decode"), case(1, "decode_topk"), case(1, "decode", ab="B: X=1"), case(1, "decode", ab="A")]
    assert cp.gap_from_samples(r, cases[:3], 1) is None  # another batch, another variant, the B side
    assert cp.gap_from_samples(r, cases, 1)["over_us"] == 17
    t = {"capacity": 1, "critical_path": r, "table": "timeline B=1"}
    gpu_replay._add_gap_to_floor(t, cases)
    assert t["gap_to_floor"]["floor_us"] == 40
    assert "time above the floor B=1" in t["table"] and "| layers (all) | 20.0 | 35.0 | +15.0 |" in t["table"]
    failed = {"capacity": 1, "critical_path": {"error": "no trace"}, "table": "timeline B=1"}
    gpu_replay._add_gap_to_floor(failed, cases)
    assert "gap_to_floor" not in failed and failed["table"] == "timeline B=1"


def test_the_b_side_timeline_of_a_side_by_side_is_set_against_as():
    """``gpu_replay --ab ... --timeline``: B's decode timeline carries A's and B's critical paths side by side (A the
    baseline), matched to A's decode timeline of the same rows (not the round's, not another batch's); a B profile
    that fails, or an A side without a critical path, is said in the entry, never raised."""
    from qualify import gpu_replay

    base = cp.increments(_replay([STEP]), _attributed(LAYOUT), replays=1)
    # B: layer.0's o_proj 1 us shorter, everything after it 1 us earlier
    cand = cp.increments(_replay([[(n, ts - (i > 3), dur - (i == 3)) for i, (n, ts, dur) in enumerate(STEP)]]),
                         _attributed(LAYOUT), replays=1)
    other = cp.increments(_replay([[(n, ts, 2 * dur) for n, ts, dur in STEP]]), _attributed(LAYOUT), replays=1)
    a_side = [{"capacity": 4, "width": None, "critical_path": other, "table": "A B=4"},
              {"capacity": 1, "width": 1, "critical_path": other, "table": "A B=1 W=1"},
              {"capacity": 1, "width": None, "critical_path": base, "table": "A B=1"},
              {"capacity": 1, "difference": ["B=1 W=1", "B=1"], "table": "difference"}]
    t = gpu_replay.ab_timeline(a_side, 1, "B: X=1", lambda: {"capacity": 1, "width": None, "critical_path": cand,
                                                              "table": "timeline B=1"})
    assert t["ab"] == "B: X=1" and t["table"].startswith("timeline of the B side (B: X=1), B=1:\ntimeline B=1\n")
    assert "| step span | 57.0 | 56.0 | -1.0 |" in t["table"]  # against A's decode B=1 (57 us), not the others
    assert "| 2 | `o` | 4.00 (4.00-4.00) | 3.50 (3.00-4.00) | -0.50 | 0.00 / 0.00 |" in t["table"]

    def broken():
        raise RuntimeError("profiler gone")

    failed = gpu_replay.ab_timeline(a_side, 1, "B: X=1", broken)
    assert "profiler gone" in failed["error"] and "profiler gone" in failed["table"] and failed["capacity"] == 1
    alone = gpu_replay.ab_timeline(a_side[:2], 1, "B: X=1", lambda: {"capacity": 1, "critical_path": cand,
                                                                     "table": "timeline B=1"})
    assert "no A / B comparison (A: missing; B: ok)" in alone["table"] and "step span" not in alone["table"]


@pytest.mark.parametrize("compiled", [True, False])
def test_the_b_side_timeline_profiles_b_under_its_switches_with_fresh_dynamo_caches(monkeypatch, compiled):
    """The B side's timeline runs under B's switches and, for compiled steps, with Dynamo's caches reset before and
    after: its attributed run calls the compiled regions uncaptured, and caches filled by A's attributed run would
    otherwise run A's kernels in B's place (run 113).  A's environment is back afterwards."""
    import os

    import torch

    from qualify import gpu_replay, timeline

    events = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))

    def profile(bench, cap, trace_dir, prefix=""):
        events.append(("timeline", bench, cap, prefix, os.environ.get("FLARE_X_SWITCH")))
        return {"capacity": cap}

    monkeypatch.setattr(timeline, "timeline", profile)
    monkeypatch.delenv("FLARE_X_SWITCH", raising=False)
    make_b = gpu_replay.b_timeline_maker("bench-b", {"FLARE_X_SWITCH": "1"}, 4, "traces", compiled=compiled)
    assert events == []  # nothing runs until ab_timeline calls it
    assert make_b() == {"capacity": 4}
    inside = ("timeline", "bench-b", 4, "ab-", "1")
    assert events == (["reset", inside, "reset"] if compiled else [inside])
    assert "FLARE_X_SWITCH" not in os.environ


#: one layer's positions as the Qwen3-8B one-row step runs them, with made-up critical-path times (us)
LAYER_KERNELS = [("_fused_gemv_kernel", 50.0), ("_rope_decode_kernel", 12.0), ("_paged_decode_reduce_kernel", 2.0),
                 ("_fused_gemv_kernel", 25.0), ("_rms_norm_kernel", 1.0), ("nvjet_sm90_tst_192x8", 110.0),
                 ("_fused_gemv_kernel", 70.0)]


def _positions(kernels=LAYER_KERNELS) -> dict:
    return {"positions": [{"position": j, "name": n, "median_us": us, "min_us": us, "max_us": us, "lead_us": 0.0}
                          for j, (n, us) in enumerate(kernels)]}


def test_position_gaps_give_each_projection_kernel_its_bytes_and_the_attention_its_kv():
    # 1 byte per us: the projections' floors are their bytes (qkv 40, o 20, gate/up 100, down 60), the attention's
    # the layer's KV (5); the reduce and the norm read nothing the floor counts
    g = cp.position_gaps(_positions(), [40, 20, 100, 60], 5, 1e6)
    assert [(x["bytes"], x["floor_us"], x["over_us"]) for x in g["rows"]] == [
        (40, 40, 10), (5, 5, 7), (0, 0, 2), (20, 20, 5), (0, 0, 1), (100, 100, 10), (60, 60, 10)]
    assert g["per_layer_us"] == 270 and g["per_layer_floor_us"] == 225
    assert g["rows"][0]["tb_per_s"] == pytest.approx(40 / 50e-6 / 1e12) and g["rows"][2]["tb_per_s"] is None
    md = "\n".join(cp.position_gap_lines({"candidate": g}))
    assert "| 5 | `nvjet_sm90_tst_192x8` | projection 2 | 110.00 | 0.0 | 100.00 | +10.00 |" in md
    assert "| 1 | `_rope_decode_kernel` | attention | 12.00 |" in md and "| 2 | `_paged_decode_reduce_kernel` | - |" in md
    assert "| | **layer** | | 270.00 | | 225.00 | +45.00 | |" in md
    # the projections named (the manifest's modules) where the samples carry them; a count that does not match: refused
    names = ["self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"]
    named = cp.position_gaps(_positions(), [40, 20, 100, 60], 5, 1e6, names)
    assert [x["operator"] for x in named["rows"]] == [names[0], "attention", "-", names[1], "-", names[2], names[3]]
    with pytest.raises(ValueError, match="3 projection names for 4 projections"):
        cp.position_gaps(_positions(), [40, 20, 100, 60], 5, 1e6, names[:3])
    # another layer structure: the bytes cannot be given out -- said, not guessed
    assert "3 projection kernels" in cp.position_gaps(_positions(LAYER_KERNELS[:6]), [40, 20, 100, 60], 5, 1e6)["error"]
    two = LAYER_KERNELS + [("flash_attn_fwd", 3.0)]
    assert "2 attention kernels" in cp.position_gaps(_positions(two), [40, 20, 100, 60], 5, 1e6)["error"]
    assert "no per-kernel floor" in "\n".join(cp.position_gap_lines(
        {"baseline": cp.position_gaps(_positions(two), [40, 20, 100, 60], 5, 1e6)}))
    with pytest.raises(ValueError, match="bandwidth"):
        cp.position_gaps(_positions(), [40, 20, 100, 60], 5, 0)


def test_position_gaps_from_a_runs_own_decode_case_in_the_printed_timeline():
    from qualify import gpu_replay

    r = {**cp.increments(_replay([STEP]), _attributed(LAYOUT), replays=1), **_positions()}  # the positions replaced
    before = {"num_layers": 2, "weight_bytes_read": 40, "lm_head_bytes": 18, "embedding_bytes_gathered": 2,
              "kv_bytes": 10, "total_bytes": 50}
    old = {"case": {"capacity": 1, "variant": "decode"}, "traffic": before,
           "floor_bandwidth_bytes_per_s": 1e6}  # archived before layer_projection_bytes
    new = {**old, "traffic": {**before, "layer_projection_bytes": [40, 20, 100, 60]}}
    assert cp.position_gaps_from_samples(r, [old], 1) is None
    assert cp.position_gaps_from_samples(r, [old, new], 1)["rows"][1]["bytes"] == 5  # 10 bytes of KV over 2 layers
    t = {"capacity": 1, "critical_path": r, "table": "timeline B=1"}
    gpu_replay._add_gap_to_floor(t, [new])
    assert t["position_gaps"]["per_layer_floor_us"] == 225
    assert "per layer position B=1 against its own floor" in t["table"]


def test_cli_rereads_an_archived_run_with_the_projection_bytes_of_a_config(tmp_path, capsys):
    """``python -m qualify.critical_path RUN --config CONFIG``: a run archived without ``layer_projection_bytes``
    gets its per-kernel floors from the model's config (the geometry's packed qkv, o, packed gate/up, down)."""
    names = [n for n, _ in LAYER_KERNELS]
    layout = [(None, ["embed"]), ("layer.0", names), ("layer.1", names), ("head", ["lm_head"])]
    step, t = [("embed", 0.0, 1.0)], 1.0
    for _ in range(2):
        for n, us in LAYER_KERNELS:  # back to back: each kernel's increment is its duration
            step.append((n, t, us))
            t += us
    step.append(("lm_head", t, 5.0))
    (tmp_path / "replay-b1.trace.json.gz").write_bytes(gzip.compress(json.dumps(
        {"traceEvents": _replay([step] * 20)}).encode()))
    (tmp_path / "attributed-b1.trace.json").write_text(json.dumps({"traceEvents": _attributed(layout)}))
    traffic = {"num_layers": 2, "weight_bytes_read": 1, "lm_head_bytes": 0, "embedding_bytes_gathered": 0,
               "kv_bytes": 10, "total_bytes": 11}
    (tmp_path / "samples.jsonl").write_text(json.dumps(
        {"case": {"tool": "gpu_replay", "capacity": 1, "variant": "decode", "context": 4}, "traffic": traffic,
         "floor_bandwidth_bytes_per_s": 1e6}) + "\n")
    # hidden 2, 2 heads of 1, 1 KV head, intermediate 5: qkv 2 x 4 x 2 bytes = 16, o 8, gate/up 40, down 20
    config = {"vocab_size": 3, "hidden_size": 2, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 1, "intermediate_size": 5}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert cp.main([str(tmp_path)]) == 0
    assert "no projection bytes in the samples (pass --config)" in capsys.readouterr().out
    assert cp.main([str(tmp_path), "--config", str(tmp_path / "config.json")]) == 0
    out = capsys.readouterr().out
    assert "critical path B=1: span 546.0 us" in out and "per layer 270.0 us (2 layers)" in out
    # 40 bytes at 1 byte/us; the config's geometry names the packed projections
    assert "| 5 | `nvjet_sm90_tst_192x8` | mlp.gate_up_proj | 110.00 | 0.0 | 40.00 | +70.00 |" in out
    assert "| 1 | `_rope_decode_kernel` | attention | 12.00 | 0.0 | 5.00 | +7.00 |" in out  # 10 bytes of KV / 2 layers
    assert cp.main([str(tmp_path / "nothing")]) == 2
    assert "samples.jsonl" in capsys.readouterr().err  # the error names the file it did not find
    assert cp.main([str(tmp_path), "--config", str(tmp_path / "missing.json")]) == 2
    assert "--config" in (err := capsys.readouterr().err) and "missing.json" in err
    # a timeline that cannot be read (3 kernels do not split into the 20 replays): named, and the exit says so
    (tmp_path / "replay-b4.trace.json.gz").write_bytes(gzip.compress(json.dumps(
        {"traceEvents": _replay([step[:3]])}).encode()))
    (tmp_path / "attributed-b4.trace.json").write_text(json.dumps({"traceEvents": _attributed(layout)}))
    assert cp.main([str(tmp_path)]) == 1
    assert "timeline b4" in capsys.readouterr().err


def short(name: str) -> str:
    return "nvjet" if name.startswith("nvjet") else name


def test_an_archived_h200_run_decomposes_into_its_span():
    run = ROOT / "results" / "20261201T072115Z-sm90-gpu-replay-0.6B"
    if not (run / "replay-b1.trace.json.gz").is_file():
        pytest.skip("the archived run is not in this checkout")
    r = cp.from_run(run, "b1")
    assert r["layers"] == 28 and len(r["positions"]) == 6
    assert sum(r["per_region"].values()) == pytest.approx(r["span_us"], rel=0.02)
    assert [p["name"] for p in r["positions"]][:3] == ["_fused_gemv_kernel", "_rope_decode_kernel",
                                                       "_paged_decode_reduce_kernel"]
    assert all(p["lead_us"] > 0 for p in r["positions"])  # every kernel of a layer is a PDL launch there
    run = ROOT / "results" / "20261201T141844Z-sm90-gpu-replay-8B"
    if (run / "replay-b1.trace.json.gz").is_file():  # Qwen3-8B: gate/up on cuBLAS, so down cannot launch early
        pos = cp.from_run(run, "b1")["positions"]
        assert [short(p["name"]) for p in pos[-2:]] == ["nvjet", "_fused_gemv_kernel"] and pos[-1]["lead_us"] <= 0
        assert pos[0]["lead_us"] > 10  # qkv launches during the down projection before it


def test_round_timelines_follow_timeline_widths_each_against_decode(monkeypatch):
    """``--timeline-widths``: per batch 1 and 4, the decode timeline, then one per listed round width the bench
    times (others left out), each with its difference against decode; a failed profile is an entry, and a round is
    not compared with a failed decode."""
    from types import SimpleNamespace

    from qualify import gpu_replay, timeline

    def profile(bench, cap, trace_dir, width=None, kind="decode"):
        if (cap, width) in bench.broken:
            raise RuntimeError(f"profiler gone at {cap}/{width}")
        return {"capacity": cap, "width": width, "table": f"t {cap} {width}"}

    monkeypatch.setattr(timeline, "timeline", profile)
    monkeypatch.setattr(timeline, "difference", lambda a, b: {"difference": (a["width"], b["width"]),
                                                              "capacity": a["capacity"]})
    monkeypatch.setattr(gpu_replay, "_add_gap_to_floor", lambda t, cases: t.update(gap=True))
    bench = SimpleNamespace(capacities=(1, 4, 8), widths=(1, 2, 4), broken={(4, None)}, variants=())
    got = gpu_replay.decode_and_round_timelines(bench, (1, 2, 8), "traces", [])
    plain = [(t["capacity"], t.get("width"), "difference" in t, "error" in t) for t in got]
    assert plain == [(1, None, False, False), (1, 1, False, False), (1, 2, False, False),
                     (1, None, True, False), (1, None, True, False),  # W=1 and W=2 each against decode
                     (4, None, False, True), (4, 1, False, False), (4, 2, False, False)]  # decode failed: no diffs
    assert [t["difference"] for t in got if "difference" in t] == [(None, 1), (None, 2)]
    assert got[0]["gap"] and "gap" not in got[1]  # the floor gap on decode only
    assert "profiler gone at 4/None" in got[5]["table"]
    assert [t.get("width") for t in gpu_replay.decode_and_round_timelines(bench, (), "traces", [])
            if "difference" not in t] == [None, None]  # no widths: decode only (B=4's failed)


def test_variant_timelines_follow_timeline_variants_each_against_decode(monkeypatch):
    """``--timeline-variants``: after decode (and the rounds), one timeline per listed decode variant the bench
    prepared (others left out), profiled as that step kind, each with its difference against decode; labels name it."""
    from types import SimpleNamespace

    from qualify import gpu_replay, timeline

    seen = []

    def profile(bench, cap, trace_dir, width=None, kind="decode"):
        seen.append((cap, width, kind))
        t = {"capacity": cap, "width": width, "graph_elapsed": {"median_ms": 1.0 + (kind != "decode")},
             "attributed": {"per_range": {}, "per_operator": {}}}
        return {**t, **({} if kind == "decode" else {"kind": kind})}

    monkeypatch.setattr(timeline, "timeline", profile)
    monkeypatch.setattr(gpu_replay, "_add_gap_to_floor", lambda t, cases: None)
    bench = SimpleNamespace(capacities=(1,), widths=(1,), variants=("decode_greedy",))
    got = gpu_replay.decode_and_round_timelines(bench, (1,), "traces", [], ("decode_greedy", "decode_topk"))
    assert seen == [(1, None, "decode"), (1, 1, "decode"), (1, None, "decode_greedy")]  # decode_topk not prepared
    diffs = [t for t in got if "difference" in t]
    assert [d["difference"] for d in diffs] == [["B=1 W=1", "B=1"], ["B=1 decode_greedy", "B=1"]]
    assert diffs[1]["graph_elapsed_us"] == pytest.approx(1000.0)
    assert timeline.step_label({"capacity": 4, "width": 2}) == "B=4 W=2 round"


@pytest.mark.parametrize("argv,needle", [(["--timeline-variants", "decode_fast"], "decode_greedy and/or"),
                                         (["--timeline-variants", "decode_greedy"], "--greedy-variant")])
def test_timeline_variants_rejects_an_unknown_or_untimed_variant(capsys, argv, needle):
    from qualify import gpu_replay

    with pytest.raises(SystemExit) as exc:
        gpu_replay.main(["--core", "no-such-core", *argv, "--no-archive"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--timeline-variants" in err and needle in err


@pytest.mark.parametrize("bad", ["1,x", "0"])
def test_timeline_widths_rejects_a_bad_value_naming_the_option(capsys, bad):
    from qualify import gpu_replay

    with pytest.raises(SystemExit) as exc:
        gpu_replay.main(["--core", "no-such-core", "--timeline-widths", bad, "--no-archive"])
    assert exc.value.code == 2 and "--timeline-widths" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["--seeds", "x"], "--seeds 'x': expected comma-separated integers"),
    (["--seeds", ","], "--seeds ',': expected at least one value"),
    (["--capacities", "1,x"], "--capacities '1,x'"),
    (["--capacities", "0,1"], "--capacities '0,1': [0] below 1"),
    (["--widths", "0"], "--widths '0'"),
    (["--check-compiled", "--steps", "0"], "--steps 0: must be >= 1 with --check-compiled"),
    (["--samples", "0"], "--samples 0: must be >= 1"),
    (["--ab-blocks", "0"], "--ab-blocks 0"),
    (["--timeline", "--device", "cpu"], "--timeline needs a CUDA GPU"),
    (["--timeline", "--device", "cuda", "--capacities", "8"], "--capacities 8 has neither"),
    (["--timeline", "--device", "cuda", "--eager"], "--timeline with --eager")])
def test_gpu_replay_refuses_bad_arguments_by_name_before_loading_anything(capsys, argv, needle):
    """Every refusal names its option, and comes before the core is even looked for (``no-such-core``): nothing is
    timed and then lost to a late failure."""
    from qualify import gpu_replay

    with pytest.raises(SystemExit) as exc:
        gpu_replay.main(["--core", "no-such-core", *argv, "--no-archive"])
    assert exc.value.code == 2 and needle in capsys.readouterr().err


def test_a_decode_timeline_the_floor_cannot_split_is_kept(monkeypatch):
    """``gpu_replay --timeline``: a decode timeline whose critical path has no layer ranges (one "step" region, as an
    eager step's) keeps its table and kernel counts; the floor's refusal is said beside them, not in their place."""
    from types import SimpleNamespace

    from qualify import gpu_replay, timeline

    def fake(bench, cap, trace_dir, width=None, kind="decode"):
        return {"capacity": cap, "width": width, "table": f"timeline B={cap}", "kernels": 7,
                "critical_path": {"per_region": {"step": 100.0}, "span_us": 100.0, "layers": 0, "per_layer_us": 0.0}}

    monkeypatch.setattr(timeline, "timeline", fake)
    traffic = {"num_layers": 2, "weight_bytes_read": 40, "lm_head_bytes": 18, "embedding_bytes_gathered": 2,
               "kv_bytes": 10, "total_bytes": 50}
    cases = [{"case": {"capacity": 1, "variant": "decode"}, "traffic": traffic, "floor_bandwidth_bytes_per_s": 1e6}]
    bench = SimpleNamespace(capacities=(1,), widths=(), variants=("decode",))
    (t,) = gpu_replay.decode_and_round_timelines(bench, (), None, cases)
    assert "error" not in t and t["kernels"] == 7 and "no region" in t["gap_error"]
    assert t["table"].startswith("timeline B=1\nnot set against the floor: gap to the floor")


def test_timeline_failures_are_listed_for_the_exit_status():
    """A profile that raised, a critical path that could not be read and a decode timeline the floor could not split
    each make a line (``gpu_replay`` then exits 1); sound entries make none."""
    from qualify import gpu_replay

    good = {"capacity": 1, "width": None, "critical_path": {"span_us": 1.0}}
    assert gpu_replay.timeline_failures([good]) == []
    bad = [{"capacity": 4, "width": 2, "error": "RuntimeError('CUPTI')"},
           {"capacity": 1, "width": None, "critical_path": {"error": "3 kernels"}},
           {"capacity": 1, "width": None, "kind": "decode_greedy", "gap_error": "no region"},
           {"capacity": 1, "width": None, "ab": "B1: FLARE_X=1", "error": "boom"}]
    assert gpu_replay.timeline_failures([good, *bad]) == [
        "B=4 W=2 profile: RuntimeError('CUPTI')", "B=1 critical path: 3 kernels", "B=1 decode_greedy floor: no region",
        "B=1 (B1: FLARE_X=1) profile: boom"]
