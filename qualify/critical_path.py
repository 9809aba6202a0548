"""What each kernel of a replayed decode graph adds to the step: critical-path increments, per region and per layer
position, from the two traces ``gpu_replay --timeline`` archives (``replay-<tag>.trace.json[.gz]``,
``attributed-<tag>.trace.json[.gz]``; ``qualify/timeline.py``).

In a captured graph with programmatic dependent launch, kernels overlap: a kernel launches early and waits, so its
own duration says little about what it costs the step.  Its **increment** does: its end minus the end of the kernel
before it (one stream: kernels end in launch order).  The increments of one replay add up to the replay's span, first
kernel start to last kernel end.

Each kernel of a replay takes the region of the same kernel in the attributed run (``layer.<i>``, ``head``,
``sampler``, ``metadata``, the eager glue; :func:`qualify.timeline.kernel_ranges`): the two runs launch the same
kernels in the same order, names are matched in order, and a graph node the attributed run does not show (a memset or
memcpy node) is counted with the kernel before it.  Reported: per region the median over replays of the summed
increments, and per layer position (the k-th kernel of every ``layer.<i>``) the median, min and max over layers and
replays -- "qkv 16.3 us, attention 10.4 us, ..." -- and, for every other region, its k-th kernel the same way
(the sampler's sort passes, the head's projection).  With each, its **launch lead**: how long before the end of the
kernel before it the kernel started (median) -- what programmatic dependent launch bought it (a weight prefetch, a
K/V prefetch before its wait); 0 or less: it started only after (a kernel after cuBLAS, which never lets a dependent
launch early, or a kernel launched without PDL).  ``compare`` sets two such results side by side
(``python -m qualify.report`` appends it to a report when both runs archived their traces).

``gap_to_floor`` sets each region against its share of the floor (its bytes over the measured bandwidth,
``qualify.replay_floor.region_bytes``): where the step's time above the floor goes -- per region, and per layer.
``position_gaps`` does it per layer position: the layer's projection kernels (by name: GEMV / GEMM / cuBLAS kernels,
:data:`PROJECTION_KERNEL`) take the layer's projection bytes in order (``replay_floor``'s
``layer_projection_bytes``), its attention kernel the layer's KV cache, every other kernel (norms, the attention's
reduce, an activation) nothing -- so each kernel's time above its own floor, and the bandwidth it reached.

CLI (an archived run, re-read): ``python -m qualify.critical_path RUN_DIR [--config CONFIG_JSON]`` prints, per decode
timeline the run archived, the critical path, the time above the floor per region and per layer position; the
projection bytes come from the run's samples, or for runs archived before they carried them from ``--config`` (a
Hugging Face ``config.json``: ``replay_floor``'s geometry estimate).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from qualify.timeline import LAYERS, REPLAYS, _kernels, _trace, kernel_ranges

__all__ = ["increments", "from_run", "compare", "format_table", "gap_to_floor", "gap_from_samples", "gap_lines",
           "position_gaps", "position_gaps_from_samples", "position_gap_lines", "read_config", "main", "TIMELINE_TAGS"]

#: The decode timelines ``gpu_replay --timeline`` archives (``b<rows>``) that reports and the CLI read.
TIMELINE_TAGS = ("b1", "b4")

#: Kernels that stream a projection's weight: Triton GEMV / GEMM kernels, cuBLAS (``nvjet``, ``xmma``, ``gemv``,
#: ``gemm``), CUTLASS, Inductor's matmul templates.
PROJECTION_KERNEL = re.compile(r"gemv|gemm|nvjet|xmma|cutlass|cublas|matmul|triton_tem_", re.IGNORECASE)
#: The attention kernel of a layer (not its reduce/combine pass): it takes the layer's KV-cache bytes.
ATTENTION_KERNEL = re.compile(r"^(?!.*(reduce|combine)).*(attention|attn|flash|decode)", re.IGNORECASE)


def _replays(kernels: list[dict], replays: int) -> list[list[dict]]:
    n, rem = divmod(len(kernels), replays)
    if not kernels or rem:
        raise ValueError(f"critical path: {len(kernels)} replayed kernels do not split into {replays} replays")
    ks = sorted(kernels, key=lambda e: e["ts"])
    return [ks[i * n:(i + 1) * n] for i in range(replays)]


#: The kernels a captured graph runs that its uncaptured (attributed) run does not: the graph's memcpy and memset
#: nodes (``memcpy32_post``, ``memset32`` in every archived H200 run).
GRAPH_COPY_NODE = re.compile(r"^(memcpy|memset)", re.IGNORECASE)


def _attributed_increments(step: list[dict],
                           attributed: list[tuple[dict, str]]) -> list[tuple[str, str, float, float]]:
    """``(kernel name, region, increment, launch lead)`` of one replay's kernels, matched by name in order with the
    attributed run; a graph memcpy or memset node (:data:`GRAPH_COPY_NODE`), which the attributed run does not show,
    adds its increment to the kernel before it (whose lead stays its own).  Any other kernel the attributed run does
    not show raises, naming it: it would be counted in another operator's time.  Lead: the end of the kernels before
    it minus its start."""
    out: list[list] = []
    j, prev_end = 0, step[0]["ts"]
    for k in step:
        end = k["ts"] + k.get("dur", 0.0)
        inc, lead = max(end - prev_end, 0.0), prev_end - k["ts"]
        prev_end = max(prev_end, end)
        if j < len(attributed) and k["name"] == attributed[j][0]["name"]:
            out.append([k["name"], attributed[j][1], inc, lead])
            j += 1
        elif not GRAPH_COPY_NODE.match(k["name"]):
            raise ValueError(f"critical path: the replay's kernel {k['name'][:80]!r} is not in the attributed run "
                             f"(after {j} of its {len(attributed)} kernels; different graphs?)")
        elif out:
            out[-1][2] += inc
        else:
            out.append([k["name"], attributed[0][1] if attributed else "?", inc, lead])
    if j < len(attributed):
        raise ValueError(f"critical path: only {j} of the attributed run's {len(attributed)} kernels found in order "
                         "in a replay (different graphs?)")
    return [tuple(x) for x in out]


def increments(replay_events: list[dict], attributed_events: list[dict], replays: int = REPLAYS) -> dict:
    """``{"span_us", "per_region": {region: us}, "layers", "per_layer_us", "positions": [...],
    "region_kernels": {region: [...]}}`` (module doc); each position ``{position, name, median_us, min_us, max_us,
    lead_us}``; ``region_kernels``: the k-th kernel of each region outside the layers (head, sampler, glue...), as
    ``positions`` are for the layers."""
    attributed = kernel_ranges(attributed_events)
    spans, per_region, per_pos, per_layer = [], defaultdict(list), defaultdict(list), []
    per_other: dict[tuple[str, int], list[float]] = defaultdict(list)
    leads: dict = defaultdict(list)
    layers = 0
    names: dict = {}
    for step in _replays(_kernels(replay_events), replays):
        inc_region, inc_layer, inc_other = defaultdict(float), defaultdict(list), defaultdict(int)
        for name, region, inc, lead in _attributed_increments(step, attributed):
            inc_region[region] += inc
            if region.startswith("layer."):
                key = len(inc_layer[region])
                inc_layer[region].append(inc)
                per_pos[key].append(inc)
            else:
                key = (region, inc_other[region])
                inc_other[region] += 1
                per_other[key].append(inc)
            names.setdefault(key, name)
            leads[key].append(lead)
        spans.append(max(k["ts"] + k.get("dur", 0.0) for k in step) - step[0]["ts"])
        for region, us in inc_region.items():
            per_region[region].append(us)
        per_layer += [sum(v) for v in inc_layer.values()]
        layers = len(inc_layer)
    def stats(key, j, v):
        return {"position": j, "name": names[key], "median_us": statistics.median(v), "min_us": min(v),
                "max_us": max(v), "lead_us": statistics.median(leads[key])}

    positions = [stats(j, j, v) for j, v in sorted(per_pos.items())]
    region_kernels: dict[str, list[dict]] = defaultdict(list)
    for (region, k), v in sorted(per_other.items()):
        region_kernels[region].append(stats((region, k), k, v))
    merged = defaultdict(list)  # the layers as one region, the rest as they are
    for region, v in per_region.items():
        merged[LAYERS if region.startswith("layer.") else region].append(v)
    return {"span_us": statistics.median(spans), "replays": replays, "layers": layers,
            "per_layer_us": statistics.median(per_layer) if per_layer else 0.0, "positions": positions,
            "region_kernels": dict(region_kernels),
            "per_region": {r: statistics.median([sum(x) for x in zip(*vs)]) for r, vs in merged.items()}}


def _find(run_dir: Path, name: str) -> Path | None:
    for suffix in (".json.gz", ".json"):
        p = run_dir / (name + suffix)
        if p.is_file():
            return p
    return None


def from_run(run_dir: str | Path, tag: str) -> dict | None:
    """:func:`increments` of a run folder's ``replay-<tag>`` / ``attributed-<tag>`` traces (``tag``: ``b1``,
    ``b4``, ``b1-w1`` ...); None when the run has not both."""
    run_dir = Path(run_dir)
    replay, attributed = _find(run_dir, f"replay-{tag}.trace"), _find(run_dir, f"attributed-{tag}.trace")
    if replay is None or attributed is None:
        return None
    return increments(_trace(replay), _trace(attributed))


def format_table(r: dict, label: str = "") -> str:
    lines = [f"critical path {label}: span {r['span_us']:.1f} us (median of {r['replays']} replays); "
             f"per layer {r['per_layer_us']:.1f} us ({r['layers']} layers)"]
    lines += [f"  {name[:50]:<50} {us:9.1f} us" for name, us in sorted(r["per_region"].items(), key=lambda x: -x[1])]
    lines.append("  per layer position (median over layers and replays; min-max; lead: how long before the kernel "
                 "before it ended it started):")
    lines += [f"    {p['position']:>2} {p['name'][:48]:<48} {p['median_us']:7.2f} us ({p['min_us']:.2f}-"
              f"{p['max_us']:.2f})  lead {p['lead_us']:6.2f} us" for p in r["positions"]]
    return "\n".join(lines)


def compare(base: dict, cand: dict) -> list[str]:
    """Markdown lines: per region and per layer position, baseline against candidate (medians, difference).  Layer
    positions are paired by their kernels' names (:func:`aligned_positions`: a launch one side does not run pairs with
    "-"); where a pair holds other kernels, the names of both are shown."""
    lines = ["| region | baseline us | candidate us | difference |", "|---|---|---|---|"]
    lines.append(f"| step span | {base['span_us']:.1f} | {cand['span_us']:.1f} | "
                 f"{cand['span_us'] - base['span_us']:+.1f} |")
    for r in sorted(set(base["per_region"]) | set(cand["per_region"])):
        b, c = base["per_region"].get(r), cand["per_region"].get(r)
        lines.append(f"| {r} | {'-' if b is None else f'{b:.1f}'} | {'-' if c is None else f'{c:.1f}'} | "
                     f"{'-' if b is None or c is None else f'{c - b:+.1f}'} |")
    lines += ["", f"Per layer ({base['layers']} / {cand['layers']} layers): {base['per_layer_us']:.2f} -> "
                  f"{cand['per_layer_us']:.2f} us.", "",
              "| position | kernel | baseline us (min-max) | candidate us (min-max) | difference | launch lead us "
              "(baseline / candidate) |", "|---|---|---|---|---|---|"]
    lines += _position_rows(base["positions"], cand["positions"])
    regions = sorted(set(base.get("region_kernels", {})) | set(cand.get("region_kernels", {})))
    if regions:
        lines += ["", "Outside the layers, per kernel (the k-th kernel of each region):", "",
                  "| region | k | kernel | baseline us (min-max) | candidate us (min-max) | difference | launch lead "
                  "us (baseline / candidate) |", "|---|---|---|---|---|---|---|"]
        for r in regions:
            lines += [f"| {r} |{row[1:]}" for row in _position_rows(base.get("region_kernels", {}).get(r, []),
                                                                   cand.get("region_kernels", {}).get(r, []))]
    return lines


def short_name(kernel: str) -> str:
    """A kernel's function name without return type, namespaces and template or call arguments
    (``void at_cuda_detail::cub::...::DeviceRadixSortOnesweepKernel<...>(...)`` -> ``DeviceRadixSortOnesweepKernel``);
    Triton and cuBLAS names are already that."""
    base = kernel.replace("(anonymous namespace)::", "").split("(")[0].split("<")[0]
    return base.split("::")[-1].split(" ")[-1] or kernel


def aligned_positions(bpos: list[dict], cpos: list[dict]) -> list[tuple[dict | None, dict | None]]:
    """Two position lists paired by their kernels' names, in order (``difflib``'s longest matching runs): a kernel one
    layer runs and the other does not (a launch a switch removes or adds) pairs with None, so the kernels after it
    still meet their own; where both hold other kernels at the same place they pair by index."""
    import difflib

    pairs: list[tuple[dict | None, dict | None]] = []
    names = [[short_name(p["name"]) for p in pos] for pos in (bpos, cpos)]
    for op, b0, b1, c0, c1 in difflib.SequenceMatcher(a=names[0], b=names[1], autojunk=False).get_opcodes():
        n = max(b1 - b0, c1 - c0)
        if op == "replace" and b1 - b0 == c1 - c0 or op == "equal":
            pairs += list(zip(bpos[b0:b1], cpos[c0:c1]))
        else:
            pairs += [(bpos[b0 + i] if b0 + i < b1 else None, cpos[c0 + i] if c0 + i < c1 else None)
                      for i in range(n)]
    return pairs


def _position_rows(bpos: list[dict], cpos: list[dict]) -> list[str]:
    """Table rows ``| k | kernel | baseline | candidate | difference | lead (baseline / candidate) |`` of two position
    lists paired by :func:`aligned_positions` (``k``: the baseline's position, or the candidate's as ``-/k`` for a
    kernel only it runs); where a pair holds other kernels, the names of both are shown."""
    rows = []
    for b, c in aligned_positions(bpos, cpos):
        bn, cn = (short_name(p["name"]) if p else None for p in (b, c))
        name = bn or cn if not (b and c) or bn == cn else f"{bn} / {cn}"
        cell = lambda p: "-" if p is None else f"{p['median_us']:.2f} ({p['min_us']:.2f}-{p['max_us']:.2f})"  # noqa
        diff = "-" if b is None or c is None else f"{c['median_us'] - b['median_us']:+.2f}"
        lead = " / ".join("-" if p is None else f"{p['lead_us']:.2f}" for p in (b, c))
        k = b["position"] if b is not None else f"-/{c['position']}"
        rows.append(f"| {k} | `{name[:60]}` | {cell(b)} | {cell(c)} | {diff} | {lead} |")
    return rows


def gap_to_floor(r: dict, region_bytes: dict[str, int], bandwidth: float) -> dict:
    """Each region of :func:`increments`' result ``r`` against its floor (``region_bytes[region] / bandwidth``; 0 for a
    region that reads nothing the floor counts): ``{"regions": [{region, us, floor_us, over_us}], "span_us",
    "floor_us", "over_us", "per_layer_us", "per_layer_floor_us"}``, regions by time above the floor.  Raises when a
    region with bytes is missing from the timeline (another step?) or the bandwidth is not positive."""
    if not bandwidth or bandwidth <= 0:
        raise ValueError(f"gap to the floor: bandwidth must be positive bytes/s, got {bandwidth!r}")
    missing = [k for k, v in region_bytes.items() if v and k not in r["per_region"]]
    if missing:
        raise ValueError(f"gap to the floor: the timeline has no region {missing}")
    floor = {k: v / bandwidth * 1e6 for k, v in region_bytes.items()}
    regions = [{"region": k, "us": us, "floor_us": floor.get(k, 0.0), "over_us": us - floor.get(k, 0.0)}
               for k, us in r["per_region"].items()]
    total_floor = sum(floor.values())
    layer_floor = floor.get(LAYERS, 0.0) / r["layers"] if r["layers"] else 0.0
    return {"regions": sorted(regions, key=lambda x: -x["over_us"]), "span_us": r["span_us"],
            "floor_us": total_floor, "over_us": r["span_us"] - total_floor, "per_layer_us": r["per_layer_us"],
            "per_layer_floor_us": layer_floor, "layers": r["layers"]}


def gap_from_samples(r: dict, samples: list[dict], rows: int) -> dict | None:
    """:func:`gap_to_floor` of the decode timeline ``r`` of ``rows`` rows from a ``gpu_replay`` run's samples (or its
    printed cases): the first ``decode`` case of that many rows (the A side of a side by side) that carries the
    archived weight traffic (``gpu_replay`` since run 32) and the floor's measured bandwidth; None when none does."""
    from qualify.replay_floor import region_bytes

    s = next(_decode_samples(samples, rows), None)
    return None if s is None else gap_to_floor(r, region_bytes(s["traffic"]), s["floor_bandwidth_bytes_per_s"])


