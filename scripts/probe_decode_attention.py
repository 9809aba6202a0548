"""Where the decode attention's time goes inside the step: clock stamps from inside the fused decode kernel and its
reduce kernel (``rope_decode_attention_triton(probe=...)``), captured in a CUDA graph of one-row decode layers built
as the Qwen3 recipe runs them at batch 1 (qkv GEMV with the norm prologue -> fused attention -> reduce -> o_proj GEMV
with the residual -> MLP; the GEMVs after the attention ``early``), so the attention launches early under the qkv
projection as in a real step.

    python scripts/probe_decode_attention.py [--shapes 8B,0.6B] [--context 1024] [--replays 20] [--json OUT]
        [--env NAME=VALUE,... ...]   (one variant per --env string, e.g. "FLARE_DECODE_KV_PREFETCH=0"; "" = default)

Per program the fused kernel stamps %globaltimer and %clock64 at: 0 entry, 1 after its share and the K/V prefetch,
2 after the PDL wait, 3 query rows normed and rotated, 4 after the new key/value write, 5 after the key loop, 6 after
its partials are stored, and in its last key block 8 start, 9 page ids loaded, 10 K and V loaded, 11 scores and
softmax, 12 P V accumulated (each stamp waits for its data, so the block stamps serialize a software-pipelined loop);
the reduce kernel at 0 entry, 2 after its wait, 6 after its store.  The table gives medians
over layers (the first skipped) of: phase durations per program (median and max over programs), the entry spread,
how many programs entered only after the first one passed its wait (not resident when the qkv projection ended),
on how many SMs its programs ran and the most on one SM, the attention's span from the first wait release to the
last store, the reduce's wait and its own span; pooled over layers, the last block's K, V phase grouped by the
attention programs on its SM and by the output projection's preloads on its SM overlapping it (``kv_neighbours``).
The variants' unprobed graphs are then timed side by side (interleaved replays; ratios to the first variant).
Two variables shape a variant's graph itself (read at capture): ``FLARE_PROBE_QKV_EARLY=1`` (the qkv projection lets
the attention launch before its own wait) and ``FLARE_PROBE_ATTENTION_ALONE=1`` (each layer its attention and reduce
alone on a fixed qkv output: the K, V phase without any weight stream beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ignition.components.kernels import decode_plan, fused_decode, launch, linear  # noqa: E402
from ignition.components.decode_attention import decode_reduce_prefetch_bytes  # noqa: E402
from ignition.components.switches import environment  # noqa: E402
from qualify.timing import captured, interleaved  # noqa: E402

EPS = 1e-6
#: name -> (hidden, heads, KV heads, intermediate, layers, MLP as the recipe runs it at one row)
#: MLP "packed": the gate/up projection as one ungated launch with the norm prologue, down with the gated input
#: (``fused_linear.PACKED_GATE_UP_FUSED``, Qwen3-8B at one row); "fused": the gated gate/up launch, down plain
SHAPES = {"8B": (4096, 32, 8, 12288, 36, "packed"), "0.6B": (1024, 16, 8, 3072, 28, "fused")}
#: (from stamp, to stamp, what the span covers); stamps 8-12 are the program's last key block
#: the one-row GEMVs probed in each layer (``fused_linear_triton(probe=...)``), and probe rows for each
GEMVS = ("qkv", "o_proj", "gate_up", "down")
GEMV_PROBE_ROWS = 8192  # Qwen3-8B's packed gate/up: 6144 programs
PHASES = ((0, 1, "entry -> share, K/V prefetched"), (1, 2, "-> PDL wait returned"), (2, 3, "-> query rows ready"),
          (3, 4, "-> new K/V written"), (4, 5, "-> key loop done"), (5, 6, "-> partials stored"),
          (4, 8, "loop start -> last block start"), (8, 9, "  last block: page ids"), (9, 10, "  last block: K, V"),
          (10, 11, "  last block: scores, softmax"), (11, 12, "  last block: P V"))


def build(shape, ctx, max_ctx, page, gen):
    hidden, heads, kvh, inter, n_layers, mlp = SHAPES[shape]
    d = 128
    width = max_ctx // page

    def w(*s):
        return (torch.randn(*s, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)

    layers = []
    for _ in range(n_layers):
        kp = torch.randn((width + 1, page, kvh, d), device="cuda", generator=gen).to(torch.bfloat16)
        bt = torch.randperm(width, device="cuda", generator=gen).view(1, width).to(torch.int32)
        layers.append(dict(wqkv=w((heads + 2 * kvh) * d, hidden), ln1=(w(hidden) + 1), wo=w(hidden, heads * d),
                           ln2=(w(hidden) + 1), wgu=w(2 * inter, hidden), wdown=w(hidden, inter),
                           qn=(w(d) + 1), kn=(w(d) + 1), kp=kp, vp=torch.randn_like(kp), bt=bt,
                           fused_probe=torch.zeros(kvh * 64, 2 * launch.PROBE_STAMPS.value, dtype=torch.int64,
                                                   device="cuda"),
                           reduce_probe=torch.zeros(heads, 2 * launch.PROBE_STAMPS.value, dtype=torch.int64,
                                                    device="cuda"),
                           **{f"{name}_probe": torch.zeros(GEMV_PROBE_ROWS, 2 * launch.PROBE_STAMPS.value,
                                                           dtype=torch.int64, device="cuda") for name in GEMVS}))
    lens = torch.full((1,), ctx, device="cuda", dtype=torch.int64)
    pos = lens - 1
    slots = layers[0]["bt"][0, pos // page].long() * page + pos % page  # same page ids in every layer's table
    for layer in layers:
        layer["bt"].copy_(layers[0]["bt"])
    ang = pos[:, None, None].float() * (1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d)))
    emb = torch.cat((ang, ang), dim=-1)
    meta = dict(lens=lens, slots=slots, cos=emb.cos().to(torch.bfloat16), sin=emb.sin().to(torch.bfloat16),
                heads=heads, kvh=kvh, d=d, mlp=mlp, hidden=hidden,
                qkv=torch.randn(1, (heads + 2 * kvh) * d, device="cuda", generator=gen).to(torch.bfloat16))
    return layers, meta


def step(x, layers, meta, probe=True):
    heads, kvh, d = meta["heads"], meta["kvh"], meta["d"]
    qkv_early = os.environ.get("FLARE_PROBE_QKV_EARLY", "0") == "1"  # a variant of this graph only (read at capture)
    alone = attention_alone()
    for i, layer in enumerate(layers):
        gp = {name: dict(probe=layer[f"{name}_probe"] if probe else None) for name in GEMVS}
        # FLARE_PROBE_QKV_EARLY=1: the qkv projection of layers 1.. lets the attention launch before its own wait --
        # legal there (the attention reads the step's metadata before its wait, and the previous layer's attention
        # passed its wait, after everything before it completed); not in layer 0
        if alone:
            qkv = meta["qkv"]
        else:
            qkv = linear.fused_linear_triton(x, layer["wqkv"], norm_weight=layer["ln1"], eps=EPS,
                                             early=qkv_early and i > 0, **gp["qkv"])
        q, k, v = (t.view(1, 1, -1, d) for t in qkv.split([heads * d, kvh * d, kvh * d], dim=-1))
        attn = fused_decode.rope_decode_attention_triton(
            q, k, v, layer["qn"], layer["kn"], EPS, meta["cos"], meta["sin"], layer["kp"], layer["vp"], meta["slots"],
            layer["bt"], meta["lens"], d ** -0.5, overlap_bytes=layer["wqkv"].numel() * layer["wqkv"].element_size(),
            probe=(layer["fused_probe"], layer["reduce_probe"]) if probe else None,
            # the reduce's o_proj prefetch: FLARE_DECODE_REDUCE_PREFETCH_MB (0: none)
            prefetch=None if alone else (layer["wo"], decode_reduce_prefetch_bytes()))
        if alone:
            x = attn.view(1, -1)
            continue
        h = linear.fused_linear_triton(attn.view(1, -1), layer["wo"], residual=x, early=True, **gp["o_proj"])
        if meta["mlp"] == "packed":
            gu = linear.fused_linear_triton(h, layer["wgu"], norm_weight=layer["ln2"], eps=EPS, early=True,
                                            **gp["gate_up"])
            x = linear.fused_linear_triton(gu, layer["wdown"], residual=h, gated_input=True, early=True, **gp["down"])
        else:
            act = linear.fused_linear_triton(h, layer["wgu"], norm_weight=layer["ln2"], eps=EPS, gated=True, early=True,
                                             **gp["gate_up"])
            x = linear.fused_linear_triton(act, layer["wdown"], residual=h, early=True, **gp["down"])
    return x


def attention_alone() -> bool:
    """``FLARE_PROBE_ATTENTION_ALONE=1`` (a variant of this graph only, read at capture): each layer is its fused
    attention and reduce alone, on a fixed qkv output -- no projection streams weights beside them (the reduce
    prefetches nothing), so the K, V phase shows what the loads take without that traffic; its step time is not a
    layer's."""
    return os.environ.get("FLARE_PROBE_ATTENTION_ALONE", "0") == "1"


