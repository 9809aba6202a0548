"""GPU memory invariants of a captured catalog (issue 4 §3/§4), per recipe x GPU class:

- **allocation stability**: 10,000 replays alternating every graph a served catalog holds -- each decode capacity
  with its greedy and bounded top-k variants, each prefill chunk, and, where the recipe declares speculative widths,
  verification rounds (capacities 1 and 4 x every width, ragged proposals) -- with inactive rows, make no allocation
  at all (the caching allocator's ``allocation.all.allocated`` counter and reserved bytes unchanged);
- **poisoned scratch**: between replays every segment of the graphs' private pool (their intermediates and
  workspaces: inputs, outputs, KV pool and sampling state live outside it) is filled with NaN bytes (0xFF); the
  outputs of the next replays are bytewise those of an unpoisoned run -- every graph writes its scratch before
  reading it.

The catalog is the recipe's tiny checkpoint (qwen3: :func:`conformance.speculative.probe_checkpoint`, whose tokens
depend on their context), prepared as ``helios`` prepares a served core (the greedy variant, here a top-k variant
too, every prefill chunk), compiled and captured.  CUDA only.
"""

from __future__ import annotations

import importlib

import pytest

from .registry import graph_cases

CASES = [c for c in graph_cases() if c.capacity == 1]  # one case per recipe x class: the catalog takes them all
REPLAYS = 10_000
PAGE = 16
ROUND_CAPACITIES = (1, 4)
TOPK_VARIANT = 20  # a bounded top-k variant, as a core served with --topk-variant holds (Qwen3's top_k default)


