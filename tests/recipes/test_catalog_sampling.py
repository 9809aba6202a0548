"""Sampling inside the prepared step: greedy by default, seeded sampling reproducible, compiled == eager."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from ignition.graphs.catalog import GraphCatalog, head_logits, sample_rows
from ignition.recipes.qwen3.model import PreparedQwen3
from tiny_qwen3 import Row, make_checkpoint, stores_its_outputs

PROMPT = [(i * 37 + 11) % 512 for i in range(12)]
CATALOG = GraphCatalog(decode_capacities=(1, 2), prefill_chunks=(16,))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=3)


def _graphs(ckpt, sampling=True, decode=None):
    model = PreparedQwen3.from_pretrained(ckpt)
    model.allocate_kv_cache(num_pages=16, page_size=8, max_context=64)
    return CATALOG.prepare(model, sampling=sampling, decode=decode)


def _run(graphs, steps=6, resolved=None):
    row = Row([1, 2, 3], 8)
    width = graphs.steps[0].max_pages
    if resolved is not None:
        graphs.sampling.set_row(0, resolved, PROMPT)
    _, tok = graphs.step("prefill", 1, 16).run(**row.inputs(PROMPT, width))
    out = [int(tok[0])]
    for _ in range(steps):
        _, tok = graphs.step("decode", 1).run(**row.inputs([out[-1]], width))
        out.append(int(tok[0]))
    return out


def test_default_rows_are_greedy_like_the_model_hook(ckpt):
    assert _run(_graphs(ckpt)) == _run(_graphs(ckpt, sampling=False))


SAMPLED = {"temperature": 0.9, "top_p": 0.95, "top_k": 50, "min_p": 0.0, "presence_penalty": 0.5,
           "frequency_penalty": 0.1, "repetition_penalty": 1.1, "seed": 1234}


def test_seeded_sampling_is_reproducible_and_seed_dependent(ckpt):
    a = _run(_graphs(ckpt), resolved=SAMPLED)
    b = _run(_graphs(ckpt), resolved=SAMPLED)
    c = _run(_graphs(ckpt), resolved={**SAMPLED, "seed": 99})
    greedy = _run(_graphs(ckpt))
    assert a == b
    assert a != c or a != greedy  # a different seed (or greedy) changes the draw


def test_compiled_step_with_sampling_equals_eager(ckpt):
    eager = _run(_graphs(ckpt), resolved=SAMPLED)
    compiled = _graphs(ckpt, decode=(1,))  # two shapes keep the CPU compile short
    torch._dynamo.reset()
    compiled.compile()
    assert _run(compiled, resolved=SAMPLED) == eager
    # The sampler region sees [rows, V] only: the 16-token prefill chunk (one row) reuses decode-1's graph.
    assert len(_debug_get_cache_entry_list(sample_rows.__code__)) == 1
    assert len(_debug_get_cache_entry_list(head_logits.__code__)) == 2
    assert all(stores_its_outputs(s) for s in compiled.steps)  # the head and the sampler: no copy after them
