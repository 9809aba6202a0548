"""Kernel timelines of a decode graph with layer and operator attribution (CUDA; used by ``gpu_replay --timeline``).

Two profiles of the same prepared step, each exported as a Chrome/Perfetto trace and read back from it:

1. **replay**: ``REPLAYS`` graph replays -- every kernel the complete graph runs (CUPTI reports the kernels
   of a graph launch individually): kernel count and summed kernel time per replay, against the graph's
   elapsed time (CUDA events).
2. **attributed**: the same compiled step launched without its graph, each region inside a profiler range
   (``layer.<i>`` around each compiled decoder layer, ``head`` around the vocabulary projection, ``sampler``
   around in-graph sampling, ``metadata`` around the compiled attention metadata; kernels outside any range
   are the eager glue: embedding, rotary, and the attention metadata when it is not compiled).  Each kernel is attributed to the range that encloses its launch (the ``cuda_runtime`` or
   ``cuda_driver`` event with the same correlation id), so the table gives kernel count and summed time per layer and
   per operator (kernel name) -- the same kernels the graph replays.

With ``width`` the step is the verification round ``(capacity, width)``; its head, acceptance and
sampling-state advance get ranges of their own (``head``, ``acceptance``, ``sampling-state advance``) when they run
eager (``FLARE_COMPILE_TAILS=0``); compiled (the default), they are one compiled region, the ``head`` range.
:func:`difference` compares two results (the width-one round against decode at the same batch): graph elapsed, per
region and per kernel name.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
from collections import defaultdict
from pathlib import Path

REPLAYS = 20


def _ranged(fn, name_of):
    """``fn`` inside a profiler range named ``name_of(*args)`` -- the range this module reads back -- and, on a CUDA
    build, an NVTX range of the same name (what Nsight Systems shows)."""
    import torch
    from torch.profiler import record_function

    nvtx = torch.cuda.nvtx.range if torch.cuda.is_available() else (lambda name: contextlib.nullcontext())

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        name = name_of(*args)
        with record_function(name), nvtx(name):
            return fn(*args, **kwargs)

    return wrapper


def _attributed_fn(step):
    """The step's callable with a profiler range around each region (regional compile), else one range."""
    from ignition.graphs.catalog import step_head

    fn = step.fn
    kw = getattr(fn, "keywords", {}) or {}
    if "layer_fn" not in kw:
        return _ranged(fn, lambda *a: "step")
    head = kw["head_fn"]
    hk = getattr(head, "keywords", {}) or {}
    layer_fn = _ranged(kw["layer_fn"], lambda layer, *a: f"layer.{getattr(layer.self_attn, 'layer_idx', '?')}")
    head_fn = functools.partial(step_head, logits_fn=_ranged(hk["logits_fn"], lambda *a: "head"),
                                sample_fn=_ranged(hk["sample_fn"], lambda *a: "sampler"),
                                hook_fn=_ranged(hk["hook_fn"], lambda *a: "sampler")) if hk else head
    batch_fn = _ranged(kw["batch_fn"], lambda *a: "metadata") if kw.get("batch_fn") is not None else None
    # a step kind's compiled tail (a round's head, acceptance and sampling-state advance: ``catalog.compile``'s
    # ``tail_fn``) stays the compiled one, as the graph replays it -- one region, named "head" (it holds the
    # vocabulary projection, whose bytes the floor's "head" counts); without it the attributed run would take the eager
    # tail, other kernels than the replay's (runs 172-173: "not in the attributed run")
    tail = {"tail_fn": _ranged(kw["tail_fn"], lambda *a: "head")} if kw.get("tail_fn") is not None else {}
    return functools.partial(fn.func, layer_fn=layer_fn, head_fn=head_fn, batch_fn=batch_fn, **tail)


def _compiled_tail(step) -> bool:
    """Whether ``step`` runs a compiled tail of its own (``catalog.compile``'s ``tail_fn``): then its head, acceptance
    and sampling-state advance are inside one compiled region, which :func:`_round_ranges` must not patch (patching
    the functions the compiled code traced would recompile it: other kernels than the graph's)."""
    return (getattr(step.fn, "keywords", None) or {}).get("tail_fn") is not None


@contextlib.contextmanager
def _round_ranges(model):
    """For a round step (``model`` given): profiler ranges around its head (``head_logits`` / ``head_all``), the
    acceptance and the sampling-state advance, which ``RoundStep.regional_forward`` calls outside the compiled
    regions -- so the timeline names them instead of leaving them unranged.  Restored on exit."""
    if model is None:
        yield
        return
    from ignition.components import speculative
    from ignition.graphs import rounds

    saved = [(rounds, "head_logits", rounds.head_logits), (speculative, "accept", speculative.accept),
             (speculative, "advance_accepted", speculative.advance_accepted)]
    names = {"head_logits": "head", "accept": "acceptance", "advance_accepted": "sampling-state advance"}
    had_head_all = "head_all" in vars(model)
    head_all = model.head_all
    try:
        for owner, attr, fn in saved:
            setattr(owner, attr, _ranged(fn, lambda *a, n=names[attr]: n))
        model.head_all = _ranged(head_all, lambda *a: "head")
        yield
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)
        if had_head_all:
            model.head_all = head_all
        else:
            del model.head_all


