"""KV pool sizing from free device memory (``helios/runtime/kv_sizing.py``) with fake memory numbers, and
the start-time errors naming the flag."""

from __future__ import annotations

import pytest

from helios.cli import main
from helios.runtime.engine import EngineConfig
from helios.runtime.kv_sizing import GiB, FIXED_RESERVE_BYTES, Geometry, graph_reserve_bytes, kv_plan_from_memory

MiB = 1 << 20
# Qwen3-8B geometry: 36 layers, 8 KV heads of 128
Q8 = Geometry(layers=36, hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128, vocab=151936)


def test_bytes_per_page_counts_k_and_v_of_every_layer():
    assert Q8.bytes_per_page(16) == 2 * 36 * 16 * 8 * 128 * 2 == 2359296


def test_pages_are_the_budget_in_whole_pages_less_the_sink():
    # 100 GiB total, 80 free (20 in use), fraction 0.9 -> 90 - 20 - 2 reserve = 68 GiB
    plan = kv_plan_from_memory(free=80 * GiB, total=100 * GiB, fraction=0.9, reserve=2 * GiB,
                               bytes_per_page=MiB, page_size=16, min_tokens=4096)
    budget = int(0.9 * 100 * GiB) - 20 * GiB - 2 * GiB
    assert plan.pages == budget // MiB - 1 == 68 * 1024 - 1
    assert plan.tokens == plan.pages * 16
    assert "0.9 x 100.00 GiB total - 20.00 GiB in use - 2.00 GiB reserved" in plan.reason


def test_a_partial_page_is_rounded_down():
    plan = kv_plan_from_memory(free=10 * MiB + 1000, total=10 * MiB + 1000, fraction=1.0, reserve=0,
                               bytes_per_page=MiB, page_size=16, min_tokens=16)
    assert plan.pages == 9  # 10 whole pages fit; one is the sink


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.01])
def test_a_fraction_outside_0_1_is_refused_naming_the_flag(fraction):
    with pytest.raises(ValueError, match="--gpu-memory-fraction"):
        kv_plan_from_memory(free=GiB, total=GiB, fraction=fraction, reserve=0, bytes_per_page=MiB, page_size=16,
                            min_tokens=16)
    with pytest.raises(ValueError, match="--gpu-memory-fraction"):
        EngineConfig(gpu_memory_fraction=fraction)


def test_too_little_memory_for_one_full_context_request_names_the_flag():
    with pytest.raises(ValueError, match=r"--gpu-memory-fraction 0.5 leaves room for 160 KV tokens, fewer than one "
                                         r"4096-token request"):
        kv_plan_from_memory(free=100 * MiB, total=100 * MiB, fraction=0.5, reserve=39 * MiB, bytes_per_page=MiB,
                            page_size=16, min_tokens=4096)
    with pytest.raises(ValueError, match="leaves room for 0 KV tokens"):  # the reserve alone exceeds the budget
        kv_plan_from_memory(free=GiB, total=GiB, fraction=0.9, reserve=GiB, bytes_per_page=MiB, page_size=16,
                            min_tokens=16)


def test_the_reserve_is_the_fixed_part_plus_the_largest_step():
    decode_only = graph_reserve_bytes(Q8, [(1, 1)], 4096)
    with_prefill = graph_reserve_bytes(Q8, [(1, 1), (64, 1), (1, 4096)], 4096)
    assert FIXED_RESERVE_BYTES < decode_only < with_prefill
    # a 4096-token prefill over a 4096 context: 32 heads x 4096 x 4096 scores at 8 bytes dominate
    assert with_prefill > FIXED_RESERVE_BYTES + 2 * 32 * 4096 * 4096 * 8
    assert graph_reserve_bytes(Q8, [(1, 4096)], 8192) > with_prefill  # longer context, larger scores


def test_flare_run_refuses_bad_values_naming_the_flag(capsys):
    for argv, flag in ((["--gpu-memory-fraction", "0"], "--gpu-memory-fraction"),
                       (["--gpu-memory-fraction", "1.5"], "--gpu-memory-fraction"),
                       (["--kv-tokens", "0"], "--kv-tokens")):
        assert main(["run", *argv]) == 1
        assert flag in capsys.readouterr().err
