"""Compile time of the graph catalog: whole-step vs regional ``torch.compile``, side by side.

``python -m qualify.compile_time --layers 28 [--decode 1,4] [--prefill 16] [--scopes regional,whole]
[--vocab 4096] [--timeout 1800] [--device cuda|cpu] [--json OUT] [--out RESULTS | --no-archive]`` builds a tiny-width Qwen3 checkpoint of the given depth
(hidden 64, 4 heads, 2 KV heads, head_dim 16, intermediate 128), prepares the catalog shapes (in-graph
sampling on, as ``ignition export``), and compiles it once per scope.  Each scope runs in its own child
process with its own empty Inductor cache directory (a cold compile: no FX-graph or kernel cache shared
with the other scope or an earlier run) and reports: the ``compile()`` seconds (each shape's share),
Dynamo's counters (unique graphs, frames), the compiled cache entries per region code object,
Dynamo's per-region compile records (``get_compilation_metrics``), and whether the compiled step
equals the eager one bytewise (logits and tokens of every prepared step: each prefill chunk, each decode capacity
over its full batch).  Prints one JSON object: ``{"config": ..., "scopes": {scope: report},
"regional_speedup_over_whole": x, "failures": [...]}``; exits 1 when a scope failed, timed out or differs from eager.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GEOMETRY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128)


def _drive(graphs, decodes: int = 2) -> list:
    """Every prepared step run on inputs made the same way (outputs cloned, in order): each prefill chunk on row 0 from
    position 0, then rows 0 .. R-1 prefilled with the smallest chunk (R: the largest decode capacity) and ``decodes``
    decodes of every decode capacity over its full batch, each row's tokens fed back."""
    import torch

    from ignition.components.attention import slot_mapping_for

    device = graphs.model.device
    chunks = sorted(s.shape.tokens for s in graphs.steps if s.shape.kind == "prefill")
    caps = sorted(s.shape.rows for s in graphs.steps if s.shape.kind == "decode")
    width, page = graphs.steps[0].max_pages, graphs.model.kv_cache.page_size  # row r owns pages r*width ..
    vocab = graphs.model.vocab_size
    out = []

    def inputs(rows, toks, starts):
        bt = torch.stack([torch.arange(r * width, (r + 1) * width, dtype=torch.int32) for r in rows])
        pos = torch.tensor(starts)[:, None] + torch.arange(len(toks[0]))[None]
        return {k: v.to(device) for k, v in {
            "input_ids": torch.tensor(toks), "positions": pos,
            "slot_mapping": slot_mapping_for(bt, pos, torch.ones_like(pos, dtype=torch.bool), page),
            "block_tables": bt, "seq_lens": pos[:, -1] + 1, "active_rows": torch.ones(len(rows), dtype=torch.bool)}.items()}

    def run(step, feed):
        logits, tok = step.run(**feed)
        out.append((step.shape.name, logits.cpu().clone(), tok.cpu().clone()))
        return tok.cpu()

    for t in chunks:
        run(graphs.step("prefill", 1, t), inputs([0], [[(i * 37 + 11) % vocab for i in range(t)]], [0]))
    prompt = chunks[0]
    last = [int(run(graphs.step("prefill", 1, prompt),
                    inputs([r], [[(i * 37 + 11 * r) % vocab for i in range(prompt)]], [0]))[0])
            for r in range(max(caps))]
    length = [prompt] * max(caps)
    for c in caps:
        for _ in range(decodes):
            tok = run(graphs.step("decode", c), inputs(list(range(c)), [[last[r]] for r in range(c)], length[:c]))
            for r in range(c):
                last[r], length[r] = int(tok[r]), length[r] + 1
    return out


def measure_scope(checkpoint: str, scope: str, decode, prefill, device: str = "cpu") -> dict:
    """One scope in this process (the child): prepare, compile (timed), compare every compiled step with the eager
    one (:func:`_drive`)."""
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import clear_compilation_metrics, counters, get_compilation_metrics

    from ignition.graphs.catalog import GraphCatalog, PreparedStep, head_logits, sample_rows
    from ignition.recipes.qwen3.model import PreparedQwen3

    from ignition.components.attention import batch_tensors

    catalog = GraphCatalog(decode_capacities=tuple(decode), prefill_chunks=tuple(prefill))
    max_context = max(prefill) + 32
    page = 8

    def prepare():
        model = PreparedQwen3.from_pretrained(checkpoint, device=device)
        model.allocate_kv_cache(num_pages=(max(decode) + 1) * (max_context // page + 1), page_size=page,
                                max_context=max_context)
        return catalog.prepare(model)

    graphs = prepare().tune()
    marks: list[tuple[str, float]] = []
    note = graphs._note
    graphs._note = lambda msg: (marks.append((msg, time.perf_counter())), note(msg))
    counters.clear()
    clear_compilation_metrics()
    t0 = time.perf_counter()
    graphs.compile(scope=scope)
    compile_s = time.perf_counter() - t0
    stats = {k: dict(v) for k, v in counters.items() if k in ("stats", "frames", "recompiles", "unimplemented")}
    per_shape, prev = {}, t0
    for msg, t in marks:
        per_shape[msg.split()[1]] = round(t - prev, 3)
        prev = t
    by_region: dict[str, dict] = {}  # Dynamo's per-frame compile records, grouped by compiled function
    for m in get_compilation_metrics():
        r = by_region.setdefault(m.co_name or "?", {"compiles": 0, "compile_s": 0.0})
        r["compiles"] += 1
        r["compile_s"] = round(r["compile_s"] + (m.entire_frame_compile_time_s or 0.0), 3)
    entries = {"run_layer": len(_debug_get_cache_entry_list(PreparedQwen3.run_layer.__code__)),
               "head_logits": len(_debug_get_cache_entry_list(head_logits.__code__)),
               "sample_rows": len(_debug_get_cache_entry_list(sample_rows.__code__)),
               "batch_tensors": len(_debug_get_cache_entry_list(batch_tensors.__code__)),
               "PreparedStep.forward": len(_debug_get_cache_entry_list(PreparedStep.forward.__code__))}
    compiled_out, eager_out = _drive(graphs), _drive(prepare())
    differ = [a[0] for a, b in zip(compiled_out, eager_out) if not (torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]))]
    return {"scope": scope, "device": device, "compile_s": round(compile_s, 3), "per_shape_s": per_shape,
            "unique_graphs": stats.get("stats", {}).get("unique_graphs"), "dynamo_counters": stats,
            "cache_entries": entries, "compiles_by_region": by_region,
            "steps_compared": sorted({a[0] for a in compiled_out}), "steps_differing": sorted(set(differ)),
            "bytewise_equal_to_eager": not differ and len(compiled_out) == len(eager_out), "torch": torch.__version__}


