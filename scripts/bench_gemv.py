#!/usr/bin/env python
"""Benchmark the decode GEMV (``fused_linear_triton``) on the GPU against cuBLAS (``F.linear``).

For Qwen3-8B and Qwen3-0.6B projection shapes and M in {1, 4, 8}: every variant is captured in a CUDA graph
of ``--launches`` back-to-back launches (launch overhead amortized as in a captured decode step) and timed
over ``--replays`` replays.  ``--weights cold`` (default): the launches cycle through identical copies of the
weight, at least ``COLD_BYTES`` in all (more than the H200's 50 MB L2), so every launch streams its weight from
HBM as in a decode step, where each layer's weights are read once; ``--weights warm``: one copy, as sweeps before
2026-12-01 ran -- a weight below the L2 size is then partly served from L2 and reads faster than in a step.
Reported per launch: microseconds, achieved GB/s (weight bytes / time) and the ratio to ``F.linear`` on the
same weight (cuBLAS alone: for gated shapes the bare [2I, K] projection without the silu-mul; with norm/residual
flags the unfused torch ops are not counted -- the fused kernel's ratio is thus conservative).  The heuristic
config (``gemv_config``) is timed first, then a bounded sweep of alternatives (BN 4/8/16/32, BK 256/512/1024,
num_warps 4/8, num_stages 1/2/3; with ``--dot`` the tensor-core variant for 2..16 rows, BN 16/32/64,
BK 64/128/256, num_warps 1/2/4/8, num_stages 3/4/5/6): by default a coordinate sweep
around the heuristic plus a few joint moves, under ``--budget-s`` seconds in all (compiles dominate; ``--full``
times the whole grid).  Each config's output is checked against ``fused_linear_reference`` (2 bf16 ulps plus an
fp32-reordering term; 4 ulps when gated); failing configs are reported and never picked.  Prints a table and
the best config per shape (the input for updating ``gemv_config``), and writes JSON to ``--json``.

    python scripts/bench_gemv.py --json /tmp/gemv.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ignition.components.fused_linear import DOT_ROWS, fused_linear_reference, reorder_bound  # noqa: E402
from ignition.components.norms import rms_norm_reference  # noqa: E402
from ignition.components.kernels.linear import GEMV_MAX_ROWS, fused_linear_triton, gemm_rows_config, gemv_config

# (model, name, N weight rows, K, gated, norm, residual[, gated input]): the flags mirror how a decoder layer calls
# it; "down-gi" is down taking gate/up's packed [gate; up] output (x [M, 2K], silu(gate) * up in the prologue)
SHAPES = [
    ("qwen3-8b", "qkv", 6144, 4096, False, True, False),
    ("qwen3-8b", "qkv-plain", 6144, 4096, False, False, False),  # normed apart: FLARE_GEMV_DOT's few-row qkv
    ("qwen3-8b", "o_proj", 4096, 4096, False, False, True),
    ("qwen3-8b", "gate_up", 24576, 4096, True, True, False),
    ("qwen3-8b", "gate_up-packed", 24576, 4096, False, True, False),  # ungated: the packed [gate; up] for down-gi
    ("qwen3-8b", "down", 4096, 12288, False, False, True),
    ("qwen3-8b", "down-gi", 4096, 12288, False, False, True, True),
    ("qwen3-0.6b", "qkv", 4096, 1024, False, True, False),
    ("qwen3-0.6b", "qkv-plain", 4096, 1024, False, False, False),  # normed apart: the few-row tensor-core qkv
    ("qwen3-0.6b", "o_proj", 1024, 2048, False, False, True),
    ("qwen3-0.6b", "gate_up", 6144, 1024, True, True, False),
    ("qwen3-0.6b", "down", 1024, 3072, False, False, True),
]
MS = (1, 4, 8)
#: ``--weights cold``: the copies of a weight the launches cycle through add up to at least this many bytes.
COLD_BYTES = 128 << 20
BNS, BKS, WARPS, STAGES = (4, 8, 16, 32), (256, 512, 1024), (4, 8), (1, 2, 3)
#: ``--dot``: the tensor-core variant's grid (2..16 rows; ``FLARE_GEMV_DOT``)
DOT_BNS, DOT_BKS, DOT_STAGES = (16, 32, 64), (64, 128, 256), (3, 4, 5, 6)  # run 31: s5 won at the edge
#: its warps: 1 and 2 too -- with a prologue (norm, gated input) each warp recomputes the whole input tile in the
#: dot-operand layout (offline sm90 PTX: 4 warps, 4x the ex2 per tile; 1 warp, once), which is what made run 23's
#: gated down 165 us
DOT_WARPS = (1, 2, 4, 8)


def graph_time_us(fn, launches: int, replays: int) -> float:
    """Per-launch microseconds of ``fn`` captured ``launches`` times in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(launches):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):  # best of 3 windows: robust to a stray clock dip
        start.record()
        for _ in range(replays):
            g.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / (replays * launches))
    del g
    return best


