"""``qualify.paired_blocks``: a side by side's B against A (and the null A2) block by block, the sign test, the
verdict, and the CLI on archived ``--ab`` samples."""

from __future__ import annotations

import json

from qualify import paired_blocks as pb
from qualify.report import verdict


def test_paired_blocks_count_the_blocks_b_won_and_need_every_reference():
    """The paired-blocks verdict: per block (``block_sizes``, as ``interleaved`` split the samples) the median ratio
    B / reference, the blocks B won, the exact two-sided sign test -- a steady 0.4% gain inside overlapping min-max
    ranges is found; a gain only against A (the null A2 as slow as B) is not a verdict."""
    assert pb.block_sizes(10, 4) == [3, 3, 2, 2] and pb.block_sizes(3, 10) == [1, 1, 1]
    noise = [0.0, 0.03, -0.02, 0.05, -0.04]  # the same jitter in both: ranges far wider than 0.4%
    a = [1.0 + noise[i % 5] for i in range(200)]
    b = [0.996 * x for x in a]
    d = pb.paired_blocks(a, b, 10)
    assert d["faster_blocks"] == 10 and d["blocks"] == 10 and abs(d["p"] - 2 / 1024) < 1e-12
    assert abs(d["median_ratio"] - 0.996) < 1e-9 and len(d["ratios"]) == 10
    assert verdict([min(a), max(a)], [min(b), max(b)]) == "within noise"  # the min-max rule sees nothing
    assert pb.paired_verdict([d]) == "B faster (no null)"  # A alone: the build-order bias not excluded
    assert pb.paired_verdict([pb.paired_blocks(b, a, 10)]) == "B slower (no null)"
    # B won 7 of 10 blocks: p = 0.34, no verdict
    mixed = [x * (0.99 if i // 20 < 7 else 1.01) for i, x in enumerate(a)]
    m = pb.paired_blocks(a, mixed, 10)
    assert m["faster_blocks"] == 7 and abs(m["p"] - 352 / 1024) < 1e-12
    assert pb.paired_verdict([m]) == "within noise"
    # faster than A in every block but not than the null A2 (the build order's own bias): no verdict
    assert pb.paired_verdict([d, pb.paired_blocks(b, b, 10)]) == "within noise"
    assert pb.paired_verdict([d, pb.paired_blocks([0.998 * x for x in a], b, 10)]) == "B faster"


def test_the_cli_reads_an_archived_side_by_side(tmp_path, capsys):
    a = [1.0 + 0.01 * (i % 7) for i in range(40)]
    recs = [{"case": {"tool": "gpu_replay", "capacity": 1, "variant": "decode", "ab": label}, "seed": 0,
             "replay_s": [f * x for x in a]}
            for label, f in (("A", 1.0), ("B: FLARE_X=1", 0.99), ("A2: A rebuilt after B (null)", 1.001))]
    recs.append({"case": {"tool": "gpu_replay.round", "capacity": 1, "width": 1}, "seed": 0, "replay_s": a})
    run = tmp_path / "run"
    run.mkdir()
    (run / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    assert pb.main([str(run), "--blocks", "8"]) == 0
    out = capsys.readouterr().out
    assert "B=1 decode seed 0 (B: FLARE_X=1): B faster by paired blocks -- 8/8 faster vs A" in out
    assert "8/8 faster vs A2" in out
    (few,) = pb.from_samples(recs, 4)  # 4 of 4 blocks: p = 0.125, the sign test cannot reach 0.05 below 6 blocks
    assert few["verdict"] == "within noise" and few["vs"]["A"]["faster_blocks"] == 4
    (entry,) = pb.from_samples(recs, 8)
    assert entry["verdict"] == "B faster" and abs(entry["vs"]["A"]["median_ratio"] - 0.99) < 1e-9
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "samples.jsonl").write_text(json.dumps(recs[-1]))
    assert pb.main([str(empty)]) == 2 and "no --ab side by side" in capsys.readouterr().err
    assert pb.main([str(tmp_path / "missing")]) == 2 and "cannot read" in capsys.readouterr().err


def test_tied_blocks_say_nothing_either_way():
    """A block whose median ratio is exactly 1 (the event clock's resolution makes ties) is left out of the sign test:
    identical timings are "within noise" at p 1, not "B slower"; ties beside a steady gain leave the untied blocks to
    decide, and the printed line states them."""
    a = [1.0 + 0.01 * (i % 3) for i in range(200)]
    same = pb.paired_blocks(a, list(a), 10)
    assert (same["faster_blocks"], same["slower_blocks"], same["tied_blocks"], same["p"]) == (0, 0, 10, 1.0)
    assert pb.paired_verdict([same]) == "within noise"
    # 9 blocks tied, one faster: p 1 (one untied block decides nothing)
    one = [x * (0.99 if i < 20 else 1.0) for i, x in enumerate(a)]
    d = pb.paired_blocks(a, one, 10)
    assert (d["faster_blocks"], d["slower_blocks"], d["tied_blocks"], d["p"]) == (1, 0, 9, 1.0)
    assert pb.paired_verdict([d]) == "within noise"
    # 2 tied, 8 faster: p = 2 / 2**8 over the 8 untied blocks
    eight = [x * (1.0 if i < 40 else 0.99) for i, x in enumerate(a)]
    e = pb.paired_blocks(a, eight, 10)
    assert (e["faster_blocks"], e["tied_blocks"]) == (8, 2) and abs(e["p"] - 2 / 256) < 1e-12
    assert pb.paired_verdict([e]) == "B faster (no null)"
    assert "8/10 faster vs A (2 tied) (p 0.00781" in pb.describe({"A": e})


def test_the_cli_takes_the_block_count_each_record_archived(tmp_path, capsys):
    """Without ``--blocks`` the CLI pairs each B with the block count its record states (its ``--ab-blocks``), not a
    default of 10 -- here 6, whose 6 of 6 faster blocks reach p 0.031 where 10 blocks would differ."""
    a = [1.0 + 0.01 * (i % 5) for i in range(60)]
    b = [x * (0.99 if i < 40 else 1.02) for i, x in enumerate(a)]  # faster in the first 40 samples only
    stated = {"A": {"blocks": 6}}
    recs = [{"case": {"tool": "gpu_replay", "capacity": 1, "variant": "decode", "ab": "A"}, "seed": 0, "replay_s": a},
            {"case": {"tool": "gpu_replay", "capacity": 1, "variant": "decode", "ab": "B: FLARE_X=1"}, "seed": 0,
             "replay_s": b, "paired_blocks": stated}]
    (entry,) = pb.from_samples(recs)
    assert entry["vs"]["A"]["blocks"] == 6 and entry["vs"]["A"]["faster_blocks"] == 4  # 10-sample blocks: 4 of 6
    (ten,) = pb.from_samples(recs, 10)
    assert ten["vs"]["A"]["blocks"] == 10 and ten["vs"]["A"]["faster_blocks"] == 6  # 6-sample blocks: 6 of 10
    del recs[1]["paired_blocks"]  # a record from before the count was archived: 10
    assert pb.from_samples(recs)[0]["vs"]["A"]["blocks"] == 10
