"""``flare run --speculative ngram``: greedy output identical to plain decoding, rounds and acceptance counted;
the greedy-only decode variant: the same output as the sampling graph, used only for plain greedy batches.

Driven at the scheduler (the HTTP layer adds nothing to the numerics; the protocol tests cover it) on the
embedded default core, with prompts that repeat themselves so that prompt lookup proposes often.
"""

from __future__ import annotations

import pytest

from helios.runtime.engine import EngineConfig, default_core, load_engine
from helios.server.metrics import Metrics
from qualify.served_equivalence import GREEDY


def _prompts():
    return [[11, 12, 13, 14] * 6, [40 + (i % 5) for i in range(23)], [7, 8] * 9 + [9], [100 + i for i in range(17)]]


def _serve(config: EngineConfig, metrics=None, max_tokens=24, params=GREEDY):
    import asyncio

    from helios.runtime.scheduler import Request, Scheduler

    engine = load_engine(default_core(), config, on_replay=metrics.replay if metrics else None)
    engine.eos_token_ids = set()
    scheduler = Scheduler(engine, queue_timeout_s=60.0, metrics=metrics, prefix_cache=False)

    async def run_all():
        loop = asyncio.get_running_loop()
        reqs = [Request(p, params, max_tokens, [], loop, asyncio.Queue()) for p in _prompts()]
        for r in reqs:
            scheduler.submit(r)
        for r in reqs:
            while (await r.queue.get())[0] not in ("done", "error"):
                pass
        return [r.generated for r in reqs]

    scheduler.start()
    try:
        return asyncio.run(run_all()), engine
    finally:
        scheduler.stop()


def _speculative_equals_plain(speculative: str, width: int = 4):
    """Serve the prompts plainly and with ``speculative``: the outputs must be equal; returns
    ``(metrics, engine, drafted, accepted)`` of the speculative run."""
    plain, _ = _serve(EngineConfig(kv_tokens=4096, max_context=512, device="cpu"))
    metrics = Metrics()
    spec, engine = _serve(EngineConfig(kv_tokens=4096, max_context=512, device="cpu", speculative=speculative,
                                       speculative_width=width), metrics)
    assert spec == plain
    return metrics, engine, metrics.draft_tokens._value.get(), metrics.accepted_tokens._value.get()


@pytest.mark.parametrize("width", [2, 4, 8])
def test_ngram_speculation_keeps_greedy_output_and_counts_rounds(width):
    plain, _ = _serve(EngineConfig(kv_tokens=4096, max_context=512, device="cpu"))
    metrics = Metrics()
    spec, engine = _serve(EngineConfig(kv_tokens=4096, max_context=512, device="cpu", speculative="ngram",
                                       speculative_width=width), metrics)
    assert spec == plain
    assert all(len(g) == 24 for g in spec)
    text = metrics.text().decode()
    rounds = sum(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("flare_speculative_rounds_total{"))
    accepted = metrics.accepted_tokens._value.get()
    drafted = metrics.draft_tokens._value.get()
    assert rounds > 0 and drafted > 0 and 0 < accepted <= drafted
    assert f'width="{width}"' in text


def test_self_drafting_accepts_every_own_proposal_and_keeps_greedy_output():
    metrics, _, drafted, accepted = _speculative_equals_plain("self")
    assert drafted > 0 and accepted == drafted  # the probe: a greedy target accepts its own greedy proposals
    assert metrics.self_probe_misses._value.get() == 0


def test_a_draft_core_keeps_greedy_output_and_drafts_in_step():
    """Two tiny cores on CPU: the embedded default drafting for itself from its own core folder (its own model,
    KV pool and catalog): greedy output equal to plain serving; a draft that is the target accepts everything."""
    _, engine, drafted, accepted = _speculative_equals_plain(f"draft:{default_core()}")
    assert drafted > 0 and accepted == drafted
    assert engine.draft.driver.model is not engine.driver.model


def test_unsupported_speculative_sources_fail_at_start(tmp_path):
    from helios.runtime.engine import EngineStartError

    with pytest.raises(ValueError, match="expected ngram"):
        EngineConfig(speculative="medusa")
    with pytest.raises(EngineStartError, match="cannot load the draft core"):
        load_engine(default_core(), EngineConfig(kv_tokens=1024, max_context=256, device="cpu",
                                                 speculative=f"draft:{tmp_path}"))
    with pytest.raises(ValueError, match="--speculative-width"):
        EngineConfig(speculative="ngram", speculative_width=9)


def test_an_attention_backend_that_cannot_run_here_fails_at_start():
    from helios.runtime.engine import EngineStartError

    with pytest.raises(EngineStartError, match="--attention triton: attention backend 'triton' unavailable on cpu"):
        load_engine(default_core(), EngineConfig(kv_tokens=1024, max_context=256, device="cpu", attention="triton"))


def _replays(metrics, kind):
    text = metrics.text().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("flare_graph_replays_total{") and f'kind="{kind}"' in line)


