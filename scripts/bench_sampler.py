#!/usr/bin/env python3
"""The general sampler (``sample``, no ``max_top_k``) alone on this GPU: the full sort of every row against the
top-``n`` route with ``flare::sampling_cut`` for the rows the prefix does not decide (``FLARE_SAMPLER_PREFIX``),
against the full sort cut by ``flare::sorted_cut`` (``FLARE_SORTED_CUT_KERNEL``: what ``FLARE_SAMPLER_SORT_FREE=0``
runs) and against no sort (``flare::sampling_cut_compact`` for every row, the default), side by side in one process.

One compiled, captured graph per (batch, route) -- the parameters are tensors the graph reads, so each row mix below
is written into them between timing blocks, not compiled again:

- ``replay``: ``qualify.gpu_replay``'s rows (odd rows sampled: temperature 0.8, top_k 20, top_p 0.95; even rows
  greedy) -- what the decode graphs measured there sample;
- ``k20``: every row sampled with top_k 20, top_p 0.95;
- ``k0-p95``: top_k off, top_p 0.95 (the op's mass search over the whole row);
- ``k1000``: top_k 1000, top_p 1 (the op's count search);
- ``k0-p1``: top_k off, top_p 1 (no cut);
- ``hot-p95``: temperature 3 (logits ~ N(0, 1) nats: a flat row, the nucleus most of it), top_k off, top_p 0.95.

Then ``flare::sampling_cut``'s kernel alone (``--cut-configs``: warps x block), on the mixes that reach its
searches, captured one launch per graph.

Before timing, each mix's tokens from both routes are compared (the same draws, up to top-p near ties -- counted and
printed, never hidden).  Then ``--samples`` replays per graph with CUDA events, the routes interleaved.  Prints a
table; ``--json`` archives the samples.

    python scripts/bench_sampler.py [--batches 1,4] [--vocab 151936] [--samples 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ignition.components.sampling import SamplingTensors, sample  # noqa: E402
from ignition.components.sampling_cut import MEASURED_PREFIX  # noqa: E402
from ignition.components.switches import environment  # noqa: E402
from qualify.timing import interleaved  # noqa: E402

SAMPLED = {"temperature": 0.8, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
MIXES = {
    "replay": lambda r: SAMPLED if r % 2 else {"temperature": 0.0},
    "k20": lambda r: SAMPLED,
    "k0-p95": lambda r: {**SAMPLED, "top_k": 0},
    "k1000": lambda r: {**SAMPLED, "top_k": 1000, "top_p": 1.0},
    "k0-p1": lambda r: {**SAMPLED, "top_k": 0, "top_p": 1.0},
    "hot-p95": lambda r: {**SAMPLED, "temperature": 3.0, "top_k": 0},
}
#: Each route's environment (read at trace time): the full sort with the traced cut, the top-n prefix route (it takes
#: precedence over the sort-free cut), the full sort with ``flare::sorted_cut``'s one-launch cut
#: (``FLARE_SORTED_CUT_KERNEL``), and no sort at all: every row by ``flare::sampling_cut_compact`` (the default).
ROUTES = {"sort": {"FLARE_SAMPLER_PREFIX": "0", "FLARE_SORTED_CUT_KERNEL": "0", "FLARE_SAMPLER_SORT_FREE": "0"},
          "prefix": {"FLARE_SAMPLER_PREFIX": str(MEASURED_PREFIX)},
          "sortcut": {"FLARE_SAMPLER_PREFIX": "0", "FLARE_SORTED_CUT_KERNEL": "1", "FLARE_SAMPLER_SORT_FREE": "0"},
          "sortfree": {"FLARE_SAMPLER_PREFIX": "0", "FLARE_SAMPLER_SORT_FREE": "1"}}


def build(batch: int, vocab: int, route: str, logits: torch.Tensor):
    """``(graph, params, tokens)``: the compiled sampler over ``logits`` captured in ``route``'s environment
    (:data:`ROUTES`)."""
    params = SamplingTensors.empty(batch, vocab_size=vocab, device="cuda")
    torch._dynamo.reset()  # the route is read at trace time
    with environment(ROUTES[route]):
        fn = torch.compile(lambda x: sample(x, params), fullgraph=True, dynamic=False)
        set_mix(params, "k20")
        for _ in range(2):
            fn(logits)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            tokens = fn(logits)
    return graph, params, tokens


def time_graphs(graphs: dict, samples: int) -> dict:
    """``samples`` replays of each graph (interleaved, after 5 untimed rounds): microseconds per replay."""
    times = interleaved({name: graph.replay for name, graph in graphs.items()}, samples=samples, warmup=5)
    return {name: [t * 1e6 for t in ts] for name, ts in times.items()}


def cut_alone(batch: int, vocab: int, scale: float, configs: list[tuple[int, int]], samples: int) -> list[dict]:
    """The sort-free kernel alone per config on the ``k0-p95`` and ``k1000`` rows (temperature-scaled logits)."""
    from ignition.components.sampling_cut import sampling_cut_reference
    from ignition.components.kernels.sampling_cut import sampling_cut_triton

    g = torch.Generator(device="cuda").manual_seed(100 + batch)
    y = torch.randn(batch, vocab, device="cuda", generator=g) * scale / SAMPLED["temperature"]
    skip = torch.zeros(batch, dtype=torch.bool, device="cuda")
    rows = []
    for mix, k, p in (("k0-p95", 0, 0.95), ("k1000", 1000, 1.0)):
        top_k = torch.full((batch,), k, dtype=torch.int32, device="cuda")
        top_p = torch.full((batch,), p, device="cuda")
        want = sampling_cut_reference(y, top_k, top_p, skip)
        graphs, outs = {}, {}
        for warps, block in configs:
            sampling_cut_triton(y, top_k, top_p, skip, block=block, num_warps=warps)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs[(warps, block)] = sampling_cut_triton(y, top_k, top_p, skip, block=block, num_warps=warps)
            graphs[(warps, block)] = graph
        for cfg, t in time_graphs(graphs, samples).items():
            rows.append({"batch": batch, "mix": mix, "warps": cfg[0], "block": cfg[1], "us": t,
                         "median_us": statistics.median(t), "min_us": min(t), "max_us": max(t),
                         "cuts_equal_sorted_reference": int((outs[cfg] == want).sum())})
    return rows


def set_mix(params: SamplingTensors, mix: str) -> None:
    for r in range(params.capacity):
        params.set_row(r, {**MIXES[mix](r), "seed": 77 + r})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--scale", type=float, default=3.0, help="logits ~ N(0, scale^2)")
    ap.add_argument("--cut-configs", default="16x2048,8x2048,16x1024,8x1024", help="warps x block of the kernel alone")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_sampler: no CUDA device", file=sys.stderr)
        return 2
    rows, differ = [], {}
    for batch in [int(b) for b in args.batches.split(",") if b]:
        g = torch.Generator(device="cuda").manual_seed(batch)
        logits = torch.randn(batch, args.vocab, device="cuda", generator=g) * args.scale
        built = {route: build(batch, args.vocab, route, logits) for route in ROUTES}
        for mix in MIXES:
            for _, params, _ in built.values():
                set_mix(params, mix)
            toks = {}
            for route, (graph, params, tokens) in built.items():
                graph.replay()
                toks[route] = tokens.clone()
            differ[f"b{batch}-{mix}"] = {route: int((toks["sort"] != t).sum()) for route, t in toks.items()
                                         if route != "sort"}
            times = time_graphs({route: graph for route, (graph, _, _) in built.items()}, args.samples)
            for route, t in times.items():
                rows.append({"batch": batch, "mix": mix, "route": route, "us": t, "median_us": statistics.median(t),
                             "min_us": min(t), "max_us": max(t)})
    print(f"{'B':>3} {'mix':>8} {'route':>7} {'median us':>10} {'min':>8} {'max':>8}")
    for r in rows:
        print(f"{r['batch']:>3} {r['mix']:>8} {r['route']:>7} {r['median_us']:10.2f} {r['min_us']:8.2f} "
              f"{r['max_us']:8.2f}")
    print("tokens differing between the routes (first replay of each mix):", differ)
    configs = [tuple(int(v) for v in c.split("x")) for c in args.cut_configs.split(",") if c]
    alone = [r for b in [int(b) for b in args.batches.split(",") if b]
             for r in cut_alone(b, args.vocab, args.scale, configs, args.samples)]
    print(f"{'B':>3} {'mix':>8} {'warps':>6} {'block':>6} {'median us':>10} {'min':>8} {'max':>8} {'= sorted':>9}")
    for r in alone:
        print(f"{r['batch']:>3} {r['mix']:>8} {r['warps']:>6} {r['block']:>6} {r['median_us']:10.2f} "
              f"{r['min_us']:8.2f} {r['max_us']:8.2f} {r['cuts_equal_sorted_reference']:>9}")
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "prefix": MEASURED_PREFIX,
                                         "differ": differ, "rows": rows, "cut_alone": alone}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