def sm_spread(sm_ids: torch.Tensor) -> tuple[int, int]:
    """``(SMs used, most programs on one SM)`` of the programs whose SM ids are ``sm_ids`` (``(0, 0)``: none)."""
    if sm_ids.numel() == 0:
        return 0, 0
    per_sm = torch.bincount(sm_ids)
    return int((per_sm > 0).sum().item()), int(per_sm.max().item())


def kv_neighbours(fused, gemv, ghz):
    """Each attention program's last key block ``K, V`` phase (stamps 9 -> 10 of the fused probe rows ``fused``)
    beside what shared its SM then: ``[(ns, attention programs on its SM, GEMV programs on its SM whose preload --
    entry to tiles arrived, stamps 0 -> 1 of ``gemv``'s rows -- overlapped that phase)]``, from the %clock64 stamps
    (one clock per SM: comparable between programs on one SM; ``ghz`` turns cycles into ns).  Programs without a key
    block stamp nothing there and are left out.  Whether the block's K and V wait behind the output projection's
    preloads on their SM shows as longer phases beside more of them."""
    n = launch.PROBE_STAMPS.value
    f = fused[fused[:, 0] != 0]
    g = gemv[gemv[:, 0] != 0]
    per_sm = torch.bincount(f[:, n - 1])
    out = []
    for row in f.tolist():
        a, z, sm = row[n + 9], row[n + 10], row[n - 1]
        if row[9] == 0 or row[10] == 0:
            continue
        here = g[g[:, n - 1] == sm]
        overlap = int(((here[:, n] < z) & (here[:, n + 1] > a)).sum().item())
        out.append(((z - a) / ghz, int(per_sm[sm].item()), overlap))
    return out


