"""Where a prefill chunk's time goes, per layer, on this GPU: the Triton prefill attention kernel (a sweep of launch
configs, each checked against the default config's output) and cuBLAS for the layer's four projections at the
chunk's shape -- the parts ``ignition bench --prefill`` times together.

    python scripts/bench_prefill_parts.py --tokens 4096 [--heads 32 --kv-heads 8 --hidden 4096
        --intermediate 12288 --head-dim 128 --page 16 --context 0] [--samples 20] [--json OUT]

Each sample is one launch between CUDA events after warm-up (median, min, max); TFLOP/s counts the causal
attention's multiply-adds (2 * 2 * D per visible query-key pair and head) and the projections' 2 * M * N * K.
Random bf16 inputs (the kernels' time does not depend on the values).  Prints a table and writes the raw samples
as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ignition.components.kernels import prefill_attention  # noqa: E402
from qualify.timing import time_samples  # noqa: E402


def timed(fn, samples: int) -> list[float]:
    """Seconds per launch of ``fn`` between CUDA events, after warm-up (``qualify.timing``)."""
    return time_samples(fn, samples=samples, warmup=3, device="cuda")


def summary(samples: list[float], flops: float) -> dict:
    med = statistics.median(samples)
    return {"median_s": med, "min_s": min(samples), "max_s": max(samples), "tflops": flops / med / 1e12,
            "samples_s": samples}


def attention_case(args):
    t, h, kvh, d, page, ctx = args.tokens, args.heads, args.kv_heads, args.head_dim, args.page, args.context
    n_keys = ctx + t
    pages = -(-n_keys // page)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (pages + 1, page, kvh, d)
    k = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    q = torch.randn((1, t, h, d), device="cuda", generator=gen).to(torch.bfloat16)
    bt = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32)[None]
    pos = (ctx + torch.arange(t, device="cuda"))[None]
    lens = torch.tensor([n_keys], device="cuda")
    visible = sum(ctx + i + 1 for i in range(t))
    return (q, k, v, bt, pos, lens), 4.0 * h * d * visible


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--context", type=int, default=0, help="keys before the chunk (default 0)")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=12288)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--configs", default="128x64w8s2,128x128w8s2,128x128w8s3,64x64w4s2,64x128w8s3",
                    help="BLOCK_MxBLOCK_N w WARPS s STAGES, comma-separated (the first row of the table is the "
                         "default config, whatever is listed)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_prefill_parts: needs a CUDA device", file=sys.stderr)
        return 2
    inputs, attn_flops = attention_case(args)
    scaling = args.head_dim ** -0.5
    default_cfg = prefill_attention.paged_prefill_config(args.tokens, args.heads // args.kv_heads, args.head_dim,
                                                         args.page)
    ref = prefill_attention.paged_prefill_attention_triton(*inputs, scaling)
    rows = [("default " + "{BLOCK_M}x{BLOCK_N}w{num_warps}s{num_stages}".format(**default_cfg), None)]
    for spec in filter(None, args.configs.split(",")):
        mn, rest = spec.split("w")
        bm, bn = (int(x) for x in mn.split("x"))
        w, st = (int(x) for x in rest.split("s"))
        rows.append((spec, {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st}))
    result = {"args": vars(args), "device": torch.cuda.get_device_name(), "default_config": default_cfg,
              "attention": {}, "projections": {}}
    print(f"prefill attention, {args.tokens} tokens after {args.context}, H={args.heads} KV={args.kv_heads} "
          f"D={args.head_dim} page={args.page}: {attn_flops / 1e9:.1f} GFLOP")
    for name, cfg in rows:
        try:
            out = prefill_attention.paged_prefill_attention_triton(*inputs, scaling, config=cfg)
            diff = (out.float() - ref.float()).abs().max().item()
            rec = summary(timed(lambda: prefill_attention.paged_prefill_attention_triton(*inputs, scaling, config=cfg),
                                args.samples), attn_flops)
            rec["max_abs_diff_vs_default"] = diff
        except Exception as exc:  # a config that does not compile (shared memory): recorded, the sweep goes on
            rec = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        result["attention"][name] = rec
        if "error" in rec:
            print(f"  {name:22s} error: {rec['error']}")
        else:
            print(f"  {name:22s} {rec['median_s'] * 1e3:8.3f} ms (min {rec['min_s'] * 1e3:.3f}, max "
                  f"{rec['max_s'] * 1e3:.3f})  {rec['tflops']:6.1f} TFLOP/s  max |diff| vs default "
                  f"{rec['max_abs_diff_vs_default']:.3g}")
    m, hd, inter = args.tokens, args.hidden, args.intermediate
    qkv_n = (args.heads + 2 * args.kv_heads) * args.head_dim
    shapes = {"qkv": (hd, qkv_n), "o_proj": (args.heads * args.head_dim, hd), "gate_up": (hd, 2 * inter),
              "down": (inter, hd)}
    print(f"projections (cuBLAS, torch.nn.functional.linear), M={m}:")
    total = 0.0
    for name, (k_dim, n_dim) in shapes.items():
        x = torch.randn(m, k_dim, device="cuda").to(torch.bfloat16)
        w = torch.randn(n_dim, k_dim, device="cuda").to(torch.bfloat16)
        rec = summary(timed(lambda: torch.nn.functional.linear(x, w), args.samples), 2.0 * m * n_dim * k_dim)
        result["projections"][name] = rec
        total += rec["median_s"]
        print(f"  {name:8s} {m}x{n_dim}x{k_dim}: {rec['median_s'] * 1e3:8.3f} ms  {rec['tflops']:6.1f} TFLOP/s")
    attn = result["attention"][rows[0][0]]
    result["per_layer_s"] = {"projections": total, "attention": attn.get("median_s")}
    print(f"per layer: projections {total * 1e3:.3f} ms + attention {attn.get('median_s', float('nan')) * 1e3:.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
