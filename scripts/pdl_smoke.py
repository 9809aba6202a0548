#!/usr/bin/env python3
"""Programmatic dependent launch (PDL) on this GPU: correctness and a side-by-side cost, before anything relies on it.

A decode-layer-shaped chain of the project's Triton kernels (norm + QKV GEMV, q/k norm + rotary + KV write, split
decode attention, o_proj + residual, gate/up (cuBLAS), down with the SiLU-gated prologue + residual), repeated
``--layers`` times, run:

1. eagerly with ``FLARE_PDL=0`` (the reference),
2. eagerly with PDL,
3. captured into one CUDA graph with PDL and replayed ``--replays`` times, and the same graph without PDL --

outputs and KV pools must be bitwise equal in all of them (the kernels' summation orders do not depend on PDL).
Then both graphs are timed side by side (CUDA events around replay, interleaved, ``--samples`` each).
Prints one JSON line; exit status 1 when any result differs.

    python scripts/pdl_smoke.py --json OUT.json [--hidden 4096 --heads 32 --kv-heads 8 --inter 12288 --layers 36]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ignition.components.kernels import launch, linear, paged_decode, rms_norm, rope_write  # noqa: E402


def build(args, dev):
    g = torch.Generator(device=dev).manual_seed(0)
    h, d, nh, kv, inter = args.hidden, 128, args.heads, args.kv_heads, args.inter
    r = lambda *s, scale=1.0: (torch.randn(*s, device=dev, generator=g) * scale).to(torch.bfloat16)  # noqa: E731
    layers = [dict(qkv=r((nh + 2 * kv) * d, h, scale=h ** -0.5), o=r(h, nh * d, scale=(nh * d) ** -0.5),
                   gu=r(2 * inter, h, scale=h ** -0.5), down=r(h, inter, scale=inter ** -0.5),
                   n1=r(h, scale=0.1) + 1, n2=r(h, scale=0.1) + 1, qn=r(d, scale=0.1) + 1, kn=r(d, scale=0.1) + 1)
              for _ in range(args.layers)]
    page, pages = 16, args.context // 16 + 2
    pools = [(torch.zeros(pages + 1, page, kv, d, dtype=torch.bfloat16, device=dev),
              torch.zeros(pages + 1, page, kv, d, dtype=torch.bfloat16, device=dev)) for _ in range(args.layers)]
    for kp, vp in pools:
        kp.normal_(generator=g), vp.normal_(generator=g)
    bt = torch.arange(pages, dtype=torch.int32, device=dev)[None, :]
    lens = torch.tensor([args.context], device=dev)
    slots = torch.tensor([args.context - 1], device=dev)
    ang = torch.arange(d // 2, device=dev).float()
    cos = torch.cat([ang.cos(), ang.cos()]).to(torch.bfloat16).view(1, 1, d)
    sin = torch.cat([ang.sin(), ang.sin()]).to(torch.bfloat16).view(1, 1, d)
    x = r(1, h)
    return layers, pools, bt, lens, slots, cos, sin, x


def chain(args, state):
    layers, pools, bt, lens, slots, cos, sin, x = state
    nh, kv, d = args.heads, args.kv_heads, 128
    for w, (kp, vp) in zip(layers, pools):
        qkv = linear.fused_linear_triton(x, w["qkv"], norm_weight=w["n1"], eps=1e-6)
        q, k, v = (t.view(1, 1, -1, d) for t in qkv.split([nh * d, kv * d, kv * d], dim=-1))
        q = rope_write.rope_write_triton(q, k, v, w["qn"], w["kn"], 1e-6, cos, sin, kp, vp, slots)
        a = paged_decode.paged_decode_attention_triton(q, kp, vp, bt, lens, d ** -0.5).view(1, -1)
        h1 = linear.fused_linear_triton(a, w["o"], residual=x)
        gu = F.linear(rms_norm.rms_norm_triton(h1, w["n2"], 1e-6), w["gu"])
        x = linear.fused_linear_triton(gu, w["down"], residual=h1, gated_input=True)
    return x


def snapshot(state, out):
    return [out.clone()] + [p.clone() for kp_vp in state[1] for p in kp_vp]


def restore(state, saved):
    for (kp, vp), (k0, v0) in zip(state[1], saved):
        kp.copy_(k0), vp.copy_(v0)


def capture(args, state):
    os.environ["FLARE_PDL"] = "1" if args._pdl else "0"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain(args, state)  # warm-up (compiles this variant)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(args, state)
    return graph, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--inter", type=int, default=12288)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    dev = torch.device("cuda")
    state = build(args, dev)
    pristine = [(kp.clone(), vp.clone()) for kp, vp in state[1]]
    result = {"device": torch.cuda.get_device_name(), "args": {k: v for k, v in vars(args).items() if k != "json"}}

    os.environ["FLARE_PDL"] = "0"
    ref = snapshot(state, chain(args, state))
    restore(state, pristine)
    os.environ["FLARE_PDL"] = "1"
    result["pdl_enabled"] = launch.pdl_enabled(dev)
    eager_pdl = snapshot(state, chain(args, state))
    same = {"eager_pdl": all(torch.equal(a, b) for a, b in zip(ref, eager_pdl))}

    graphs = {}
    for pdl in (True, False):
        args._pdl = pdl
        restore(state, pristine)
        graphs[pdl] = capture(args, state)
        ok = True
        for _ in range(args.replays):
            restore(state, pristine)
            graphs[pdl][0].replay()
            torch.cuda.synchronize()
            ok &= all(torch.equal(a, b) for a, b in zip(ref, snapshot(state, graphs[pdl][1])))
        same["graph_pdl" if pdl else "graph_nopdl"] = bool(ok)
    result["bitwise_equal"] = same

    times = {True: [], False: []}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10):
        for pdl in (True, False):
            graphs[pdl][0].replay()
    for _ in range(args.samples):
        for pdl in (True, False):
            start.record()
            graphs[pdl][0].replay()
            end.record()
            end.synchronize()
            times[pdl].append(start.elapsed_time(end))
    result["graph_ms"] = {("pdl" if k else "nopdl"): {"median": statistics.median(v), "min": min(v), "max": max(v),
                                                      "samples": v} for k, v in times.items()}
    result["pdl_over_nopdl"] = result["graph_ms"]["pdl"]["median"] / result["graph_ms"]["nopdl"]["median"]
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    brief = {k: v for k, v in result.items() if k != "graph_ms"}
    brief["graph_ms"] = {k: {s: round(x, 4) for s, x in v.items() if s != "samples"} for k, v in result["graph_ms"].items()}
    print(json.dumps(brief))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
