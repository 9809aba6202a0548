"""The compiled decode layer writes the KV pool in place: no pool-sized buffer in Inductor's output code.

A traced scatter into a view of the pool (a graph input) was functionalized into a copy of the whole layer
pool and a copy back -- twice per layer and step, 1.1 ms per step of the Qwen3-8B graph on the H200.  The
opaque ``flare::kv_write_`` declares its mutation; this test reads the generated code (CPU Inductor): the
write must be that op, called on the graph input, with no pool-sized buffer.  (CPU Inductor happens to fuse
the traced scatter in place in this layer, so the GPU copy itself is only visible on the GPU timeline.)
"""

from __future__ import annotations

import torch
from torch._inductor.utils import run_and_get_code

from ignition.graphs.catalog import GraphCatalog
from ignition.recipes.qwen3.model import PreparedQwen3
from tiny_qwen3 import make_checkpoint

PAGES, PAGE = 37, 8


def _compiled_code(tmp_path) -> tuple[str, str]:
    model = PreparedQwen3.from_pretrained(make_checkpoint(tmp_path / "ckpt", seed=2))
    model.allocate_kv_cache(num_pages=PAGES, page_size=PAGE, max_context=64)
    graphs = GraphCatalog(decode_capacities=(1,), prefill_chunks=(16,)).prepare(model, decode=(1,), prefill=(),
                                                                             sampling=False)
    torch._dynamo.reset()
    _, code = run_and_get_code(graphs.compile)
    src = "\n".join(code)
    kv = model.kv_cache.k
    return src, f"({PAGES + 1}, {PAGE}, {kv.shape[-2]}, {kv.shape[-1]})"


def _pool_copies(src: str, pool: str) -> int:
    return src.count(f"empty_strided_cpu({pool}") + src.count(f"empty_strided_cpu((1, {PAGES + 1},")


def test_compiled_layer_writes_the_pool_in_place(tmp_path):
    src, pool = _compiled_code(tmp_path)
    assert "flare.rope_write_" in src  # the opaque write (with the q/k norms and rotary) is called ...
    assert _pool_copies(src, pool) == 0  # ... in place
