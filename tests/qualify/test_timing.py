"""``qualify.timing`` on CPU: one duration per sample, and ``interleaved`` runs its callables round by round."""

from __future__ import annotations

import time

import pytest

from qualify.timing import interleaved, summarize, time_samples


def test_time_samples_measures_each_call_and_runs_setup_outside():
    calls = []
    out = time_samples(lambda: (calls.append("fn"), time.sleep(0.002)), samples=3, warmup=1,
                       setup=lambda: calls.append("setup"), device="cpu")
    assert len(out) == 3 and all(t >= 0.002 for t in out)
    assert calls == ["setup", "fn"] * 4
    with pytest.raises(ValueError, match="samples"):
        time_samples(lambda: None, samples=0, device="cpu")


def test_interleaved_alternates_and_times_each_callable():
    order = []
    out = interleaved({"slow": lambda: (order.append("slow"), time.sleep(0.003)), "fast": lambda: order.append("fast")},
                      samples=4, warmup=2, device="cpu")
    assert order == ["slow", "fast"] * 6  # 2 warm-up rounds, then 4 timed ones, each callable once per round
    assert len(out["slow"]) == len(out["fast"]) == 4
    assert min(out["slow"]) >= 0.003 > max(out["fast"])
    assert summarize(out["slow"])["n"] == 4
