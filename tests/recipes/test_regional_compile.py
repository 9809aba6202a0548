"""Regional compilation of the catalog: one layer graph per shape (not per layer), bytewise equal to eager.

Three decoder layers and two shapes: if any per-layer value were guarded (the layer index, a KV pool
offset), Dynamo would compile the layer once per layer and shape (6 entries) instead of once per shape.
The catalog samples greedily through the model hook here (``sampling=False``) to keep the cold CPU
compile of the head short; the sampling head is compiled regionally in ``test_catalog_sampling``.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from ignition.components.attention import batch_tensors
from ignition.graphs.catalog import GraphCatalog, head_logits, run_sampler
from ignition.recipes.qwen3.model import PreparedQwen3
from tiny_qwen3 import Row, make_checkpoint, prefill, stores_its_outputs

LAYERS = 3
PROMPT = [(i * 37 + 11) % 512 for i in range(11)]
CATALOG = GraphCatalog(decode_capacities=(1,), prefill_chunks=(8,))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny3") / "ckpt", seed=5, num_hidden_layers=LAYERS)


def _graphs(ckpt):
    model = PreparedQwen3.from_pretrained(ckpt)
    model.allocate_kv_cache(num_pages=8, page_size=8, max_context=32)
    return CATALOG.prepare(model, sampling=False)


def _run(graphs, decodes=4):
    """Chunked prefill (8 + 3 tokens: the second chunk padded) then greedy decodes; every output kept."""
    row = Row([5, 1, 6], 8)
    width = graphs.steps[0].max_pages
    logits, token = prefill(graphs, row, PROMPT, chunk=8)
    out = [(logits, token)]
    for _ in range(decodes):
        lg, tok = graphs.step("decode", 1).run(**row.inputs([int(out[-1][1])], width))
        out.append((lg[0].clone(), tok[0].clone()))
    return out, graphs.model.kv_cache


def test_regional_compile_is_once_per_shape_and_bytewise_eager(ckpt):
    eager, eager_cache = _run(_graphs(ckpt))
    torch._dynamo.reset()  # count this compile only (earlier tests may have compiled the same code objects)
    counters.clear()
    graphs = _graphs(ckpt)
    # A recompile limit below the number of shapes: the catalog's own limit must cover them.
    with torch._dynamo.config.patch(recompile_limit=1):
        graphs.compile()
    assert {s.compile_scope for s in graphs.steps} == {"regional"}
    shapes = len(graphs.steps)
    assert len(_debug_get_cache_entry_list(PreparedQwen3.run_layer.__code__)) == shapes  # not shapes * LAYERS
    assert len(_debug_get_cache_entry_list(head_logits.__code__)) == shapes
    assert len(_debug_get_cache_entry_list(batch_tensors.__code__)) == shapes
    # the greedy hook: compiled, not eager -- once per row count of its logits (a prefill chunk samples one row, as the
    # one-row decode step does)
    assert len(_debug_get_cache_entry_list(run_sampler.__code__)) == 1
    # per shape: the metadata, one layer, the head; and the hook once
    assert counters["stats"]["unique_graphs"] == 3 * shapes + 1
    compiled, compiled_cache = _run(graphs)
    assert len(_debug_get_cache_entry_list(PreparedQwen3.run_layer.__code__)) == shapes  # running: no recompile
    assert counters["stats"]["unique_graphs"] == 3 * shapes + 1
    for (le, te), (lc, tc) in zip(eager, compiled):
        assert torch.equal(le, lc) and torch.equal(te, tc)
    assert torch.equal(eager_cache.k, compiled_cache.k) and torch.equal(eager_cache.v, compiled_cache.v)
    assert all(stores_its_outputs(s) for s in graphs.steps)  # the head and the greedy hook: no copy after them


def test_unknown_compile_scope_is_refused(ckpt):
    with pytest.raises(ValueError, match="compile scope"):
        _graphs(ckpt).compile(scope="per-layer")


def test_inductor_pdl_switch_reaches_the_compile_options(monkeypatch):
    """``FLARE_INDUCTOR_PDL=1`` hands Inductor ``triton.enable_pdl`` with the graphs' compile options (off by default),
    and a function compiled with them runs (off CUDA Inductor generates no PDL code: the same result)."""
    import torch

    from ignition.graphs.catalog import _inductor_options

    monkeypatch.delenv("FLARE_INDUCTOR_PDL", raising=False)
    assert "triton.enable_pdl" not in _inductor_options()
    monkeypatch.setenv("FLARE_INDUCTOR_PDL", "1")
    opts = _inductor_options()
    assert opts["triton.enable_pdl"] is True
    x = torch.arange(8, dtype=torch.float32)
    fn = torch.compile(lambda t: t * 2 + 1, fullgraph=True, dynamic=False, options=opts)
    assert torch.equal(fn(x), x * 2 + 1)


@pytest.mark.parametrize("tails", ["1", "0"])
def test_rounds_and_the_greedy_hook_are_compile_regions(ckpt, monkeypatch, tails):
    """Regional compilation hands every verification round its own compiled tail (``rounds.round_tail``: the head,
    acceptance and the sampling state's update -- eager, Qwen3-8B's width-one round ran it as 235 kernels on the H200,
    run 168) and the greedy variant its compiled hook (``run_sampler``): each function wrapped once, each step run
    through its region -- ``torch.compile`` recorded here, not run (a cold CPU compile of the sampling head takes
    minutes; the compiled rounds' bits against decode: the GPU matrix's ``test_width_one_round_is_decode_bytewise``).
    ``FLARE_COMPILE_TAILS=0``: both stay eager (the rounds' tail still their own function)."""
    from ignition.graphs import catalog
    from ignition.graphs.rounds import ROUND, prepare_rounds, round_tail

    wrapped, calls = [], []

    def record(fn, **opts):
        wrapped.append(fn)

        def region(*args, **kwargs):
            calls.append(fn)
            return fn(*args, **kwargs)
        return region

    model = PreparedQwen3.from_pretrained(ckpt)
    model.allocate_kv_cache(num_pages=8, page_size=8, max_context=32)
    graphs = CATALOG.prepare(model, greedy_variant=True)
    rounds = prepare_rounds(graphs, (1,), (1, 2))
    monkeypatch.setattr(torch, "compile", record)
    monkeypatch.setenv("FLARE_COMPILE_TAILS", tails)
    graphs.compile()
    on = tails == "1"
    assert wrapped.count(round_tail) == wrapped.count(catalog.run_sampler) == int(on)
    kinds = [s.shape.kind for s in graphs.steps]
    assert kinds.count(ROUND) == len(rounds) == 2 and kinds.count(catalog.DECODE_GREEDY) == 1
    assert calls.count(round_tail) == 2 * on  # compile() runs each step once
    assert calls.count(catalog.run_sampler) == int(on)
    assert calls.count(catalog.sample_rows) == kinds.count("decode") + kinds.count("prefill")
