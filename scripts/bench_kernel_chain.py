#!/usr/bin/env python3
"""What one dependent kernel costs on this GPU, whatever it computes: a chain of trivial Triton kernels -- each reads
what the kernel before it wrote, adds one and writes it back -- captured into one CUDA graph and replayed; the time
per link is the floor a decode step pays per kernel in its dependency chain (Qwen3-0.6B runs six per layer at 4-7 us
each on the H200, ``results/20261201T145055Z-sm90-run41``).

Variants (``--sizes``: fp32 elements each link reads and writes, over ``--block``-element programs):

- ``plain``: launched without programmatic dependent launch (stream order);
- ``pdl``: ``launch_pdl`` with the project's rule, the dependents launched after the wait (``_pdl_enter``);
- ``early``: the dependents launched before the wait (the ``EARLY`` reduce kernel's rule).

Every link's result is checked (the chain's last buffer must hold ``initial + links``) before anything is timed;
then each variant's graph is replayed ``--samples`` times with CUDA events around each replay, the variants
interleaved.  Prints a table and, with ``--json``, the per-link samples.

    python scripts/bench_kernel_chain.py [--links 200] [--sizes 1024,262144,4194304] [--samples 50] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ignition.components.kernels import launch  # noqa: E402
from qualify.timing import interleaved  # noqa: E402

VARIANTS = ("plain", "pdl", "early")


@triton.jit
def _link_kernel(X, Y, N, BLOCK: tl.constexpr, USE_PDL: tl.constexpr, EARLY: tl.constexpr):
    launch._pdl_enter(USE_PDL, EARLY)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    tl.store(Y + offs, tl.load(X + offs, mask=mask) + 1.0, mask=mask)


def run_chain(bufs: tuple[torch.Tensor, torch.Tensor], links: int, variant: str, block: int) -> torch.Tensor:
    """``links`` kernels alternating between the two buffers (the first reads ``bufs[0]``); returns the last one
    written."""
    pdl = variant != "plain" and launch.pdl_enabled(bufs[0].device)
    opts = {"USE_PDL": pdl, "EARLY": pdl and variant == "early"}
    if pdl:
        opts["launch_pdl"] = True
    n = bufs[0].numel()
    for i in range(links):
        _link_kernel[(triton.cdiv(n, block),)](bufs[i % 2], bufs[(i + 1) % 2], n, BLOCK=block, num_warps=4, **opts)
    return bufs[links % 2]


def check(size: int, links: int, variant: str, block: int, device: str) -> None:
    """Raises when the chain's result is not ``initial + links`` everywhere (a link read before its predecessor
    wrote)."""
    a = torch.arange(size, dtype=torch.float32, device=device)
    b = torch.full_like(a, float("nan"))
    out = run_chain((a.clone(), b), links, variant, block)
    if not torch.equal(out, a + links):
        bad = int((out != a + links).sum())
        raise AssertionError(f"kernel chain {variant} size {size}: {bad} of {size} values wrong after {links} links")


def measure(sizes: list[int], links: int, samples: int, block: int, variants=VARIANTS) -> list[dict]:
    """Per size and variant: the graph's per-link time, ``samples`` replays, interleaved."""
    rows = []
    for size in sizes:
        graphs, kept = {}, {}  # kept: each graph's buffers, alive while it replays (run 42 freed them: a fault)
        for v in variants:
            check(size, links, v, block, "cuda")
            bufs = kept[v] = (torch.zeros(size, device="cuda"), torch.zeros(size, device="cuda"))
            run_chain(bufs, links, v, block)  # compile outside the capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                run_chain(bufs, links, v, block)
            graphs[v] = g
        times = {v: [t * 1e6 / links for t in ts]  # us per link
                 for v, ts in interleaved({v: g.replay for v, g in graphs.items()}, samples=samples).items()}
        for v in variants:
            rows.append({"size": size, "bytes_per_link": 8 * size, "programs": triton.cdiv(size, block),
                         "variant": v, "links": links, "us_per_link": times[v],
                         "median_us": statistics.median(times[v]), "min_us": min(times[v]), "max_us": max(times[v])})
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'elements':>10} {'programs':>9} {'variant':>8} {'us/link':>9} {'min':>8} {'max':>8}"]
    lines += [f"{r['size']:>10} {r['programs']:>9} {r['variant']:>8} {r['median_us']:9.3f} {r['min_us']:8.3f} "
              f"{r['max_us']:8.3f}" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--links", type=int, default=200)
    ap.add_argument("--sizes", default="1024,262144,4194304", help="fp32 elements per link, comma-separated")
    ap.add_argument("--block", type=int, default=1024, help="elements per program (a power of two)")
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.links < 2 or args.samples < 1 or not sizes or min(sizes) < 1 or args.block & (args.block - 1):
        ap.error("--links >= 2, --samples >= 1, sizes >= 1 and a power-of-two --block")
    if not torch.cuda.is_available():
        print("bench_kernel_chain: no CUDA device", file=sys.stderr)
        return 2
    rows = measure(sizes, args.links, args.samples, args.block)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
