"""Paired blocks: a side by side's candidate against a reference timed interleaved with it, block by block.

``qualify.gpu_replay --ab`` times A and B (and the null A2 with ``--ab-null``) interleaved in blocks (A B B A ...:
:func:`qualify.gpu_replay.interleaved`).  Within a block the two ran under the same machine state, so each block's
median ratio B / A pairs them; the count of blocks B won is judged by the exact two-sided sign test.  A small steady
difference then shows where the min-max ranges overlap -- the min-max rule (``qualify.report.verdict``) stays the
rule of record; this verdict is stated beside it.

CLI (archived ``--ab`` runs; the block count is the ``--ab-blocks`` each B's record states unless ``--blocks``):

    python -m qualify.paired_blocks RUN [RUN ...] [--blocks N]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from qualify.archive import read_samples

__all__ = ["block_sizes", "paired_blocks", "paired_verdict", "from_samples", "describe", "PAIRED_BLOCKS_ALPHA"]


def block_sizes(samples: int, blocks: int) -> list[int]:
    """The samples of each block of an interleaved side by side (``qualify.gpu_replay.interleaved``), in order."""
    blocks = max(1, min(blocks, samples))
    return [samples // blocks + (i < samples % blocks) for i in range(blocks)]


#: Two-sided sign-test level of the paired-blocks verdict (:func:`paired_blocks`).
PAIRED_BLOCKS_ALPHA = 0.05


def paired_blocks(ref: list[float], cand: list[float], blocks: int) -> dict:
    """The candidate against a reference timed interleaved with it (``qualify.gpu_replay.interleaved``'s blocks: the
    two ran side by side within each block): each block's median ratio cand / ref, the blocks where the candidate
    was faster, and the exact two-sided sign-test p of that count under "no difference".  Blocks pair the two under
    the same machine state, so a small steady difference shows where the min-max ranges overlap (run 113: the fused
    head 10 of 10 blocks faster at a 0.44% median difference, its min-max verdict "within noise").  A tied block
    (ratio exactly 1: the event clock's resolution makes ties possible) says nothing either way and is left out of
    the test, as the sign test does (``tied_blocks``); none untied: p 1.  Below 6 untied blocks no count reaches
    p < 0.05 (6 of 6: 0.031)."""
    sizes = block_sizes(min(len(ref), len(cand)), blocks)
    ratios, i = [], 0
    for n in sizes:
        ratios.append(statistics.median(cand[i:i + n]) / statistics.median(ref[i:i + n]))
        i += n
    k, slower = sum(r < 1.0 for r in ratios), sum(r > 1.0 for r in ratios)
    m = k + slower  # the untied blocks
    tail = sum(math.comb(m, j) for j in range(min(k, slower) + 1)) / 2 ** m
    return {"ratios": ratios, "median_ratio": statistics.median(ratios), "faster_blocks": k, "slower_blocks": slower,
            "tied_blocks": len(ratios) - m, "blocks": len(ratios), "p": min(1.0, 2 * tail)}


def paired_verdict(pairs: list[dict], alpha: float = PAIRED_BLOCKS_ALPHA) -> str:
    """``B faster`` / ``B slower`` when, against every reference (A, and A2 with ``--ab-null``: the build order's own
    bias), the paired blocks say so at sign-test level ``alpha``; else ``within noise``.  With A alone the verdict
    says ``(no null)``: the bench built second runs up to ~0.6% slower with the same kernels (run 28), and the blocks
    see that bias as readily as a real difference (run 113: 0.15-0.17% "slower" at batch 4, which no variant there
    changed)."""
    seen = {("faster" if d["faster_blocks"] > d["slower_blocks"] else "slower") if d["p"] < alpha
            else "within noise" for d in pairs}
    if len(seen) != 1 or "within noise" in seen:
        return "within noise"
    return f"B {seen.pop()}" + (" (no null)" if len(pairs) < 2 else "")


def from_samples(samples: list[dict], blocks: int | None = None) -> list[dict]:
    """Per decode case of an archived ``--ab`` run (``samples.jsonl`` records) and per B (several with ``--ab``
    repeated): that B against A (and A2), the paired blocks and their verdict -- ``[{"case", "seed", "ab", "vs":
    {ref: paired_blocks}, "verdict"}]``, ``ab`` the B's label.  ``blocks``: the block count; None: the one each B's
    record archived (its ``--ab-blocks``), 10 for records from before it was archived."""
    by: dict = {}
    archived: dict = {}  # (case key, B label) -> the block count its record states
    for rec in samples:
        case = rec.get("case", {})
        if case.get("tool") == "gpu_replay" and "ab" in case and "replay_s" in rec:
            key = (case["capacity"], case["variant"], rec["seed"])
            label = case["ab"] if case["ab"].startswith("B") else case["ab"][:2]
            by.setdefault(key, {})[label] = rec["replay_s"]
            stated = {d.get("blocks") for d in (rec.get("paired_blocks") or {}).values()} - {None}
            if len(stated) == 1:
                archived[key, label] = stated.pop()
    out = []
    for (cap, variant, seed), sides in sorted(by.items()):
        if "A" not in sides:
            continue
        for label in (x for x in sides if x.startswith("B")):
            n = blocks if blocks is not None else archived.get(((cap, variant, seed), label), 10)
            vs = {ref: paired_blocks(sides[ref], sides[label], n) for ref in ("A", "A2") if ref in sides}
            out.append({"case": {"capacity": cap, "variant": variant}, "seed": seed, "ab": label, "vs": vs,
                        "verdict": paired_verdict(list(vs.values()))})
    return out


def describe(vs: dict[str, dict]) -> str:
    """``{reference: paired_blocks(...)}`` as printed (``gpu_replay --ab``'s table and this CLI)."""
    return ", ".join(f"{d['faster_blocks']}/{d['blocks']} faster vs {r}"
                     + (f" ({d['tied_blocks']} tied)" if d.get("tied_blocks") else "")
                     + f" (p {d['p']:.3g}, median ratio {d['median_ratio']:.4f})" for r, d in vs.items())


def line(entry: dict) -> str:
    """One printed line of :func:`from_samples`' entry."""
    c = entry["case"]
    return (f"B={c['capacity']} {c['variant']} seed {entry['seed']} ({entry['ab']}): {entry['verdict']} by paired "
            f"blocks -- {describe(entry['vs'])}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qualify.paired_blocks", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="archived gpu_replay --ab runs (folders with samples.jsonl)")
    ap.add_argument("--blocks", type=int, default=None,
                    help="the block count (default: the --ab-blocks each B's record archived; 10 without one)")
    args = ap.parse_args(argv)
    if args.blocks is not None and args.blocks < 1:
        ap.error("--blocks must be >= 1")
    for run in args.runs:
        path = run / "samples.jsonl"
        try:
            samples = read_samples(run)
        except (OSError, ValueError) as exc:
            print(f"paired_blocks: cannot read {path}: {exc}", file=sys.stderr)
            return 2
        entries = from_samples(samples, args.blocks)
        if not entries:
            print(f"paired_blocks: {path} holds no --ab side by side", file=sys.stderr)
            return 2
        print(f"{run}:")
        for e in entries:
            print("  " + line(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
