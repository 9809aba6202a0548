"""``scripts/probe_decode_attention.py``'s reading of the stamps (the timing needs a GPU: ``h200_run.sh`` stage
``attnprobe``): a probed GEMV's residency and phases against its predecessor's end, from hand-made stamp rows, and the
``--env`` variant parser."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed here")

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("probe_decode_attention",
                                                  ROOT / "scripts" / "probe_decode_attention.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stamps(n_stamps, rows):
    """Probe rows ``[len(rows) + 2, 2 * n_stamps]`` (two unused rows after them, zero as a launch leaves them):
    globaltimer stamps 0-4 and the SM id from ``rows`` = (entry, tiles arrived, wait released, loop end, stored, sm)."""
    buf = torch.zeros(len(rows) + 2, 2 * n_stamps, dtype=torch.int64)
    for i, (*t, sm) in enumerate(rows):
        buf[i, :5] = torch.tensor(t)
        buf[i, n_stamps - 1] = sm
    return buf


def test_gemv_stats_counts_resident_programs_and_times_phases_after_the_predecessor():
    probe = _script()
    n = probe.launch.PROBE_STAMPS.value
    # three programs entered before the predecessor's end at 1000 ns (two on SM 0, one on SM 1), two of them with their
    # tiles by then; three entered after it, on three other SMs
    buf = _stamps(n, [(100, 500, 1050, 1500, 1600, 0), (200, 600, 1060, 1600, 1700, 0),
                      (300, 1100, 1070, 1700, 1800, 1), (1200, 1500, 1500, 2500, 2600, 2),
                      (1300, 1600, 1600, 2600, 2700, 3), (1400, 1700, 1700, 2700, 2900, 4)])
    weight = torch.zeros(512, 1024, dtype=torch.bfloat16)  # 1 MiB
    got = probe.gemv_stats(buf, weight, 1000.0)
    assert got["programs"] == 6 and got["weight_mib"] == 1.0
    assert (got["resident_before"], got["preloaded_before"], got["sms_before"], got["max_per_sm_before"],
            got["sms_all"]) == (3, 2, 2, 2, 5)
    assert (got["release_after_ns"], got["last_entry_after_ns"], got["end_after_ns"], got["early_end_after_ns"]) == (
        50, 400, 1900, 800)
    assert got["late_duration_ns"] == 1400  # median of 1400, 1400, 1500
    assert got["early_preload"] == 400 and got["late_preload"] == 300  # medians of (400, 400, 800), (300, 300, 300)
    assert got["early_release_to_loop_end"] == 540 and got["late_loop_end_to_store"] == 100
    # without a known predecessor end the first wait release (1050) is the reference
    none = probe.gemv_stats(buf, weight, None)
    assert none["resident_before"] == 3 and none["release_after_ns"] == 0 and none["end_after_ns"] == 1850


def test_sm_spread_counts_sms_and_the_most_programs_on_one():
    probe = _script()
    assert probe.sm_spread(torch.tensor([5, 0, 5, 7, 5, 0])) == (3, 3)
    assert probe.sm_spread(torch.tensor([2])) == (1, 1)
    assert probe.sm_spread(torch.zeros(0, dtype=torch.int64)) == (0, 0)


def test_variants_parse_and_name_a_malformed_item():
    probe = _script()
    off = {"FLARE_DECODE_COMBINE_ROWS": "0"}  # the reduce kernel the probe stamps, whatever the default
    assert probe.parse_variant("") == off
    assert probe.parse_variant("A=1,B=x;y") == {**off, "A": "1", "B": "x;y"}
    with pytest.raises(SystemExit, match="expected NAME=VALUE items, got 2"):
        probe.parse_variant("A=1,2")
    with pytest.raises(SystemExit, match="FLARE_DECODE_COMBINE_ROWS must be 0"):  # no reduce launch to stamp
        probe.parse_variant("FLARE_DECODE_COMBINE_ROWS=1")
    assert probe.parse_variant("FLARE_DECODE_COMBINE_ROWS=0") == {"FLARE_DECODE_COMBINE_ROWS": "0"}


def test_probe_reads_the_launch_s_own_split_count(monkeypatch):
    """The stamps are read for the programs the fused launch runs: Qwen3-0.6B's wide launch (32-key blocks over 256
    pages: 128 blocks, capped at one wave of 2 programs per SM -- 33 splits on the 132 SMs assumed off CUDA), Qwen3-8B's
    64-key one-row blocks (64 blocks, capped at 128 / 4 = 32 splits), and 64 splits with the wide launch off
    (whole pages; the count the probe used to assume for every shape)."""
    probe = _script()
    for wide in ("1", "0"):
        monkeypatch.setenv("FLARE_DECODE_WIDE", wide)
        for heads, expect in ((16, 33 if wide == "1" else 64), (32, 32)):
            kp = torch.zeros(257, 16, 8, 128, dtype=torch.bfloat16)
            layer = dict(kp=kp, vp=kp, bt=torch.arange(256, dtype=torch.int32).view(1, 256))
            assert probe.launch_splits(dict(heads=heads, d=128), layer) == expect, (wide, heads)



def _rows(n_stamps, rows):
    """Probe rows with %clock64 stamps: ``rows`` = ({stamp: cycles}, sm); every given stamp also gets a nonzero
    globaltimer value (which marks it as stamped)."""
    buf = torch.zeros(len(rows) + 1, 2 * n_stamps, dtype=torch.int64)  # one unused row, zero as a launch leaves it
    for i, (stamps, sm) in enumerate(rows):
        for point, cycles in stamps.items():
            buf[i, point] = 1
            buf[i, n_stamps + point] = cycles
        buf[i, n_stamps - 1] = sm
    return buf


def test_kv_neighbours_pairs_each_k_v_phase_with_what_shared_its_sm():
    probe = _script()
    n = probe.launch.PROBE_STAMPS.value
    # attention programs: two on SM 3 (K, V over cycles 100-300 and 150-550), one on SM 4 (100-200), one without a key
    # block (no stamps 9, 10); o_proj programs: on SM 3 preloading over 1-200 (overlaps both), 500-900 (the second
    # only), 600-700 (neither); on SM 4 over 250-400 (after its phase); on SM 5 over 0-1000 (another SM)
    fused = _rows(n, [({0: 1, 9: 100, 10: 300}, 3), ({0: 1, 9: 150, 10: 550}, 3), ({0: 1, 9: 100, 10: 200}, 4),
                      ({0: 1}, 4)])
    gemv = _rows(n, [({0: 1, 1: 200}, 3), ({0: 500, 1: 900}, 3), ({0: 600, 1: 700}, 3), ({0: 250, 1: 400}, 4),
                     ({0: 1, 1: 1000}, 5)])
    got = probe.kv_neighbours(fused, gemv, 2.0)
    assert got == [(100.0, 2, 1), (200.0, 2, 2), (50.0, 2, 0)]  # ns at 2 GHz; SM 4 also ran the block-less program
    table = probe.neighbour_table(got + [(10.0, 3, 5)])
    assert table["by_attention_on_sm"] == {"2": [3, 100.0], "3+": [1, 10.0]}
    assert table["by_gemv_preloads"] == {"0": [1, 50.0], "1": [1, 100.0], "2": [1, 200.0], "3+": [1, 10.0]}


def test_analyse_reads_the_attention_alone_without_projection_stamps():
    """``FLARE_PROBE_ATTENTION_ALONE=1``'s graph stamps only the fused attention and its reduce: the reading takes the
    phases and spans from those, and reports no GEMV (none ran) instead of failing on their empty rows."""
    probe = _script()
    n = probe.launch.PROBE_STAMPS.value
    kvh, heads, splits = 2, 4, 1

    def layer(shift):
        fused = torch.zeros(kvh * splits, 2 * n, dtype=torch.int64)
        for p in range(kvh * splits):  # globaltimer ns at stamps 0-6 and 8-12; the SM clock at 2 GHz; SM p
            ns = {0: 100, 1: 200, 2: 300, 3: 500, 4: 600, 8: 650, 9: 700, 10: 1700 + 100 * p, 11: 1800 + 100 * p,
                  12: 1900 + 100 * p, 5: 2000 + 100 * p, 6: 2100 + 100 * p}
            for point, t in ns.items():
                fused[p, point] = shift + t
                fused[p, n + point] = 2 * (shift + t)
            fused[p, n - 1] = p
        red = torch.zeros(heads, 2 * n, dtype=torch.int64)
        red[:, 0], red[:, 2], red[:, 6] = shift + 400, shift + 2400, shift + 2600
        zeros = {f"{name}_probe": torch.zeros(8, 2 * n, dtype=torch.int64) for name in probe.GEMVS}
        return dict(fused_probe=fused, reduce_probe=red, **zeros)

    summary, per_layer = probe.analyse([layer(0), layer(10_000)], dict(kvh=kvh, heads=heads), splits)
    assert len(per_layer) == 1 and summary["gemv"] == {}
    assert summary["ghz"] == 2.0
    assert summary["phases"]["  last block: K, V"] == (1050.0, 1100.0)  # 1000 and 1100 ns
    assert summary["attention_span_ns"] == 2200 - 300 and summary["reduce_span_ns"] == 200
    assert summary["reduce_release_after_attention_end_ns"] == 2400 - 2200
    assert summary["kv_neighbours"]["by_gemv_preloads"] == {"0": [2, 1050.0]}
