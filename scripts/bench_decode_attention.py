"""A decode step's attention per layer, side by side on this GPU: ``rope_write`` + the two-pass decode kernels
(three launches) against the fused ``rope_decode_attention`` kernel + the reduce kernel at several split counts
and keys per block.

    python scripts/bench_decode_attention.py [--layers 36] [--context 1024] [--max-context 4096] [--rows 1,4]
        [--shapes 32x8,16x8] [--splits auto,8,16,32,64] [--block-n auto,16,32] [--samples 30] [--json OUT]

Each variant is captured as one CUDA graph of ``--layers`` consecutive layers (distinct pools, so K/V come from
HBM as in a real step; programmatic dependent launch as the recipe runs it) and replayed ``--samples`` times between
CUDA events; the table gives the median per layer.  Every variant's output is compared with the three-launch
path's (max |diff|).  Raw samples go to the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ignition.components.kernels import decode_plan, fused_decode, launch, paged_decode, rope_write  # noqa: E402
from qualify.timing import time_samples  # noqa: E402

EPS = 1e-6


def make_layers(n_layers, b, heads, kvh, d, ctx, max_ctx, page, gen):
    """Per layer: (q, k, v views of a packed QKV row, norm weights, cos, sin, k_pool, v_pool, slots, bt, lens)."""
    width = max_ctx // page
    pages = b * width
    layers = []
    for _ in range(n_layers):
        qkv = torch.randn(b, 1, (heads + 2 * kvh) * d, device="cuda", generator=gen).to(torch.bfloat16)
        q, k, v = (x.view(b, 1, -1, d) for x in qkv.split([heads * d, kvh * d, kvh * d], dim=-1))
        qw = (torch.rand(d, device="cuda", generator=gen) + 0.5).to(torch.bfloat16)
        kw = (torch.rand(d, device="cuda", generator=gen) + 0.5).to(torch.bfloat16)
        kp = torch.randn((pages + 1, page, kvh, d), device="cuda", generator=gen).to(torch.bfloat16)
        vp = torch.randn_like(kp)
        bt = torch.randperm(pages, device="cuda", generator=gen).view(b, width).to(torch.int32)
        lens = torch.full((b,), ctx, device="cuda", dtype=torch.int64)
        pos = lens - 1
        slots = bt[torch.arange(b, device="cuda"), pos // page].long() * page + pos % page
        ang = pos[:, None, None].float() * (1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d)))
        emb = torch.cat((ang, ang), dim=-1)
        layers.append((q, k, v, qw, kw, emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16), kp, vp, slots, bt,
                       lens))
    return layers


def three_launches(layer, scaling):
    q, k, v, qw, kw, cos, sin, kp, vp, slots, bt, lens = layer
    q_rot = rope_write.rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp, vp, slots)
    return paged_decode.paged_decode_attention_triton(q_rot, kp, vp, bt, lens, scaling)


def fused(layer, scaling, splits, block_n=None):
    q, k, v, qw, kw, cos, sin, kp, vp, slots, bt, lens = layer
    return fused_decode.rope_decode_attention_triton(q, k, v, qw, kw, EPS, cos, sin, kp, vp, slots, bt, lens, scaling,
                                                     num_splits=splits, block_n=block_n)


def graph_time(fn, layers, samples):
    """Median/min/max seconds per replay of one graph running ``fn`` on every layer, and the last layer's output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            outs = [fn(layer) for layer in layers]
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [fn(layer) for layer in layers]
    times = time_samples(graph.replay, samples=samples, warmup=3, device="cuda")
    return times, outs[-1].clone()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--shapes", default="32x8,16x8", help="HEADSxKV_HEADS, comma-separated (head_dim 128)")
    ap.add_argument("--splits", default="auto,16,32,64")
    ap.add_argument("--block-n", default="auto",
                    help="keys per block of the fused kernel, comma-separated (auto: the kernel's default)")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_decode_attention: needs a CUDA device", file=sys.stderr)
        return 2
    d, scaling = 128, 128 ** -0.5
    gen = torch.Generator(device="cuda").manual_seed(0)
    result = {"args": vars(args), "device": torch.cuda.get_device_name(),
              "pdl": launch.pdl_enabled(torch.device("cuda")),
              "cases": []}
    for shape in args.shapes.split(","):
        heads, kvh = (int(x) for x in shape.split("x"))
        for b in (int(r) for r in args.rows.split(",")):
            layers = make_layers(args.layers, b, heads, kvh, d, args.context, args.max_context, args.page, gen)
            print(f"H={heads} KV={kvh} rows={b} context={args.context}, {args.layers} layers:")
            variants = [("three launches", lambda layer: three_launches(layer, scaling))]
            for bn_arg in args.block_n.split(","):
                bn = None if bn_arg == "auto" else int(bn_arg)
                blocks = args.max_context // decode_plan.decode_block_n(args.page, bn)
                auto = decode_plan.fused_decode_num_splits(b, kvh, heads // kvh, blocks)
                for sp in args.splits.split(","):
                    s = auto if sp == "auto" else int(sp)
                    block_n = decode_plan.decode_block_n(args.page, bn)
                    name = f"fused s={s}{' (auto)' if sp == 'auto' else ''} block_n={block_n}"
                    variants.append((name, lambda layer, s=s, bn=bn: fused(layer, scaling, s, bn)))
            ref = None
            for name, fn in variants:
                try:
                    times, out = graph_time(fn, layers, args.samples)
                except Exception as exc:
                    print(f"  {name:32s} error: {type(exc).__name__}: {exc}"[:300])
                    result["cases"].append({"shape": shape, "rows": b, "variant": name, "error": str(exc)[:300]})
                    continue
                ref = out if ref is None else ref
                med = statistics.median(times)
                diff = (out.float() - ref.float()).abs().max().item()
                print(f"  {name:32s} {med / args.layers * 1e6:7.2f} us/layer (min {min(times) / args.layers * 1e6:.2f},"
                      f" max {max(times) / args.layers * 1e6:.2f})  max |diff| vs three launches {diff:.3g}")
                result["cases"].append({"shape": shape, "rows": b, "variant": name, "per_layer_median_s":
                                        med / args.layers, "graph_samples_s": times, "max_abs_diff": diff})
            del layers
            torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
