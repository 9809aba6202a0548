"""Served output vs the prepared eager forward, and cache-hit vs cache-miss continuations.

``python -m qualify.served_equivalence [CORE] [--max-tokens 32] [--prompt-tokens 40] [--json OUT]``

Loads the core as ``flare run`` does (``load_engine``: compiled and captured graphs on CUDA, eager on CPU)
and drives its scheduler directly (the HTTP layer adds no numerics):

1. **miss**: with the prefix cache off, the second turn ``R2 = P1 + T1' + P2`` is served alone, where
   ``T1'`` is the eager reference's reply to ``P1`` (below);
2. **hit**: with the prefix cache on, ``R1 = P1`` (cache point at its end) then ``R2`` (cache points at the
   end of ``P1`` and of ``T1'``): ``R2`` consumes cached prompt tokens (``cached_tokens`` reported);
3. **eager**: the core's prepared steps without compile or capture (``load_prepared``), the same chunk
   shapes, greedy: ``P1`` -> ``T1'``.

Checks: the served ``R1`` reply equals the eager reply token for token; the cache-hit ``R2`` continuation
equals the cache-miss one token for token; the hit consumed > 0 cached tokens.  Greedy throughout;
end-of-sequence tokens are ignored so each reply has ``--max-tokens`` tokens.  Exit status 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

GREEDY = {"temperature": 0.0}


def _prompt(n: int, vocab: int, salt: int) -> list[int]:
    return [(salt * 7919 + i * 131 + 17) % (vocab - 32) + 16 for i in range(n)]


def serve_sequentially(engine, requests: list[tuple[list[int], list[int]]], max_tokens: int,
                       prefix_cache: bool) -> list[tuple[list[int], int]]:
    """Serve ``(prompt_ids, cache_points)`` one after another; ``(generated, cached_tokens)`` each."""
    from helios.runtime.scheduler import Request, Scheduler

    scheduler = Scheduler(engine, queue_timeout_s=3600.0, metrics=None, prefix_cache=prefix_cache)
    out = []

    async def one(prompt, points):
        r = Request(list(prompt), GREEDY, max_tokens, [], asyncio.get_running_loop(), asyncio.Queue())
        r.cache_points = list(points)
        scheduler.submit(r)
        while (event := await r.queue.get())[0] not in ("done", "error"):
            pass
        if event[0] == "error":
            raise RuntimeError(f"request failed: {event}")
        return list(r.generated), r.cached_tokens

    async def run_all():
        for prompt, points in requests:
            out.append(await one(prompt, points))

    scheduler.start()
    try:
        asyncio.run(run_all())
    finally:
        scheduler.stop()
    return out


def eager_greedy(core: str, prompt: list[int], max_tokens: int, device: str, decode, prefill) -> list[int]:
    """The prepared eager forward (no compile, no capture): chunked prefill then decodes, greedy."""
    import math

    import torch

    from ignition.components.attention import slot_mapping_for
    from ignition.graphs.catalog import GraphCatalog
    from ignition.preparation import load_prepared

    model, loaded = load_prepared(core, device=device)
    page = loaded.manifest.kv_layout.page_size
    context = len(prompt) + max_tokens + page
    model.allocate_kv_cache(math.ceil(context / page) + 1, page, context)
    graphs = GraphCatalog(decode_capacities=tuple(decode), prefill_chunks=tuple(prefill)).prepare(model)
    graphs.tune()
    width = graphs.steps[0].max_pages
    bt = torch.arange(width, dtype=torch.int32)[None]
    length, tokens, pending = 0, [], list(prompt)

    def run(kind, toks):
        nonlocal length
        pos = torch.arange(length, length + len(toks))[None]
        length += len(toks)
        step = graphs.step(kind, 1, len(toks))
        _, tok = step.run(input_ids=torch.tensor([toks]), positions=pos,
                          slot_mapping=slot_mapping_for(bt, pos, torch.ones_like(pos, dtype=torch.bool), page),
                          block_tables=bt, seq_lens=torch.tensor([length]), active_rows=torch.tensor([True]))
        return int(tok[0])

    while pending:
        chunk = max(graphs.catalog.prefill_chunks)
        fits = [c for c in graphs.catalog.prefill_chunks if c >= len(pending)]
        n = min(len(pending), min(fits) if fits else chunk)
        tok = run("prefill", pending[:n])
        pending = pending[n:]
    tokens.append(tok)
    while len(tokens) < max_tokens:
        tokens.append(run("decode", [tokens[-1]]))
    return tokens


def measure(core: str | None, max_tokens: int = 32, prompt_tokens: int = 40, device: str | None = None) -> dict:
    import torch

    from helios.runtime.engine import EngineConfig, default_core, load_engine

    core = str(core or default_core())
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    engine = load_engine(core, EngineConfig(device=device, kv_tokens=8 * (2 * prompt_tokens + 2 * max_tokens + 64),
                                            queue_timeout_s=3600.0))
    engine.eos_token_ids = set()
    steps = engine.driver.graphs.steps
    decode = sorted({s.shape.rows for s in steps if s.shape.kind == "decode"})
    prefill = sorted({s.shape.tokens for s in steps if s.shape.kind == "prefill"})
    p1, p2 = _prompt(prompt_tokens, engine.vocab_size, 1), _prompt(prompt_tokens // 2, engine.vocab_size, 2)
    eager_t1 = eager_greedy(core, p1, max_tokens, device, decode, prefill)
    r2 = p1 + eager_t1 + p2
    (miss, miss_cached), = serve_sequentially(engine, [(r2, [])], max_tokens, prefix_cache=False)
    (t1, _), (hit, hit_cached) = serve_sequentially(
        engine, [(p1, [len(p1)]), (r2, [len(p1), len(p1) + len(eager_t1)])], max_tokens, prefix_cache=True)
    first = lambda a, b: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)  # noqa: E731
    result = {
        "core": core, "device": device, "compiled": engine.driver.graphs.stage, "max_tokens": max_tokens,
        "prompt_tokens": [len(p1), len(r2)],
        "served_equals_eager": t1 == eager_t1, "served_vs_eager_first_mismatch": first(t1, eager_t1),
        "hit_equals_miss": hit == miss, "hit_vs_miss_first_mismatch": first(hit, miss),
        "cached_tokens_hit": hit_cached, "cached_tokens_miss": miss_cached,
        "served_r1": t1, "eager_r1": eager_t1, "r2_hit": hit, "r2_miss": miss,
    }
    result["passed"] = result["served_equals_eager"] and result["hit_equals_miss"] and hit_cached > 0
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qualify.served_equivalence", description=__doc__.split("\n\n")[0])
    p.add_argument("core", nargs="?", default=None)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=40)
    p.add_argument("--device", default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.prompt_tokens < 2:  # the second request's own part of the prompt must not be empty
        p.error(f"--prompt-tokens {a.prompt_tokens}: expected >= 2")
    if a.max_tokens < 1:
        p.error(f"--max-tokens {a.max_tokens}: expected >= 1")
    out = measure(a.core, a.max_tokens, a.prompt_tokens, a.device)
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