def neighbour_table(samples):
    """``{"by_attention_on_sm": {k: [programs, median ns]}, "by_gemv_preloads": {...}}`` from :func:`kv_neighbours`
    samples (pooled over layers): the ``K, V`` phase grouped by the attention programs on the SM, and by the
    overlapping GEMV preloads (3 and more together)."""
    table = {}
    for key, index, top in (("by_attention_on_sm", 1, 3), ("by_gemv_preloads", 2, 3)):
        groups = {}
        for sample in samples:
            groups.setdefault(min(sample[index], top), []).append(sample[0])
        table[key] = {(f"{k}+" if k == top else str(k)): [len(v), statistics.median(v)]
                      for k, v in sorted(groups.items())}
    return table


def gemv_stats(buf, weight, pred_end):
    """One probed GEMV launch against ``pred_end`` (globaltimer ns at which its predecessor's last program stored; None:
    unknown, its first wait release instead): how many programs were resident (entered) and had their preloaded tiles
    before it, on how many SMs, and how long after it the wait released and the last program stored."""
    n = launch.PROBE_STAMPS.value
    rows = int((buf[:, 0] != 0).sum().item())
    t = buf[:rows, :n].double()
    ref = t[:, 2].min().item() if pred_end is None else pred_end
    early = t[:, 0] < ref
    sms = buf[:rows, n - 1]
    sms_before, max_per_sm_before = sm_spread(sms[early])

    def med(mask, a, z):  # median span from stamp a to stamp z over the programs in mask (ns)
        return (t[mask, z] - t[mask, a]).median().item() if mask.any() else float("nan")

    phases = {f"{which}_{what}": med(mask, a, z) for which, mask in (("early", early), ("late", ~early))
              for what, a, z in (("preload", 0, 1), ("release_to_loop_end", 2, 3), ("loop_end_to_store", 3, 4))}
    return dict(**phases, programs=rows, weight_mib=weight.numel() * weight.element_size() / 2 ** 20,
                resident_before=int(early.sum().item()), preloaded_before=int((t[:, 1] < ref).sum().item()),
                sms_before=sms_before, max_per_sm_before=max_per_sm_before,
                sms_all=int(sms.unique().numel()),
                release_after_ns=t[:, 2].min().item() - ref, last_entry_after_ns=t[:, 0].max().item() - ref,
                end_after_ns=t[:, 4].max().item() - ref,
                early_end_after_ns=(t[early, 4].max().item() - ref) if early.any() else float("nan"),
                late_duration_ns=(t[~early, 4] - t[~early, 0]).median().item() if (~early).any() else float("nan"))