def _trace(path: Path) -> list[dict]:
    """The events of a Chrome trace (``.json`` as exported, or ``.json.gz`` as archived)."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return json.loads(text).get("traceEvents", [])


def _kernels(events):
    return [e for e in events if e.get("cat") == "kernel"]


UNRANGED = "eager glue (embedding, rotary, metadata)"
#: The decoder layers (``layer.<i>`` ranges) summed as one region.
LAYERS = "layers (all)"


def kernel_ranges(events) -> list[tuple[dict, str]]:
    """``(kernel event, range name)`` in start order: the innermost user range enclosing the kernel's launch (by
    correlation id and CPU timestamps), :data:`UNRANGED` outside every range."""
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"]
    # Triton and cuBLAS(Lt) launch through the driver API (cuLaunchKernel*), eager PyTorch through the runtime
    launches = {e["args"].get("correlation"): e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "args" in e}
    out = []
    for k in sorted(_kernels(events), key=lambda e: e["ts"]):
        launch = launches.get(k.get("args", {}).get("correlation"))
        name = UNRANGED
        if launch is not None:
            inside = [r for r in ranges if r["ts"] <= launch["ts"] <= r["ts"] + r["dur"]]
            if inside:
                name = min(inside, key=lambda r: r["dur"])["name"]
        out.append((k, name))
    return out


def _attribute(events) -> dict:
    """Kernel count and summed time per enclosing range and per kernel name (:func:`kernel_ranges`)."""
    per_range = defaultdict(lambda: {"kernels": 0, "us": 0.0})
    per_op = defaultdict(lambda: {"kernels": 0, "us": 0.0})
    for k, name in kernel_ranges(events):
        per_range[name]["kernels"] += 1
        per_range[name]["us"] += k.get("dur", 0.0)
        per_op[k["name"]]["kernels"] += 1
        per_op[k["name"]]["us"] += k.get("dur", 0.0)
    return {"per_range": dict(per_range), "per_operator": dict(per_op)}


def timeline(bench, capacity: int, trace_dir: Path, width: int | None = None, prefix: str = "",
             kind: str = "decode") -> dict:
    """Kernel timeline of the decode graph of ``capacity`` rows -- ``kind``: the plain decode step or a variant
    the bench prepared (``decode_greedy``, ``decode_topk``) -- or, with ``width``, of the verification round
    ``(capacity, width)`` loaded as ``bench.time_round`` loads it (its acceptance, commit and sampling-state
    advance are traced code outside the layer/head/sampler regions: they land in the unranged bucket).  ``prefix``
    starts the traces' tag (``replay-<prefix>b<rows>...``: another bench's traces beside these)."""
    if width is None:
        step = bench.graphs.step(kind, capacity)
        bench.fill_context(0)
        step.load(**bench.inputs(capacity, bench.seed_tokens(capacity, 0), bench.context))
    else:
        step = bench.load_round(capacity, width, 0)
    tag = f"{prefix}b{capacity}" + ("" if width is None else f"-w{width}") + ("" if kind == "decode" else f"-{kind}")
    result = profile_step(step, tag, trace_dir, round_model=step.model if width is not None else None)
    result.update(capacity=capacity, width=width, **({} if kind == "decode" else {"kind": kind}))
    result["table"] = format_table(result)
    return result


def profile_step(step, tag: str, trace_dir: Path, round_model=None, samples: int = 50) -> dict:
    """Graph elapsed (CUDA events), the replay profile and the attributed profile of a loaded, captured ``step``
    (see the module docstring); ``round_model``: the model of a round step (its head, acceptance and advance get
    ranges).  Used by :func:`timeline` and by ``scripts/prefill_profile.py`` (a prefill chunk)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from qualify.timing import summarize, time_samples

    elapsed = summarize(time_samples(step.execute, samples=samples, warmup=10, device=step.model.device))
    trace_dir = Path(trace_dir)
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=acts) as prof:
        for _ in range(REPLAYS):
            step.execute()
        torch.cuda.synchronize()
    replay_path = trace_dir / f"replay-{tag}.trace.json"
    prof.export_chrome_trace(str(replay_path))
    kernels = _kernels(_trace(replay_path))

    if _compiled_tail(step):
        round_model = None  # the compiled tail is one range ("head"), see _attributed_fn
    graph, fn = step.graph, step.fn
    step.graph, step.fn = None, _attributed_fn(step)
    try:
        with _round_ranges(round_model):
            for _ in range(3):
                step.execute()
            torch.cuda.synchronize()
            with profile(activities=acts) as prof:
                step.execute()
                torch.cuda.synchronize()
    finally:
        step.graph, step.fn = graph, fn
    attributed_path = trace_dir / f"attributed-{tag}.trace.json"
    prof.export_chrome_trace(str(attributed_path))
    attr = _attribute(_trace(attributed_path))

    replay_kernel_us = sum(k.get("dur", 0.0) for k in kernels) / REPLAYS
    layers = {k: v for k, v in attr["per_range"].items() if k.startswith("layer.")}
    return {
        "capacity": getattr(getattr(step, "shape", None), "rows", None), "width": None, "graph_elapsed": elapsed,
        "replays_profiled": REPLAYS,
        "replay_kernels_per_step": len(kernels) / REPLAYS, "replay_kernel_us_per_step": replay_kernel_us,
        "attributed": attr, "layers": len(layers),
        "per_layer_mean": {"kernels": sum(v["kernels"] for v in layers.values()) / max(len(layers), 1),
                           "us": sum(v["us"] for v in layers.values()) / max(len(layers), 1)},
        "traces": [replay_path.name, attributed_path.name],
        "critical_path": _critical_path(replay_path, attributed_path),
    }


