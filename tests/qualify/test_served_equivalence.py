"""``qualify.served_equivalence`` on the embedded core (CPU): the served reply equals the prepared eager forward's,
the cache-hit continuation equals the cache-miss one and consumed cached tokens -- and a planted defect (the
served engine drops the cached prefix's KV) is caught."""

from __future__ import annotations

from qualify import served_equivalence


def test_served_equals_eager_and_hit_equals_miss():
    out = served_equivalence.measure(None, max_tokens=8, prompt_tokens=30, device="cpu")
    assert out["served_equals_eager"] and out["hit_equals_miss"]
    assert out["cached_tokens_hit"] > 0 and out["cached_tokens_miss"] == 0
    assert out["passed"] and len(out["served_r1"]) == 8


def test_a_cache_that_serves_stale_kv_is_caught(monkeypatch):
    from helios.runtime.scheduler import Scheduler

    real_submit, submitted = Scheduler.submit, []

    def submit(self, req):  # order: R2 (miss), R1, R2 (hit) -- before the hit, the cached K pages go stale
        submitted.append(req)
        if len(submitted) == 3:
            cache = self.engine.driver.model.kv_cache
            cache.k.normal_(0.0, 8.0), cache.v.normal_(0.0, 8.0)
        return real_submit(self, req)

    monkeypatch.setattr(Scheduler, "submit", submit)
    out = served_equivalence.measure(None, max_tokens=8, prompt_tokens=30, device="cpu")
    assert len(submitted) == 3
    assert out["served_equals_eager"] and not out["hit_equals_miss"] and not out["passed"]


def test_bad_sizes_are_refused_by_name(capsys):
    import pytest

    from qualify.served_equivalence import main

    for argv, needle in ((["--prompt-tokens", "0"], "--prompt-tokens 0"), (["--max-tokens", "0"], "--max-tokens 0")):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--device", "cpu"])
        assert exc.value.code == 2 and needle in capsys.readouterr().err