def analyse(layers, meta, splits):
    """Per-layer figures from the stamps of the last replay; medians over layers 1.. ."""
    n = launch.PROBE_STAMPS.value
    per_layer = []
    for prev, layer in zip(layers, layers[1:]):
        f = layer["fused_probe"][: meta["kvh"] * splits].cpu()
        r = layer["reduce_probe"][: meta["heads"]].cpu()
        probes = {name: layer[f"{name}_probe"].cpu() for name in GEMVS}
        down_before = prev["down_probe"].cpu()
        t, c = f[:, :n].double(), f[:, n:].double()
        ghz = statistics.median(((c[:, 6] - c[:, 0]) / (t[:, 6] - t[:, 0]).clamp(min=1)).tolist())
        phases = {}
        for a, z, what in PHASES:
            cyc = ((c[:, z] - c[:, a]) / ghz).tolist()  # ns from this SM's cycles
            phases[what] = (statistics.median(cyc), max(cyc))
        first_wait = t[:, 2].min().item()
        rt = r[:, :n].double()
        sms, most = sm_spread(f[:, n - 1])
        per_layer.append(dict(
            ghz=ghz, phases=phases,
            entry_spread_ns=(t[:, 0].max() - t[:, 0].min()).item(),
            late_programs=int((t[:, 0] > first_wait).sum().item()),
            wait_release_spread_ns=(t[:, 2].max() - first_wait).item(),
            attention_span_ns=(t[:, 6].max() - first_wait).item(),
            q_ready_after_release_ns=(t[:, 3].max() - first_wait).item(),
            keys_done_after_release_ns=(t[:, 5].max() - first_wait).item(),
            reduce_entry_before_attention_end_ns=(t[:, 6].max() - rt[:, 0].min()).item(),
            reduce_release_after_attention_end_ns=(rt[:, 2].min() - t[:, 6].max()).item(),
            reduce_span_ns=(rt[:, 6].max() - rt[:, 2].min()).item(),
            release_to_reduce_end_ns=(rt[:, 6].max() - first_wait).item(),
            attention_sms=sms, attention_max_per_sm=most,
            kv_neighbours=kv_neighbours(f, probes["o_proj"], ghz)))
        reduce_end = rt[:, 6].max().item()
        down_ran = down_before[:, 0] != 0  # none: the attention alone (no projection probed)
        ends = {"qkv": down_before[:, 4][down_ran].max().item() if down_ran.any() else None, "o_proj": reduce_end}
        weights = {"qkv": "wqkv", "o_proj": "wo", "gate_up": "wgu", "down": "wdown"}  # the launches' weights
        for name in GEMVS:
            if (probes[name][:, 0] != 0).any():
                pred = ends.get(name)
                if name == "down":
                    pred = probes["gate_up"][:, 4][probes["gate_up"][:, 0] != 0].max().item()
                per_layer[-1]["gemv"] = {**per_layer[-1].get("gemv", {}),
                                         name: gemv_stats(probes[name], layer[weights[name]], pred)}
    keys = [k for k in per_layer[0] if k not in ("phases", "gemv", "kv_neighbours")]
    summary = {k: statistics.median(p[k] for p in per_layer) for k in keys}
    summary["kv_neighbours"] = neighbour_table([x for p in per_layer for x in p.pop("kv_neighbours")])
    summary["gemv"] = {name: {k: statistics.median(p["gemv"][name][k] for p in per_layer)
                              for k in per_layer[0]["gemv"][name]} for name in per_layer[0].get("gemv", {})}
    summary["phases"] = {ph: (statistics.median(p["phases"][ph][0] for p in per_layer),
                              statistics.median(p["phases"][ph][1] for p in per_layer))
                         for ph in per_layer[0]["phases"]}
    return summary, per_layer


def parse_variant(spec):
    """``NAME=VALUE[,NAME=VALUE]`` -> the variant's environment (raises naming a malformed item).  The probe stamps the
    reduce kernel: a variant that does not name ``FLARE_DECODE_COMBINE_ROWS`` runs with it at 0 (whatever the
    default), one that names a combining value is refused."""
    items = [item for item in spec.split(",") if item]
    bad = [item for item in items if "=" not in item]
    if bad:
        raise SystemExit(f"--env {spec!r}: expected NAME=VALUE items, got {', '.join(bad)}")
    env = {"FLARE_DECODE_COMBINE_ROWS": "0", **dict(item.split("=", 1) for item in items)}
    with environment(env):
        if decode_plan.decode_combine_in_kernel(1):  # the probe stamps the reduce kernel, which would not launch
            raise SystemExit(f"--env {spec!r}: the probe times the reduce kernel; FLARE_DECODE_COMBINE_ROWS must be 0")
    return env