def _decode_samples(samples: list[dict], rows: int):
    """The samples of a run's own ``decode`` case of ``rows`` rows (the A side of a side by side) that carry the
    archived weight traffic and the floor's measured bandwidth, in order."""
    for s in samples:
        case = s.get("case") or {}
        if (isinstance(case, dict) and case.get("capacity") == rows and case.get("variant") == "decode"
                and case.get("ab") in (None, "A") and s.get("traffic") and s.get("floor_bandwidth_bytes_per_s")):
            yield s


def gap_lines(gaps: dict[str, dict]) -> list[str]:
    """Markdown lines of :func:`gap_to_floor` results by label (e.g. ``{"baseline": ..., "candidate": ...}``; a None
    result is left out): per region the floor, then each run's time and its time above the floor."""
    labels = [k for k, v in gaps.items() if v]
    if not labels:
        return []
    first = gaps[labels[-1]]
    head = "| region | floor us | " + " | ".join(f"{k} us | {k} above floor" for k in labels) + " |"
    lines = [head, "|---|---|" + "---|---|" * len(labels)]
    order = [x["region"] for x in first["regions"]]
    order += [x["region"] for k in labels for x in gaps[k]["regions"] if x["region"] not in order]
    for region in order:
        cells, floor = [], None
        for k in labels:
            x = next((y for y in gaps[k]["regions"] if y["region"] == region), None)
            floor = floor if x is None else x["floor_us"]
            cells.append("- | -" if x is None else f"{x['us']:.1f} | {x['over_us']:+.1f}")
        lines.append(f"| {region} | {floor:.1f} | " + " | ".join(cells) + " |")
    lines.append("| **step span** | " + f"{first['floor_us']:.1f} | " + " | ".join(
        f"{gaps[k]['span_us']:.1f} | {gaps[k]['over_us']:+.1f}" for k in labels) + " |")
    lines += ["", "Per layer: " + "; ".join(
        f"{k} {gaps[k]['per_layer_us']:.2f} us against a floor of {gaps[k]['per_layer_floor_us']:.2f} "
        f"({gaps[k]['per_layer_us'] - gaps[k]['per_layer_floor_us']:+.2f} us, "
        f"{gaps[k]['layers'] * (gaps[k]['per_layer_us'] - gaps[k]['per_layer_floor_us']):.0f} us over "
        f"{gaps[k]['layers']} layers)" for k in labels) + "."]
    return lines


