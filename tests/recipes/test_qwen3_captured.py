"""GPU: the prepared Qwen3 steps, compiled and captured into one graph pool, against the eager prepared forward
and transformers' canonical forward on the same device (tiny geometry; bound as in test_qwen3_prepared)."""

from __future__ import annotations

import pytest

from ignition.graphs.catalog import GraphCatalog
from ignition.recipes.qwen3.model import PreparedQwen3
from tiny_qwen3 import Row, batched_greedy, canonical_greedy, logit_bound, make_checkpoint, prepared_greedy

PROMPT = [(i * 37 + 11) % 512 for i in range(20)]
# 8 rows: at this geometry the first decode capacity whose qkv and gate/up take the tensor-core launch behind a
# published norm (1..4 rows run the fused GEMV with its own norm prologue)
CATALOG = GraphCatalog(decode_capacities=(1, 2, 4, 8), prefill_chunks=(8, 32))


def _prepare(ckpt, device="cuda"):
    model = PreparedQwen3.from_pretrained(ckpt, device=device)
    model.allocate_kv_cache(num_pages=72, page_size=8, max_context=128)
    return CATALOG.prepare(model)


@pytest.mark.gpu
@pytest.mark.parametrize("prenorm", [False, True], ids=["norm-launches", "published-norms"])
def test_captured_capacities_match_eager_and_canonical(tmp_path, monkeypatch, prenorm):
    """``published-norms``: ``FLARE_GEMM_ROWS_PRENORM=1`` (carried) with the gated gate/up launch (no size bound
    here), so that the decode batches' gate/up and the prefill chunks' qkv and gate/up take their norms from the launch
    before (the first layer's from ``flare::published_norm``); ``norm-launches``: ``FLARE_GEMM_ROWS_PRENORM=0``."""
    monkeypatch.setenv("FLARE_GEMM_ROWS_PRENORM", "1" if prenorm else "0")
    if prenorm:  # carried too: the prefill chunks' qkv takes the norm down published
        monkeypatch.setenv("FLARE_GEMM_ROWS_PRENORM_CARRY", "1")
        monkeypatch.setenv("FLARE_GEMM_ROWS_GATED_MIN_ELEMENTS", "0")
    ckpt = make_checkpoint(tmp_path / "tiny", seed=0)
    eager = _prepare(ckpt)
    layer = eager.model.hf.model.layers[0]
    assert [layer.mlp.takes_prenorm(c) and layer.self_attn.takes_prenorm(c)
            for c in CATALOG.decode_capacities] == [False, False, False, prenorm]  # the switch reaches decode at 8
    captured = _prepare(ckpt).compile().capture()
    assert {s.mode for s in captured.steps} == {"captured(compiled)"}
    assert captured.pool is not None

    ref_tokens, ref_logits = canonical_greedy(ckpt, PROMPT, 32, device="cuda")
    bound = logit_bound(ref_logits)
    for graphs in (eager, captured):
        tokens, logits = prepared_greedy(graphs, Row(list(range(40, 48)), 8), PROMPT, 32, chunk=8)
        assert tokens == ref_tokens
        assert max(float((a - b).abs().max()) for a, b in zip(logits, ref_logits)) <= bound

    prompts = [PROMPT, PROMPT[:7], None, PROMPT[5:18], PROMPT[2:11], None, PROMPT[9:20], PROMPT[:3]]
    for cap in CATALOG.decode_capacities:
        rows = prompts[:cap]
        a = batched_greedy(eager, rows, 6, page_size=8, chunk=32)
        b = batched_greedy(captured, rows, 6, page_size=8, chunk=32)
        for x, y in zip(a, b):
            assert float((x - y).abs().max()) <= bound, f"capacity {cap}"
            for i, p in enumerate(rows):
                if p is None:
                    assert not y[i].any()