def launch_splits(meta, layer):
    """The fused decode launch's split count for ``layer``'s pools and block table (on their device): its own geometry
    -- whole pages, the wide launch's 32-key blocks, the one-row 64-key ones.  (From whole pages alone, the stamps of
    programs that never ran were read: run 123's Qwen3-0.6B spans.)"""
    q_like = torch.empty(1, 1, meta["heads"], meta["d"], device=layer["kp"].device, dtype=torch.bfloat16)
    geo = decode_plan._decode_geometry("probe", q_like, layer["kp"], layer["vp"], layer["bt"], None, fused=True)
    return geo["SPLITS"]


def run_shape(shape, specs, args, gen):
    """Each variant's stamps (its own probed graph), then every variant's plain graph timed side by side."""
    layers, meta = build(shape, args.context, args.max_context, args.page, gen)
    x = torch.randn(1, meta["hidden"], device="cuda", generator=gen).to(torch.bfloat16)
    cases, graphs = [], {}
    for spec in specs:
        with environment(parse_variant(spec)):
            splits = launch_splits(meta, layers[0])
            for layer in layers:
                for name in ("fused", "reduce", *GEMVS):
                    layer[f"{name}_probe"].zero_()
            probed = captured(lambda: step(x, layers, meta, True), warmup=2)
            for _ in range(5):
                probed.replay()
            torch.cuda.synchronize()
            summary, per_layer = analyse(layers, meta, splits)
            del probed
            graphs[spec or "default"] = captured(lambda: step(x, layers, meta, False), warmup=2)
        cases.append(dict(shape=shape, variant=spec or "default", splits=splits, summary=summary,
                          per_layer=per_layer))
    times = interleaved({name: g.replay for name, g in graphs.items()}, samples=args.replays, warmup=3)
    for case in cases:
        t = times[case["variant"]]
        case["graph"] = dict(median_s=statistics.median(t), min_s=min(t), max_s=max(t), samples_s=t)
    del graphs, layers
    torch.cuda.empty_cache()
    return cases


def show(case):
    s = case["summary"]
    g = case["graph"]
    print(f"{case['shape']} {case['variant']}: splits {case['splits']}, SM clock {s['ghz']:.2f} GHz; step (side by "
          f"side, unprobed) median {g['median_s'] * 1e3:.4f} ms (min {g['min_s'] * 1e3:.4f}, max "
          f"{g['max_s'] * 1e3:.4f})")
    for ph, (med, mx) in s["phases"].items():
        print(f"    {ph:34s} median {med:8.0f} ns   max over programs {mx:8.0f} ns")
    for k, v in s.items():
        if k not in ("phases", "ghz", "gemv", "kv_neighbours"):
            print(f"    {k:40s} {v:9.0f}")
    for key, groups in s["kv_neighbours"].items():
        print(f"    last block K, V {key.replace('_', ' ')}: " + ", ".join(
            f"{k}: {n} programs {ns:.0f} ns" for k, (n, ns) in groups.items()))
    for name, g in s["gemv"].items():
        ref = "its predecessor's last store"
        print(f"    {name} GEMV ({g['programs']:.0f} programs, {g['weight_mib']:.1f} MiB; times after {ref}):")
        print("      " + ", ".join(f"{k} {v:.0f}" for k, v in g.items() if k not in ("programs", "weight_mib")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="8B,0.6B")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--max-context", type=int, default=None,
                    help="the block table's keys per row (default: the context and one page more, as "
                         "qualify.gpu_replay's table at widths up to a page: Qwen3-8B's one-row launch then has 17 "
                         "splits of 64 keys at 1024)")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--replays", type=int, default=50, help="interleaved rounds of the side-by-side timing")
    ap.add_argument("--env", action="append", default=None,
                    help="a variant's environment, NAME=VALUE[,NAME=VALUE] ('' = the default); repeatable")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.max_context is None:
        args.max_context = args.context + args.page
    if not torch.cuda.is_available():
        print("probe_decode_attention: needs a CUDA device", file=sys.stderr)
        return 2
    specs = args.env or [""]
    for spec in specs:
        parse_variant(spec)
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = []
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            raise SystemExit(f"--shapes: unknown {shape!r} (known: {', '.join(SHAPES)})")
        shape_cases = run_shape(shape, specs, args, gen)
        base = shape_cases[0]["graph"]["median_s"]
        for case in shape_cases:
            show(case)
            note = " (the attention alone: not a layer's time)" if "FLARE_PROBE_ATTENTION_ALONE=1" in case["variant"] \
                else ""
            print(f"    step ratio to {shape_cases[0]['variant']}: {case['graph']['median_s'] / base:.4f}{note}")
        cases += shape_cases
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "device": torch.cuda.get_device_name(),
                                               "cases": cases}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
