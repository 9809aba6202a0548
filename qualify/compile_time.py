"""Compile time of the graph catalog: whole-step vs regional ``torch.compile``, side by side.

``python -m qualify.compile_time --layers 28 [--decode 1,4] [--prefill 16] [--scopes regional,whole]
[--vocab 4096] [--timeout 1800] [--json OUT]`` builds a tiny-width Qwen3 checkpoint of the given depth
(hidden 64, 4 heads, 2 KV heads, head_dim 16, intermediate 128), prepares the catalog shapes (in-graph
sampling on, as ``ignition export``), and compiles it once per scope.  Each scope runs in its own child
process with its own empty Inductor cache directory (a cold compile: no FX-graph or kernel cache shared
with the other scope or an earlier run) and reports: the ``compile()`` seconds (each shape's share),
Dynamo's counters (unique graphs, frames), the compiled cache entries per region code object,
Dynamo's per-region compile records (``get_compilation_metrics``), and whether the compiled step
equals the eager one bytewise (logits and tokens of a prefill + decodes).
Prints one JSON object: ``{"config": ..., "scopes": {scope: report}, "speedup_whole_over_regional": x}``.
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


def _caps(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _drive(graphs, prompt_len: int, decodes: int) -> list:
    """A prefill of ``prompt_len`` tokens then ``decodes`` decodes of one row (outputs cloned)."""
    import torch

    from ignition.components.attention import slot_mapping_for

    step_p = graphs.step("prefill", 1, prompt_len)
    width, page = step_p.max_pages, graphs.model.kv_cache.page_size
    bt = torch.arange(width, dtype=torch.int32)[None]
    vocab = graphs.model.vocab_size
    tokens, length, out = [(i * 37 + 11) % vocab for i in range(prompt_len)], 0, []

    def inputs(toks):
        nonlocal length
        pos = torch.arange(length, length + len(toks))[None]
        length += len(toks)
        return {"input_ids": torch.tensor([toks]), "positions": pos,
                "slot_mapping": slot_mapping_for(bt, pos, torch.ones_like(pos, dtype=torch.bool), page),
                "block_tables": bt, "seq_lens": torch.tensor([length]), "active_rows": torch.tensor([True])}

    logits, tok = step_p.run(**inputs(tokens))
    out.append((logits.clone(), tok.clone()))
    for _ in range(decodes):
        logits, tok = graphs.step("decode", 1).run(**inputs([int(tok[0])]))
        out.append((logits.clone(), tok.clone()))
    return out


def measure_scope(checkpoint: str, scope: str, decode, prefill) -> dict:
    """One scope in this process (the child): prepare, compile (timed), compare with eager."""
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import clear_compilation_metrics, counters, get_compilation_metrics

    from ignition.graphs.catalog import GraphCatalog, PreparedStep, head_logits, sample_rows
    from ignition.recipes.qwen3.model import PreparedQwen3

    catalog = GraphCatalog(decode_capacities=tuple(decode), prefill_chunks=tuple(prefill))
    max_context = max(prefill) + 32
    page = 8

    def prepare():
        model = PreparedQwen3.from_pretrained(checkpoint)
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
               "PreparedStep.forward": len(_debug_get_cache_entry_list(PreparedStep.forward.__code__))}
    prompt = min(prefill)
    compiled_out = _drive(graphs, prompt, 4)
    eager_out = _drive(prepare(), prompt, 4)
    equal = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(compiled_out, eager_out))
    return {"scope": scope, "compile_s": round(compile_s, 3), "per_shape_s": per_shape,
            "unique_graphs": stats.get("stats", {}).get("unique_graphs"), "dynamo_counters": stats,
            "cache_entries": entries, "compiles_by_region": by_region, "bytewise_equal_to_eager": equal, "torch": torch.__version__}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--decode", default="1,4")
    p.add_argument("--prefill", default="16")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--scopes", default="regional,whole")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per scope (child process)")
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: "SCOPE:CHECKPOINT"
    a = p.parse_args(argv)
    decode, prefill = _caps(a.decode), _caps(a.prefill)
    if a.child:
        scope, checkpoint = a.child.split(":", 1)
        print(json.dumps(measure_scope(checkpoint, scope, decode, prefill)))
        return 0

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "recipes"))
    from tiny_qwen3 import make_checkpoint

    work = Path(tempfile.mkdtemp(prefix="flare-compile-time-"))
    ckpt = make_checkpoint(work / "ckpt", seed=0, num_hidden_layers=a.layers, vocab_size=a.vocab,
                           max_position_embeddings=max(512, max(prefill) + 64), **GEOMETRY)
    config = {"layers": a.layers, "vocab": a.vocab, **GEOMETRY, "decode": list(decode), "prefill": list(prefill),
              "cpu_count": os.cpu_count(), "sampling": True}
    report = {"config": config, "scopes": {}}
    for scope in [s for s in a.scopes.split(",") if s]:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor-{scope}")}  # cold, unshared
        cmd = [sys.executable, "-m", "qualify.compile_time", "--child", f"{scope}:{ckpt}", "--decode", a.decode,
               "--prefill", a.prefill]
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
    if "compile_s" in r and "compile_s" in w:
        report["speedup_whole_over_regional"] = round(w["compile_s"] / r["compile_s"], 2)
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