def position_gaps(r: dict, projection_bytes: list[int], kv_bytes_per_layer: int, bandwidth: float,
                  projection_names: list[str] | None = None) -> dict:
    """Each layer position of :func:`increments`' result ``r`` against its own floor (module doc): ``{"rows":
    [{position, name, operator, us, bytes, floor_us, over_us, tb_per_s}], "per_layer_us", "per_layer_floor_us"}``
    -- ``operator``: the projection module a projection kernel runs (``projection_names``, in order; else
    ``projection <k>``), ``attention`` for the attention kernel, ``-`` for the rest --, or
    ``{"error": reason}`` when the layer's projection kernels are not one per projection (another layer structure:
    then no kernel can be given its bytes) or no single attention kernel holds the KV cache."""
    if not bandwidth or bandwidth <= 0:
        raise ValueError(f"position gaps: bandwidth must be positive bytes/s, got {bandwidth!r}")
    names = [p["name"] for p in r["positions"]]
    proj = [j for j, n in enumerate(names) if PROJECTION_KERNEL.search(n)]
    attn = [j for j, n in enumerate(names) if j not in proj and ATTENTION_KERNEL.search(n)]
    if len(proj) != len(projection_bytes):
        return {"error": f"{len(proj)} projection kernels in a layer ({', '.join(short_name(names[j]) for j in proj)})"
                         f" for {len(projection_bytes)} projections"}
    if kv_bytes_per_layer and len(attn) != 1:
        return {"error": f"{len(attn)} attention kernels in a layer for its KV cache"}
    if projection_names is not None and len(projection_names) != len(projection_bytes):
        raise ValueError(f"position gaps: {len(projection_names)} projection names for {len(projection_bytes)} "
                         "projections")
    nbytes, operators = [0] * len(names), ["-"] * len(names)
    for k, (j, n) in enumerate(zip(proj, projection_bytes)):
        nbytes[j] = int(n)
        operators[j] = projection_names[k] if projection_names else f"projection {k}"
    if attn:
        nbytes[attn[0]] += int(kv_bytes_per_layer)
        operators[attn[0]] = "attention"
    rows = []
    for p, n, op in zip(r["positions"], nbytes, operators):
        floor = n / bandwidth * 1e6
        rows.append({"position": p["position"], "name": p["name"], "operator": op, "us": p["median_us"], "bytes": n,
                     "floor_us": floor, "over_us": p["median_us"] - floor,
                     "tb_per_s": n / (p["median_us"] * 1e-6) / 1e12 if n and p["median_us"] > 0 else None})
    return {"rows": rows, "per_layer_us": sum(x["us"] for x in rows),
            "per_layer_floor_us": sum(x["floor_us"] for x in rows), "bandwidth_tb_per_s": bandwidth / 1e12}