def _wall_time_us(fn, launches: int, replays: int) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def within_bound(got, ref, y_ref, xn, w, gated, norm) -> tuple[bool, float]:
    """(ok, max error in ulps of the reference).  The bound of ``tests/components/test_triton_kernels.py``:
    2 ulps (4 when gated) + 2^-20 * sum_k |xn_k w_k| (fp32 reordering near cancellation); with the norm prologue
    a neighbouring bf16 xn (fp32 statistics in another order, Triton's rsqrt) perturbs the sum by a random walk
    bounded by 6 sigma; gated: the gate/up errors propagated through silu(g) * u."""
    tol_abs = reorder_bound(xn, w, norm=norm, gated=gated)
    ulp = 2.0 ** -7 * ref.float().abs()
    err = (got.float() - ref.float()).abs()
    # y's error (y_ref: the result before the residual), plus 2 ulps of the final bf16(residual + y)
    tol = (4 if gated else 2) * 2.0 ** -7 * y_ref.float().abs() + tol_abs + (2 * ulp if y_ref is not ref else 0)
    ok = bool((err <= tol).all())
    return ok, float((err / ulp.clamp(min=1e-30)).max())


def candidate_configs(m, n, k, gated, heuristic, full, dot=False):
    bns, bks, warps, stages = (DOT_BNS, DOT_BKS, DOT_WARPS, DOT_STAGES) if dot else (BNS, BKS, WARPS, STAGES)
    if full:
        grid = [{"BN": bn, "BK": bk, "num_warps": nw, "num_stages": ns}
                for bn, bk, nw, ns in itertools.product(bns, bks, warps, stages)]
    else:
        grid = []
        for key, vals in (("BN", bns), ("BK", bks), ("num_warps", warps), ("num_stages", stages)):
            grid += [{**heuristic, key: v} for v in vals]
        joint = ((16, 256), (32, 64), (64, 64), (32, 256)) if dot else \
            ((8, 512), (16, 512), (8, 1024), (16, 256), (32, 256), (4, 1024))
        for bn, bk in joint:
            for nw in warps:
                grid.append({**heuristic, "BN": bn, "BK": bk, "num_warps": nw})
    mp = min(1 << (m - 1).bit_length(), GEMV_MAX_ROWS)
    out, seen = [], {json.dumps(heuristic, sort_keys=True)}
    for c in grid:
        key = json.dumps(c, sort_keys=True)
        if key in seen or c["BK"] > max(16, 1 << (k - 1).bit_length()):
            continue
        if not dot and mp * c["BN"] * c["BK"] * (2 if gated else 1) > 4 * 16384:  # would spill: not worth a compile
            continue
        seen.add(key)
        out.append(c)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--launches", type=int, default=20, help="launches captured per CUDA graph")
    ap.add_argument("--replays", type=int, default=20, help="graph replays per timing window")
    ap.add_argument("--budget-s", type=float, default=55.0, help="wall-clock budget for the sweep (all shapes)")
    ap.add_argument("--full", action="store_true", help="time the whole config grid (ignores --budget-s)")
    ap.add_argument("--no-sweep", action="store_true", help="heuristic config and cuBLAS only")
    ap.add_argument("--models", default="qwen3-8b,qwen3-0.6b")
    ap.add_argument("--names", default="", help="only these shape names (comma-separated; default all)")
    ap.add_argument("--rows", default="1,4,8", help="M values (comma-separated)")
    ap.add_argument("--weights", choices=("cold", "warm"), default="cold",
                    help="cold: launches cycle through weight copies (>= 128 MiB, streamed from HBM as in a step); "
                         "warm: one copy (small weights partly L2-resident)")
    ap.add_argument("--dot", action="store_true",
                    help="2..16 rows through the tensor-core variant (forced for every shape, prologues included; "
                         "the step takes it with FLARE_GEMV_DOT=1 for plain inputs only), its own config grid")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check of this script: TRITON_INTERPRET=1, tiny shapes, wall-clock timing (no numbers)")
    args = ap.parse_args()
    global graph_time_us
    if args.smoke:
        dev = torch.device("cpu")
        shapes = [("smoke", "plain", 96, 64, False, True, False), ("smoke", "gated", 64, 128, True, True, True)]
        graph_time_us = _wall_time_us
        args.launches, args.replays = 1, 1
    else:
        if not torch.cuda.is_available():
            print("bench_gemv: needs a CUDA device", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # the reference: fp32 sums
        dev = torch.device("cuda")
        shapes = [s for s in SHAPES if s[0] in args.models.split(",")
                  and (not args.names or s[1] in args.names.split(","))]
    t0 = time.time()
    cases = [(s, m) for s in shapes for m in (MS if args.smoke else [int(r) for r in args.rows.split(",")])]
    results, failures = [], 0
    gen = torch.Generator(device=dev).manual_seed(0)
    print(f"{'shape':<22}{'M':>3} {'config':<34}{'us':>8}{'GB/s':>8}{'vs F.linear':>12}{'max ulp':>9}  ok")
    for idx, ((model, name, n, k, gated, norm, residual, *gi), m) in enumerate(cases):
        gated_input = bool(gi and gi[0])
        n_out = n // 2 if gated else n
        x = torch.randn(m, 2 * k if gated_input else k, device=dev, generator=gen).to(torch.bfloat16)
        w = (torch.randn(n, k, device=dev, generator=gen) / k ** 0.5).to(torch.bfloat16)
        nw = (torch.rand(k, device=dev, generator=gen) + 0.5).to(torch.bfloat16) if norm else None
        r = torch.randn(m, n_out, device=dev, generator=gen).to(torch.bfloat16) if residual else None
        ref = fused_linear_reference(x, w, nw, 1e-6, r, gated, gated_input)
        y_ref = fused_linear_reference(x, w, nw, 1e-6, None, gated, gated_input) if residual else ref
        xn = rms_norm_reference(x, nw, 1e-6) if norm else x
        if gated_input:  # the activation the kernel forms (its bf16 may differ by an ulp: bounded as a norm's)
            xn = F.silu(x[:, :k]) * x[:, k:]
        wbytes = w.numel() * w.element_size()
        copies = -(-COLD_BYTES // wbytes) if args.weights == "cold" and dev.type == "cuda" else 1
        weights = [w] + [w.clone() for _ in range(copies - 1)]  # identical values: every launch checks the same
        launches = max(args.launches, copies)

        def cycling(call):
            """``call(weight)`` as a no-argument launch, each call on the next copy."""
            it = itertools.cycle(weights)
            return lambda: call(next(it))

        t_cublas = graph_time_us(cycling(lambda wc: F.linear(xn if gated_input else x, wc)), launches, args.replays)
        label = f"{model}/{name}"
        dot = args.dot and m in DOT_ROWS  # forced: every prologue and epilogue of the tensor-core kernel
        heur = (gemm_rows_config if dot else gemv_config)(m, n, k, gated)
        row = {"model": model, "name": name, "M": m, "N": n, "K": k, "gated": gated, "norm": norm, "dot": dot,
               "residual": residual, "gated_input": gated_input, "weight_bytes": wbytes, "weights": args.weights,
               "weight_copies": copies, "cublas_us": t_cublas,
               "cublas_gbs": wbytes / t_cublas / 1e3, "heuristic": heur, "configs": []}
        print(f"{label:<22}{m:>3} {'F.linear (cuBLAS)':<34}{t_cublas:>8.2f}{wbytes / t_cublas / 1e3:>8.0f}"
              f"{1.0:>12.2f}{'':>9}")

        def measure(cfg, tag):
            try:
                got = fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, residual=r, gated=gated,
                                          gated_input=gated_input, config=cfg, dot=dot)
                again = fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, residual=r, gated=gated,
                                            gated_input=gated_input, config=cfg, dot=dot)
                ok, max_ulps = within_bound(got, ref, y_ref, xn, w, gated, norm or gated_input)
                ok = ok and torch.equal(got.view(torch.int16), again.view(torch.int16))
                t = graph_time_us(cycling(lambda wc: fused_linear_triton(x, wc, norm_weight=nw, eps=1e-6, residual=r,
                                                                         gated=gated, gated_input=gated_input,
                                                                         config=cfg, dot=dot)),
                                  launches, args.replays)
            except Exception as e:  # a config that fails to compile (out of resources): recorded, skipped
                row["configs"].append({"config": cfg, "error": repr(e)[:200]})
                print(f"{'':<25}{json.dumps(cfg):<34} error: {repr(e)[:60]}")
                return None
            rec = {"config": cfg, "us": t, "gbs": wbytes / t / 1e3, "vs_cublas": t / t_cublas, "max_ulps": max_ulps,
                   "ok": ok, "tag": tag}
            row["configs"].append(rec)
            if tag == "heuristic" or args.full is False:
                c = f"{cfg['BN']}x{cfg['BK']} w{cfg['num_warps']} s{cfg['num_stages']}"
                c += " *" if tag == "heuristic" else ""
                print(f"{'':<25}{c:<34}{t:>8.2f}{rec['gbs']:>8.0f}{rec['vs_cublas']:>12.2f}{max_ulps:>9.2f}  "
                      f"{'ok' if ok else 'FAIL'}")
            return rec

        h = measure(heur, "heuristic")
        if h is None or not h["ok"]:
            failures += 1
        if not args.no_sweep:
            left = len(cases) - idx
            deadline = time.time() + max(0.0, (args.budget_s - (time.time() - t0)) / left)
            for cfg in candidate_configs(m, n, k, gated, heur, args.full, dot):
                if not args.full and time.time() > deadline:
                    row["sweep_truncated"] = True
                    break
                measure(cfg, "sweep")
        good = [c for c in row["configs"] if c.get("ok")]
        best = min(good, key=lambda c: c["us"]) if good else None
        row["best"] = best
        if best is not None:
            print(f"{'':<25}best {json.dumps(best['config'])}: {best['us']:.2f} us, {best['gbs']:.0f} GB/s, "
                  f"{best['vs_cublas']:.2f}x cuBLAS (heuristic {h['us'] / best['us'] if h else float('nan'):.2f}x "
                  f"slower)")
        results.append(row)

    print("\nbest config per shape (for gemv_config):")
    for row in results:
        b = row["best"]
        print(f"  M={row['M']:<2} N={row['N']:<6} K={row['K']:<6} gated={int(row['gated'])} -> "
              f"{json.dumps(b['config']) if b else 'none'}  heuristic {json.dumps(row['heuristic'])}")
    print(f"\n{len(results)} shapes, {failures} heuristic failures, {time.time() - t0:.1f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                                         "torch": torch.__version__,
                                         "results": results}, indent=1))
        print(f"wrote {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