def _critical_path(replay_path: Path, attributed_path: Path) -> dict:
    """:func:`qualify.critical_path.increments` of the two traces, or ``{"error": why}``."""
    from qualify.critical_path import increments

    try:
        return increments(_trace(replay_path), _trace(attributed_path))
    except Exception as exc:  # the summary never costs the timeline; the reason is printed and archived
        return {"error": f"{type(exc).__name__}: {exc}"}


def step_label(r: dict, round_word: str = " round") -> str:
    """``B=1``, ``B=1 W=2 round`` (a verification round), ``B=1 decode_greedy`` (a decode variant) of a timeline."""
    return (f"B={r['capacity']}" + ("" if r.get("width") is None else f" W={r['width']}{round_word}")
            + (f" {r['kind']}" if r.get("kind") else ""))


def format_table(r: dict) -> str:
    label = step_label(r)
    lines = [f"timeline {label}: graph elapsed median {r['graph_elapsed']['median_ms'] * 1e3:.1f} us; "
             f"replay: {r['replay_kernels_per_step']:.0f} kernels, {r['replay_kernel_us_per_step']:.1f} us summed "
             f"per step",
             f"  per layer (mean of {r['layers']}): {r['per_layer_mean']['kernels']:.1f} kernels, "
             f"{r['per_layer_mean']['us']:.1f} us"]
    other = {k: v for k, v in r["attributed"]["per_range"].items() if not k.startswith("layer.")}
    for name, v in sorted(other.items(), key=lambda kv: -kv[1]["us"]):
        lines.append(f"  {name:<44} {v['kernels']:>5} kernels {v['us']:>9.1f} us")
    cp = r.get("critical_path")
    if cp and "error" not in cp:
        from qualify.critical_path import format_table as path_table

        lines.append(path_table(cp, label))
    elif cp:
        lines.append(f"  critical path: {cp['error']}")
    lines.append("  top operators (kernel name, attributed run):")
    ops = sorted(r["attributed"]["per_operator"].items(), key=lambda kv: -kv[1]["us"])[:15]
    for name, v in ops:
        lines.append(f"    {v['us']:>9.1f} us {v['kernels']:>5}x  {name[:110]}")
    return "\n".join(lines)


def difference(base: dict, other: dict, top: int = 12) -> dict:
    """What ``other`` (e.g. the width-one round) spends beyond ``base`` (decode at the same batch), from the two
    attributed runs: graph elapsed, per region (layers summed) and per kernel name, largest differences first."""
    def regions(r):
        out = defaultdict(lambda: {"kernels": 0, "us": 0.0})
        for name, v in r["attributed"]["per_range"].items():
            key = LAYERS if name.startswith("layer.") else name
            out[key]["kernels"] += v["kernels"]
            out[key]["us"] += v["us"]
        return out

    def delta(a, b):
        keys = sorted(set(a) | set(b))
        rows = [{"name": k, "kernels": b.get(k, {}).get("kernels", 0) - a.get(k, {}).get("kernels", 0),
                 "us": b.get(k, {}).get("us", 0.0) - a.get(k, {}).get("us", 0.0)} for k in keys]
        return sorted((r for r in rows if r["kernels"] or abs(r["us"]) > 0.05), key=lambda r: -abs(r["us"]))

    elapsed_us = (other["graph_elapsed"]["median_ms"] - base["graph_elapsed"]["median_ms"]) * 1e3
    per_region = delta(regions(base), regions(other))
    per_operator = delta(base["attributed"]["per_operator"], other["attributed"]["per_operator"])[:top]
    label = lambda r: step_label(r, "")  # noqa: E731
    lines = [f"difference {label(other)} - {label(base)}: graph elapsed {elapsed_us:+.1f} us"]
    lines += [f"  {d['name'][:60]:<60} {d['kernels']:+5d} kernels {d['us']:+9.1f} us" for d in per_region]
    lines.append("  by kernel name:")
    lines += [f"    {d['us']:+9.1f} us {d['kernels']:+5d}x  {d['name'][:100]}" for d in per_operator]
    return {"capacity": base["capacity"], "difference": [label(other), label(base)], "graph_elapsed_us": elapsed_us,
            "per_region": per_region, "per_operator": per_operator, "table": "\n".join(lines)}