def failures(report: dict) -> list[str]:
    """What makes the run fail (exit 1), one line per scope: a child that raised or timed out, or a compiled step
    that is not the eager one bytewise."""
    out = []
    for scope, r in report["scopes"].items():
        if "error" in r:
            out.append(f"{scope}: the child failed: {r['error'][-300:]}")
        elif "timed_out_after_s" in r:
            out.append(f"{scope}: timed out after {r['timed_out_after_s']} s")
        elif not r.get("bytewise_equal_to_eager"):
            out.append(f"{scope}: compiled steps differ from eager: {r.get('steps_differing')}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--decode", default="1,4")
    p.add_argument("--prefill", default="16")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--scopes", default="regional,whole")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per scope (child process)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available): the backend compiled")
    p.add_argument("--json", default=None)
    p.add_argument("--out", default=None, help="results root (default <repo>/results)")
    p.add_argument("--no-archive", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: "SCOPE:CHECKPOINT"
    a = p.parse_args(argv)
    from ignition.graphs.catalog import COMPILE_SCOPES

    from qualify.arguments import int_list

    decode, prefill = int_list(p, "--decode", a.decode), int_list(p, "--prefill", a.prefill)
    scopes = [s for s in a.scopes.split(",") if s]
    unknown = [s for s in scopes if s not in COMPILE_SCOPES]
    if not scopes or unknown:
        p.error(f"--scopes {a.scopes!r}: expected some of {', '.join(COMPILE_SCOPES)}")
    if a.layers < 1:
        p.error(f"--layers {a.layers}: expected >= 1")
    if a.device is None:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.child:
        scope, checkpoint = a.child.split(":", 1)
        print(json.dumps(measure_scope(checkpoint, scope, decode, prefill, a.device)))
        return 0

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "recipes"))
    from tiny_qwen3 import make_checkpoint

    work = Path(tempfile.mkdtemp(prefix="flare-compile-time-"))
    ckpt = make_checkpoint(work / "ckpt", seed=0, num_hidden_layers=a.layers, vocab_size=a.vocab,
                           max_position_embeddings=max(512, max(prefill) + 64), **GEOMETRY)
    config = {"layers": a.layers, "vocab": a.vocab, **GEOMETRY, "decode": list(decode), "prefill": list(prefill),
              "device": a.device, "cpu_count": os.cpu_count(), "sampling": True}
    report = {"config": config, "scopes": {}}
    for scope in scopes:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor-{scope}")}  # cold, unshared
        cmd = [sys.executable, "-m", "qualify.compile_time", "--child", f"{scope}:{ckpt}", "--decode", a.decode,
               "--prefill", a.prefill, "--device", a.device]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout,
                                  cwd=Path(__file__).resolve().parents[1])
        except subprocess.TimeoutExpired:
            report["scopes"][scope] = {"scope": scope, "timed_out_after_s": a.timeout}
            continue
        wall = round(time.perf_counter() - t0, 3)
        if done.returncode != 0:
            report["scopes"][scope] = {"scope": scope, "error": done.stderr[-2000:], "wall_s": wall}
            continue
        report["scopes"][scope] = {**json.loads(done.stdout.strip().splitlines()[-1]), "child_wall_s": wall}
        print(f"{scope}: compile {report['scopes'][scope]['compile_s']} s", file=sys.stderr)
    r, w = report["scopes"].get("regional", {}), report["scopes"].get("whole", {})
    if "compile_s" in r and "compile_s" in w:  # > 1: the regional compile is that much faster
        report["regional_speedup_over_whole"] = round(w["compile_s"] / r["compile_s"], 2)
    report["failures"] = failures(report)
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    if not a.no_archive:  # one record per scope (its compile, counters and eager check), the config beside
        from qualify.archive import new_run_dir, write_run

        records = [{"case": {"tool": "compile_time", "scope": scope, **config}, **r}
                   for scope, r in report["scopes"].items()]
        run_dir = write_run(new_run_dir(a.out, "compile-time"), records,
                            [sys.executable, "-m", "qualify.compile_time", *(argv if argv is not None else sys.argv[1:])],
                            {"compile_time": {k: v for k, v in report.items() if k != "scopes"}})
        print(f"compile_time: archived run -> {run_dir}", file=sys.stderr)
    for line in report["failures"]:
        print(f"compile_time: FAIL {line}", file=sys.stderr)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
