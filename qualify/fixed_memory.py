"""Fixed GPU memory after loading a core: weights, KV pool, graph pool, workspaces, allocator slack.

``python -m qualify.fixed_memory CORE [--capacities 1,4] [--prefill 256] [--kv-pages N] [--attention NAME]
[--json OUT]``
loads the core the way the runtime does (no preparation resources), allocates the KV pool, prepares,
compiles and captures the catalog, and reports each owner's bytes from the CUDA caching allocator
(``allocated`` = live tensors, ``reserved`` = physical segments held by the allocator):

- ``weights``, ``kv_pool``, ``static_io`` (step input/output buffers and the sampling state): allocation
  deltas around each stage; the load's split by :func:`module_bytes` into the model's parameters (the weights
  proper) and its buffers (rotary tables and the like), and ``persistent_storage`` -- what every step keeps besides
  the weights: the KV pool, the static step buffers with the sampling state, the model's buffers;
- ``graph_pool_*``: the segments of the graphs' private pool (memory snapshot, by segment pool id) --
  intermediates and workspaces the captured graphs use, reserved for as long as the graphs live;
- ``workspaces``: what stays allocated in the default pool after compile and capture beyond the above
  (cuBLAS workspaces of the current stream, compiled-graph constants);
- ``allocator_slack``: reserved minus allocated over every pool, after ``empty_cache`` (capture does it);
- ``kv_capacity``: the KV tokens the device holds beside all of the above -- whole pages of the core's geometry in
  the serving budget (``helios``' ``gpu_memory_fraction`` of the device, default 0.90) less everything in use but
  this measurement's own small KV pool, one page kept as the pool's sink (:func:`kv_capacity`; the engine's sizing
  with the graphs' measured memory in place of its estimate).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def measure(core: str, decode=None, prefill=None, kv_pages: int | None = None, page_size: int | None = None,
            compile: bool = True, attention: str | None = None) -> dict:
    """The report (module docstring) for ``core`` with its graphs for ``decode`` capacities and ``prefill`` chunks
    (default: the core's catalog), ``attention``: a backend by name (default: the recipe's) -- the graphs'
    intermediates, and so the graph pool, depend on it (the reference attention holds a prefill chunk's scores)."""
    import torch

    from ignition.preparation import _recipe_model, load_prepared
    from ignition.recipes.registry import load_recipe

    torch.cuda.empty_cache()
    base_alloc, base_res = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    t0 = time.perf_counter()
    model, loaded = load_prepared(core, device="cuda", attention_backend=attention)
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    weights = torch.cuda.memory_allocated() - base_alloc
    held = module_bytes(model)
    m = loaded.manifest
    page_size = page_size or m.kv_layout.page_size
    if kv_pages is not None and kv_pages < 1:
        raise ValueError(f"kv_pages {kv_pages}: expected >= 1 (None: sized for the catalog)")
    decode = tuple(decode or m.graph_catalog.decode_capacities)
    prefill = tuple(m.graph_catalog.prefill_chunk_sizes if prefill is None else prefill)
    max_context = max(prefill, default=0) + 2 * page_size
    if kv_pages is None:
        kv_pages = (max(decode) + 1) * (max_context // page_size + 1)
    a0 = torch.cuda.memory_allocated()
    model.allocate_kv_cache(kv_pages, page_size, max_context)
    kv = torch.cuda.memory_allocated() - a0
    _, module = _recipe_model(load_recipe(m.recipe.name))
    a1, r1 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    graphs = module.graph_catalog().prepare(model, decode=decode, prefill=prefill)
    static_io = torch.cuda.memory_allocated() - a1
    t1 = time.perf_counter()
    (graphs.compile() if compile else graphs).capture()
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - t1
    a2, r2 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    free, total = torch.cuda.mem_get_info()
    stats = torch.cuda.memory_stats()
    pools = pool_split()
    graph_pool = pools["graph_pools"]
    from helios.runtime.engine import EngineConfig
    from helios.runtime.kv_sizing import Geometry

    capacity = kv_capacity(free, total, kv, Geometry.from_manifest(m.geometry).bytes_per_page(page_size), page_size,
                           EngineConfig.gpu_memory_fraction)
    return {
        "core": core, "attention": attention or "recipe default", "decode_capacities": list(decode),
        "prefill_chunks": list(prefill),
        "compiled": compile, "load_s": round(load_s, 3), "compile_capture_s": round(capture_s, 3),
        "weights_bytes": weights, "weight_parameter_bytes": held["parameters"], "model_buffer_bytes": held["buffers"],
        "kv_pool_bytes": kv, "kv_pages": kv_pages, "page_size": page_size,
        "static_io_bytes": static_io, "persistent_storage_bytes": kv + static_io + held["buffers"],
        "graph_pool_and_workspaces_bytes": (a2 - a1 - static_io),
        "graph_pool_reserved_bytes": graph_pool["reserved"], "graph_pool_allocated_bytes": graph_pool["allocated"],
        "workspaces_bytes": (a2 - a1 - static_io) - graph_pool["allocated"],
        "pools": pools,
        "allocated_bytes": a2 - base_alloc, "reserved_bytes": r2 - base_res,
        "allocator_slack_bytes": (r2 - base_res) - (a2 - base_alloc),
        "reserved_growth_during_capture_bytes": r2 - r1,
        "device_free_bytes": free, "device_total_bytes": total,
        "non_torch_bytes": (total - free) - torch.cuda.memory_reserved(),
        "num_alloc_retries": stats.get("num_alloc_retries", 0), "kv_capacity": capacity,
        "graphs": [s.shape.name for s in graphs.steps],
    }


def module_bytes(model) -> dict:
    """``{"parameters", "buffers"}``: the bytes of ``model``'s parameters and of its buffers, each storage counted
    once (tied weights share one)."""
    seen: set = set()
    out = {"parameters": 0, "buffers": 0}
    for kind, tensors in (("parameters", model.parameters()), ("buffers", model.buffers())):
        for t in tensors:
            key = (t.untyped_storage().data_ptr(), t.device)
            if key not in seen:
                seen.add(key)
                out[kind] += t.untyped_storage().nbytes()
    return out


def kv_capacity(free: int, total: int, kv_pool_bytes: int, bytes_per_page: int, page_size: int,
                fraction: float) -> dict:
    """The KV tokens the device holds once everything measured here is in place: ``helios``' own sizing
    (``kv_sizing.kv_plan_from_memory``: whole pages of ``bytes_per_page`` in ``fraction`` of ``total`` less what is
    in use, one page the pool's sink) with the measured memory in place of its estimate -- nothing reserved beyond
    what is allocated, and the measurement's own KV pool (``kv_pool_bytes``, which a served pool replaces) counted
    free.  ``{"fraction", "bytes_per_token", "pages", "tokens", "budget_bytes", "reason"}``; 0 pages when nothing
    fits."""
    from helios.runtime.kv_sizing import kv_plan_from_memory

    if not 0 < fraction <= 1 or bytes_per_page <= 0 or page_size <= 0:
        raise ValueError(f"kv_capacity: fraction in (0, 1], positive page bytes and size; got {fraction}, "
                         f"{bytes_per_page}, {page_size}")
    try:
        plan = kv_plan_from_memory(free=free + kv_pool_bytes, total=total, fraction=fraction, reserve=0,
                                   bytes_per_page=bytes_per_page, page_size=page_size, min_tokens=0)
        pages, reason = plan.pages, plan.reason
    except ValueError as exc:  # not one page beside the sink
        pages, reason = 0, str(exc)
    return {"fraction": fraction, "bytes_per_token": bytes_per_page // page_size, "pages": pages,
            "tokens": pages * page_size, "budget_bytes": int(fraction * total) - (total - free - kv_pool_bytes),
            "reason": reason}


def pool_split() -> dict:
    """Reserved and allocated bytes of the default pool vs the private (graph) pools, from the allocator's
    segment snapshot (segment pool id ``(0, 0)`` is the default pool)."""
    import torch

    out = {"default": {"reserved": 0, "allocated": 0, "segments": 0},
           "graph_pools": {"reserved": 0, "allocated": 0, "segments": 0}}
    for seg in torch.cuda.memory_snapshot():
        key = "default" if tuple(seg.get("segment_pool_id", (0, 0))) == (0, 0) else "graph_pools"
        out[key]["reserved"] += seg["total_size"]
        out[key]["allocated"] += seg["allocated_size"]
        out[key]["segments"] += 1
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("core")
    p.add_argument("--capacities", default=None)
    p.add_argument("--prefill", default=None)
    p.add_argument("--kv-pages", type=int, default=None, help="the measured KV pool's pages (default: sized for the "
                   "catalog's largest batch and context; the capacity in tokens is reported apart from it)")
    p.add_argument("--json", default=None)
    p.add_argument("--eager", action="store_true", help="capture the eager prepared steps (no torch.compile)")
    p.add_argument("--attention", default=None, help="attention backend by name (ignition.components.backends), "
                   "default: the recipe's")
    a = p.parse_args(argv)
    from qualify.arguments import int_list

    decode = None if a.capacities is None else int_list(p, "--capacities", a.capacities)
    prefill = None if a.prefill is None else int_list(p, "--prefill", a.prefill)
    if a.kv_pages is not None and a.kv_pages < 1:
        p.error(f"--kv-pages {a.kv_pages}: expected >= 1 (default: sized for the catalog)")
    report = measure(a.core, decode, prefill, a.kv_pages, compile=not a.eager, attention=a.attention)
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        open(a.json, "w").write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