def test_greedy_variant_serves_plain_greedy_batches_with_the_same_output(monkeypatch):
    config = EngineConfig(kv_tokens=4096, max_context=512, device="cpu")
    metrics = Metrics()
    fast, _ = _serve(config, metrics)
    assert _replays(metrics, "decode_greedy") > 0 and _replays(metrics, "decode") == 0
    import helios.runtime.scheduler as scheduler

    monkeypatch.setattr(scheduler, "plain_greedy", lambda resolved: False)  # force the sampling graphs
    forced = Metrics()
    slow, _ = _serve(config, forced)
    assert _replays(forced, "decode_greedy") == 0 and _replays(forced, "decode") > 0
    assert fast == slow


def test_penalized_greedy_rows_keep_the_sampling_graph():
    metrics = Metrics()
    _serve(EngineConfig(kv_tokens=4096, max_context=512, device="cpu"), metrics,
           params={"temperature": 0.0, "presence_penalty": 0.5})
    assert _replays(metrics, "decode_greedy") == 0 and _replays(metrics, "decode") > 0


def test_self_draft_probe_reports_a_proposal_the_target_would_not_make(monkeypatch):
    from helios.runtime.engine import StepDriver

    real = StepDriver.self_draft

    def off_by_one(self, rows, k):  # a planted defect: the first proposal of each row is shifted
        props = real(self, rows, k)
        return [[(p[0] + 1) % 100 + 4, *p[1:]] if p else p for p in props]

    monkeypatch.setattr(StepDriver, "self_draft", off_by_one)
    metrics, _, _, _ = _speculative_equals_plain("self")  # verification rejects what the target would not emit
    assert metrics.self_probe_misses._value.get() > 0


def test_a_different_draft_core_with_rejected_proposals_keeps_greedy_output(tmp_path, monkeypatch):
    """A draft core with other weights (the embedded geometry and tokenizer, seed 7) whose first proposal per row
    is also corrupted (the tiny models' greedy streams agree too often to force rejections otherwise): proposals
    are rejected, and the served greedy output still equals plain serving token for token."""
    from helios.runtime.engine import DEFAULT_CORE_DECODE, DEFAULT_CORE_PREFILL, StepDriver
    from ignition.checkpoints.synth import EMBEDDED_REPO_ID, synthesize_checkpoint
    from ignition.preparation import export

    ckpt = synthesize_checkpoint(EMBEDDED_REPO_ID, tmp_path / "draft-ckpt", seed=7, progress=False)
    export(str(ckpt), str(tmp_path / "draft-core"), decode=DEFAULT_CORE_DECODE, prefill=DEFAULT_CORE_PREFILL,
           compile=False, progress=False)
    real = StepDriver.self_draft

    def corrupt_first(self, rows, k, feed_last=False):
        props = real(self, rows, k, feed_last)
        return [[(p[0] + 3) % 100 + 4, *p[1:]] if p else p for p in props]

    monkeypatch.setattr(StepDriver, "self_draft", corrupt_first)
    _, _, drafted, accepted = _speculative_equals_plain(f"draft:{tmp_path / 'draft-core'}")
    assert drafted > 0 and accepted < drafted


SAMPLED = {"temperature": 0.8, "top_p": 0.95, "top_k": 20, "seed": 1234}


def test_topk_variant_serves_bounded_sampled_batches_with_the_same_output():
    """``--topk-variant K``: batches whose rows all have ``1 <= top_k <= K`` replay the decode_topk steps (the
    sampler cuts with topk(K) instead of sorting the vocabulary) and draw the same tokens as the sorting decode
    steps, seeded; a request without the bound keeps its batches on the sorting steps."""
    base = dict(kv_tokens=4096, max_context=512, device="cpu")
    plain_metrics, bounded_metrics, unbounded_metrics = Metrics(), Metrics(), Metrics()
    plain, _ = _serve(EngineConfig(**base), plain_metrics, params=SAMPLED)
    bounded, engine = _serve(EngineConfig(**base, topk_variant=32), bounded_metrics, params=SAMPLED)
    assert engine.driver.topk_bound == 32
    assert _replays(plain_metrics, "decode_topk") == 0 and _replays(plain_metrics, "decode") > 0
    assert _replays(bounded_metrics, "decode_topk") > 0 and _replays(bounded_metrics, "decode") == 0
    assert bounded == plain
    assert len({tuple(g) for g in plain}) > 1 and any(len(set(g)) > 2 for g in plain)  # sampled, not constant
    _serve(EngineConfig(**base, topk_variant=32), unbounded_metrics, params={**SAMPLED, "top_k": 0})
    assert _replays(unbounded_metrics, "decode_topk") == 0 and _replays(unbounded_metrics, "decode") > 0


@pytest.mark.parametrize("resolved,k,fits", [
    ({"temperature": 0.8, "top_k": 20}, 32, True), ({"temperature": 0.8, "top_k": 32}, 32, True),
    ({"temperature": 0.8, "top_k": 33}, 32, False), ({"temperature": 0.8, "top_k": 0}, 32, False),
    ({"temperature": 0.8}, 32, False), ({"temperature": 0.0, "top_k": 0}, 32, True), ({"top_k": 20}, 32, True),
    ({"temperature": 0.8, "top_k": 20}, None, False)])
def test_within_top_k(resolved, k, fits):
    from ignition.graphs.catalog import within_top_k

    assert within_top_k(resolved, k) == fits


def test_topk_variant_must_be_positive():
    with pytest.raises(ValueError, match="--topk-variant must be positive"):
        EngineConfig(topk_variant=0)