def position_gaps_from_samples(r: dict, samples: list[dict], rows: int, config: dict | None = None) -> dict | None:
    """:func:`position_gaps` of the decode timeline ``r`` of ``rows`` rows from the first ``decode`` case of that many
    rows (the A side) with the floor's bandwidth: its archived ``layer_projection_bytes``, or for a run archived
    before them, those of ``config`` (a model config / geometry dict: ``replay_floor``'s geometry estimate); None
    when neither is there."""
    from qualify.replay_floor import weight_traffic

    for s in _decode_samples(samples, rows):
        t = s["traffic"]
        proj, names = t.get("layer_projection_bytes"), t.get("layer_projection_names")
        if not proj and config is not None:
            estimate = weight_traffic(config, rows, int(s["case"].get("context", 0)))
            proj, names = estimate["layer_projection_bytes"], estimate["layer_projection_names"]
        if proj and t.get("num_layers"):
            return position_gaps(r, proj, t["kv_bytes"] // t["num_layers"], s["floor_bandwidth_bytes_per_s"], names)
    return None


def position_gap_lines(gaps: dict[str, dict]) -> list[str]:
    """Markdown lines of :func:`position_gaps` results by label: per layer position, each run's time, its floor (its
    bytes over that run's measured bandwidth), the time above it and the bandwidth the kernel reached."""
    labels = [k for k, v in gaps.items() if v]
    if not labels:
        return []
    lines = []
    for k in labels:
        g = gaps[k]
        if "error" in g:
            lines += [f"{k}: no per-kernel floor -- {g['error']}.", ""]
            continue
        lines += [f"{k} (floor bandwidth {g['bandwidth_tb_per_s']:.2f} TB/s):", "",
                  "| position | kernel | operator | critical path us | MB read | floor us | above floor us | "
                  "TB/s reached |", "|---|---|---|---|---|---|---|---|"]
        for x in g["rows"]:
            tb = "-" if x["tb_per_s"] is None else f"{x['tb_per_s']:.2f}"
            lines.append(f"| {x['position']} | `{short_name(x['name'])[:48]}` | {x.get('operator', '-')} | "
                         f"{x['us']:.2f} | {x['bytes'] / 1e6:.1f} | {x['floor_us']:.2f} | {x['over_us']:+.2f} | "
                         f"{tb} |")
        lines += [f"| | **layer** | | {g['per_layer_us']:.2f} | | {g['per_layer_floor_us']:.2f} | "
                  f"{g['per_layer_us'] - g['per_layer_floor_us']:+.2f} | |", ""]
    return lines


def read_config(path: str | Path | None) -> dict | None:
    """The model's ``config.json`` that ``--config`` names (this CLI's and ``qualify.report``'s), None without one;
    ``ValueError`` naming the file when it cannot be read as JSON."""
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--config {path}: {exc}") from exc


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m qualify.critical_path", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="an archived gpu_replay run folder (traces and samples.jsonl)")
    ap.add_argument("--config", type=Path, help="config.json of the model, for runs archived without "
                                                "layer_projection_bytes")
    args = ap.parse_args(argv)
    from qualify.archive import read_samples

    try:
        samples, config = read_samples(args.run), read_config(args.config)
    except (OSError, ValueError) as exc:  # a missing or unreadable samples.jsonl / --config, named
        print(f"critical_path: {exc}", file=sys.stderr)
        return 2
    found, failed = False, []
    for tag in TIMELINE_TAGS:
        try:
            r = from_run(args.run, tag)
        except ValueError as exc:
            print(f"critical_path: timeline {tag}: {exc}", file=sys.stderr)
            found = True
            failed.append(tag)
            continue
        if r is None:
            continue
        found, rows = True, int(tag[1:])
        print(format_table(r, f"B={rows}"))
        gap = gap_from_samples(r, samples, rows)
        if gap is not None:
            print("\n".join(["time above the floor per region:"] + gap_lines({"this run": gap})))
        pos = position_gaps_from_samples(r, samples, rows, config)
        if pos is not None:
            print("\n".join(["per layer position against its own floor:"] + position_gap_lines({"this run": pos})))
        else:
            print("per layer position: no projection bytes in the samples (pass --config)")
    if not found:
        print(f"critical_path: {args.run} holds no replay-b1/b4 and attributed-b1/b4 traces", file=sys.stderr)
        return 2
    return 1 if failed else 0  # a timeline that could not be read is a failure, not a quiet gap in the output


if __name__ == "__main__":
    sys.exit(main())