def _catalog(recipe: str, device: str = "cuda"):
    """The catalog as served, its step kinds ``(kind, rows, tokens)`` and the vocabulary; compiled and captured on
    CUDA (elsewhere eager: the test's mechanics alone)."""
    import torch

    from ignition.graphs.catalog import DECODE, DECODE_GREEDY, DECODE_TOPK, PREFILL

    from .speculative import shared_probe_checkpoint

    module = importlib.import_module(f"ignition.recipes.{recipe}.recipe")
    if not hasattr(module, "MODEL") or recipe != "qwen3":
        pytest.skip(f"recipe {recipe} has no prepared model with a tiny checkpoint yet")
    path, name = module.MODEL.split(":")
    cls = getattr(importlib.import_module(path), name)
    model = cls.from_pretrained(shared_probe_checkpoint(), device=device)
    caps, chunks = module.DECODE_CAPACITIES, module.PREFILL_CHUNKS
    max_context = max(chunks) + 4 * PAGE  # a chunk from position 0..39 on, as _inputs places it
    width = -(-max_context // PAGE)
    model.allocate_kv_cache(num_pages=8 * max(caps) + width + 8, page_size=PAGE, max_context=max_context)
    graphs = module.graph_catalog().prepare(model, decode=caps, prefill=chunks, greedy_variant=True,
                                            topk_variant=TOPK_VARIANT)
    kinds = [(kind, c, 1) for kind in (DECODE, DECODE_GREEDY, DECODE_TOPK) for c in caps]
    kinds += [(PREFILL, 1, t) for t in chunks]
    if hasattr(module, "SPECULATIVE_WIDTHS"):
        from ignition.graphs.rounds import prepare_rounds

        rounds = prepare_rounds(graphs, ROUND_CAPACITIES, module.SPECULATIVE_WIDTHS)
        kinds += [("round", r.shape.rows, r.width) for r in rounds]
    if device == "cuda":
        graphs.compile().capture()
        torch.cuda.synchronize()
    return graphs, kinds, model.vocab_size


def _inputs(kind: str, capacity: int, step: int, width: int, vocab: int, tokens: int = 1):
    """Host tensors for a decode step (``tokens`` 1), a prefill chunk (one row of ``tokens`` positions) or a round
    of ``tokens`` positions over ``capacity`` rows, every third row inactive (row r owns pages 8r..; decode and round
    positions stay inside the first of them, a chunk's run on from there)."""
    import torch

    act = torch.tensor([r % 3 != 1 for r in range(capacity)])
    pos = (20 + step % 40 + torch.arange(tokens)).expand(capacity, tokens)
    bt = torch.stack([torch.arange(8 * r, 8 * r + width, dtype=torch.int32) for r in range(capacity)])
    slots = torch.where(act[:, None], bt[:, :1].long() * PAGE + pos, -1)
    ids = torch.tensor([[(r * 31 + step + j) % (vocab - 5) + 5 for j in range(tokens)] for r in range(capacity)])
    if kind == "round":  # ragged: pending + 0..W-1 proposals
        fed = torch.tensor([1 + (r + step) % tokens for r in range(capacity)])
    else:
        fed = torch.full((capacity,), tokens)
    slots = torch.where(torch.arange(tokens) < fed[:, None], slots, -1)  # padding positions write nothing
    out = {"input_ids": ids, "positions": pos, "slot_mapping": slots, "block_tables": bt,
           "seq_lens": torch.where(act, pos[:, 0] + fed, 0), "active_rows": act}
    if kind == "round":
        out["draft_tokens"] = ids[:, 1:]
        out["n_proposals"] = fed - 1
    return out


def _graph_pool_segments(pool):
    import torch

    return [s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", (0, 0))) == tuple(pool)]


def _poison_pool(pool) -> int:
    """Fill every segment of the private pool with 0xFF bytes (NaN in bf16/fp32); returns the bytes poisoned."""
    import torch

    total = 0
    for seg in _graph_pool_segments(pool):
        device = torch.device("cuda", torch.cuda.current_device())  # an indexed device: set_ refuses "cuda"
        storage = torch._C._construct_storage_from_data_pointer(seg["address"], device, seg["total_size"])
        raw = torch.empty(0, dtype=torch.uint8, device=device)
        raw.set_(storage, 0, (seg["total_size"],), (1,))
        raw.fill_(0xFF)
        total += seg["total_size"]
    torch.cuda.synchronize()
    return total


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[f"{c.recipe}-{c.gpu_class}" for c in CASES])
def test_replays_allocate_nothing_and_ignore_poisoned_scratch(case, flare_samples):
    import torch

    graphs, kinds, vocab = _catalog(case.recipe)
    width = graphs.steps[0].max_pages
    schedule = [(kinds[i % len(kinds)], i) for i in range(REPLAYS)]
    staged = {(k, i % 40): _inputs(k[0], k[1], i % 40, width, vocab, k[2]) for k, i in schedule[:len(kinds) * 40]}

    def replay(k, i):
        step = graphs.step(*k)  # (kind, rows, tokens): a decode capacity, a prefill chunk or a round (rows, width)
        inputs = dict(staged[(k, i % 40)])
        drafts = {n: inputs.pop(n) for n in ("draft_tokens", "n_proposals") if n in inputs}
        step.load(**inputs)
        if k[0] == "round":
            step.load_drafts(**drafts)
        step.execute()
        return step

    replay(*schedule[0])
    torch.cuda.synchronize()
    stats0, reserved0 = torch.cuda.memory_stats(), torch.cuda.memory_reserved()
    for c, i in schedule:
        replay(c, i)
    torch.cuda.synchronize()
    stats1, reserved1 = torch.cuda.memory_stats(), torch.cuda.memory_reserved()
    new_allocs = stats1["allocation.all.allocated"] - stats0["allocation.all.allocated"]

    # poisoned scratch: the same short sequence twice from the same KV state, the second with the pool poisoned
    # before every replay; logits and tokens must not move
    kv = (graphs.model.kv_cache.k.clone(), graphs.model.kv_cache.v.clone())
    probe = schedule[:4 * len(kinds)]

    def run(poison: bool):
        graphs.model.kv_cache.k.copy_(kv[0]), graphs.model.kv_cache.v.copy_(kv[1])
        out, poisoned = [], 0
        for k, i in probe:
            if poison:
                poisoned = max(poisoned, _poison_pool(graphs.pool))
            step = replay(k, i)
            out.append((step.logits[:k[1]].clone(),
                        (step.emitted if k[0] == "round" else step.tokens)[:k[1]].clone()))
        return out, poisoned

    clean, _ = run(False)
    dirty, poisoned = run(True)
    same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(clean, dirty))
    flare_samples(case={"recipe": case.recipe, "gpu_class": case.gpu_class, "check": "memory_stability"},
                  replays=REPLAYS, graphs=[list(k) for k in kinds], new_allocations=new_allocs, reserved_growth_bytes=reserved1 - reserved0,
                  poisoned_pool_bytes=poisoned, poisoned_outputs_equal=same)
    assert new_allocs == 0 and reserved1 == reserved0
    assert poisoned > 0, "the graphs' private pool has no segment to poison"
    assert same
