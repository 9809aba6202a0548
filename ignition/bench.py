"""``ignition bench``: prepared graph rounds of a core on real tokenized contexts, one score.

``ignition bench CORE [--capacities 1,4] [--context N] [--samples N] [--warmup N] [--seeds 0,1]
[--context-source corpus|examples] [--prefill --prefill-chunk-size N] [--widths 1,2,4,8] [--device cpu|cuda] [--eager]
[--out DIR] [--no-archive] [--json OUT]``

The core is loaded and its steps prepared as :class:`qualify.gpu_replay.ReplayBench` does (``load_prepared``,
KV allocated, catalog prepared, tuned, compiled on CUDA unless ``--eager``, captured on CUDA).

Contexts are real text tokenized by the core's own tokenizer (``tokenizer.json`` in the core):

- ``corpus`` (default): the project's embedded corpus (:func:`ignition.embedded.corpus.documents`), joined;
- ``examples``: the conversation fixtures (``fixtures/conversations/corpus.json``) rendered by the core's own
  frontend (its annotated chat template), token IDs concatenated.

The token stream is read cyclically; each seed picks its own offset (``random.Random(seed)``), and row ``r`` of
a case reads the window after row ``r - 1``'s, so rows and seeds see different contexts.

**Decode rounds** (default): for capacity ``B``, each row's KV is written by actually running the prepared
prefill step (the core's largest declared chunk) over its ``--context`` tokens, outside the timed region; each
row's sampling row is admitted with the core's sampling defaults (seed ``1000 + 64 * seed + r``, the context as
its prompt).  One round is the decode step for ``B`` rows at position ``--context`` fed each row's next real
token.  State restored before every sample (in ``setup``, outside the timed region): the KV slot the round
writes (every layer, K and V) and the rows' sampling state (step counters and output counts).  After timing
the round is run again from the restored state; its tokens and logits must equal the first round's bytewise
(``identical`` in the record), and the step counters must show exactly one round since the last restore
(``state_restored``).

**Prefill chunks** (``--prefill --prefill-chunk-size N``): one exact chunk of ``N`` real tokens (no padding) at
positions ``--context ..`` (default context 0: a prompt's first chunk; a longer context is written first by the
same chunk step, outside the timed region).  Restored before each sample: slot 0's sampling state (every
prefill chunk samples and advances it).  The KV pages the chunk writes are *not* restored: every repeat writes
the same values (same tokens, positions and earlier context), so they are irrelevant; this is checked --
``kv_rewritten_identically``: the chunk's slots after timing equal those after the first run, bytewise.

Samples: one record per case and seed in ``samples.jsonl`` (the ``qualify.report`` format):
``{"case": {"tool": "ignition.bench", "core", "mode", "capacity"|"chunk", "context", ...}, "seed": s,
"round_s": [raw seconds], ...}``.  **Score** = the equal-weight arithmetic mean over cases of each case's
median (all its seeds' raw samples pooled, as ``qualify.report`` pools them), in milliseconds; lower is
better.  It is printed and archived in ``environment.json`` (``bench.score_ms``).

Timing is :func:`qualify.timing.time_samples`: CUDA events around the replay on CUDA, ``perf_counter`` on CPU
(where the numbers mean nothing but the mechanics are exercised).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "fixtures" / "conversations" / "corpus.json"
CONTEXT_SOURCES = ("corpus", "examples")
DEFAULT_DECODE_CONTEXT = 1024


class BenchError(ValueError):
    """Arguments the core cannot honour (exit status 2)."""


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise BenchError(f"{flag} {text!r}: expected comma-separated integers") from None


# -- contexts ------------------------------------------------------------------------------------------


def context_tokens(loaded, source: str, skipped: list | None = None) -> list[int]:
    """The token stream of ``source``, tokenized by the core's own tokenizer (and template, for examples);
    ``skipped`` (a list) receives ``{"conversation", "field", "reason"}`` of each example this core's frontend refuses
    (a feature its template lacks) -- any other error raises."""
    from helios.frontend.tokens import PromptTokenizer

    tokenizer = PromptTokenizer.from_file(loaded.tokenizer_path)
    if source == "corpus":
        from ignition.embedded.corpus import documents

        text = "\n\n".join(documents())
        return list(tokenizer.encode(text, [(0, len(text))]).ids)
    if source == "examples":
        from helios.frontend.conversation import FrontendError
        from helios.frontend.frontend import Frontend
        from helios.protocol import decode_request

        frontend = Frontend(loaded.template_text(), tokenizer, loaded.special_token_variables,
                            loaded.frontend_spec(), loaded.sampling_defaults())
        ids: list[int] = []
        for conv in json.loads(EXAMPLES.read_text(encoding="utf-8")):
            try:
                ids.extend(frontend.prepare(decode_request(conv["protocol"], conv["request"])).token_ids)
            except FrontendError as exc:  # a feature this core's template lacks (images, tools...): said, skipped
                if skipped is not None:
                    skipped.append({"conversation": conv.get("name", "?"), "field": exc.field, "reason": str(exc)})
        if not ids:
            raise BenchError(f"--context-source examples: no conversation of {EXAMPLES} renders with this core")
        return ids
    raise BenchError(f"--context-source {source!r}: expected one of {', '.join(CONTEXT_SOURCES)}")


def windows(stream: list[int], seed: int, rows: int, length: int) -> list[list[int]]:
    """``rows`` consecutive windows of ``length`` tokens from the (cyclic) stream at the seed's offset."""
    start = random.Random(seed).randrange(len(stream))
    return [[stream[(start + r * length + i) % len(stream)] for i in range(length)] for r in range(rows)]


# -- cases ---------------------------------------------------------------------------------------------


def _row_params(bench, seed: int, row: int) -> dict:
    return {**bench.loaded.sampling_defaults().values, "seed": 1000 + 64 * seed + row}


def _time_restored(bench, step, rows: int, slots, outputs, samples: int, warmup: int, restore: bool = True):
    """Time ``step`` with the KV ``slots`` it writes and the sampling state of its ``rows`` restored before every
    sample (outside the timed region); re-run from the restored state and compare ``outputs()`` bytewise.
    Returns ``(raw, first, again, identical, restored)``."""
    import torch

    from qualify.timing import time_samples

    state, cache = bench.graphs.sampling, bench.model.kv_cache
    kf, vf = (pool.view(pool.shape[0], -1, *pool.shape[-2:]) for pool in (cache.k, cache.v))
    k0, v0 = kf[:, slots].clone(), vf[:, slots].clone()
    step0, counts0 = state.step[:rows].clone(), state.output_counts[:rows].clone()

    def setup():
        if restore:
            kf[:, slots] = k0
            vf[:, slots] = v0
            state.step[:rows].copy_(step0)
            state.output_counts[:rows].copy_(counts0)

    setup()
    step.execute()
    first = outputs()
    advanced = state.step[:rows] - step0  # one step for decode, n_emitted for a round
    raw = time_samples(step.execute, samples=samples, warmup=warmup, setup=setup, device=bench.device)
    restored = bool(torch.equal(state.step[:rows], step0 + advanced))
    setup()
    step.execute()
    again = outputs()
    identical = all(bool(torch.equal(a, b)) for a, b in zip(first, again))
    return raw, first, again, identical, restored


def _fill_rows(bench, stream: list[int], capacity: int, seed: int, length: int) -> list[list[int]]:
    """Each row's real-text window; its first ``bench.context`` tokens prefilled, its sampling row admitted."""
    ctx, state = bench.context, bench.graphs.sampling
    rows = windows(stream, seed, capacity, length)
    for r, w in enumerate(rows):
        bench.prefill_row(r, w[:ctx])
    for r, w in enumerate(rows):
        state.set_row(r, _row_params(bench, seed, r), w[:ctx])
    return rows


def decode_case(bench, stream: list[int], capacity: int, seed: int, samples: int, warmup: int,
                restore: bool = True) -> dict:
    """Time ``samples`` decode rounds of ``capacity`` rows at ``bench.context`` (see the module docstring).
    ``restore=False`` skips the state restoration (tests: shows what it prevents)."""
    ctx = bench.context
    rows = _fill_rows(bench, stream, capacity, seed, ctx + 1)
    step = bench.graphs.step("decode", capacity)
    inputs = bench.inputs(capacity, [w[ctx] for w in rows], ctx)
    step.load(**inputs)
    outputs = lambda: (step.tokens[:capacity].clone(), step.logits[:capacity].clone())  # noqa: E731
    raw, first, again, identical, restored = _time_restored(bench, step, capacity, inputs["slot_mapping"][:, 0],
                                                            outputs, samples, warmup, restore)
    return {"round_s": raw, "tokens_first": first[0].tolist(), "tokens_last": again[0].tolist(),
            "identical": identical, "state_restored": restored,
            "context_token_head": [w[:8] for w in rows]}


def round_case(bench, stream: list[int], capacity: int, width: int, seed: int, samples: int, warmup: int) -> dict:
    """Time ``samples`` speculative verification rounds (``ignition.graphs.rounds``) of ``capacity`` rows at
    ``width``: each row's next real token is pending and the ``width - 1`` real tokens after it are the
    proposals (a perfect lookup draft of the text; what the model accepts of them depends on its weights).
    The ``width`` KV slots per row and the rows' sampling state are restored before every sample."""
    import torch

    ctx = bench.context
    rows = _fill_rows(bench, stream, capacity, seed, ctx + width)
    step = bench.graphs.step("round", capacity, width)
    dev, page = bench.model.device, bench.page
    bt = torch.arange(capacity * bench.pages_per_row, dtype=torch.int32, device=dev).view(capacity, -1)
    pos = ctx + torch.arange(width, device=dev)[None].expand(capacity, width)
    slots = torch.gather(bt.long(), 1, pos // page) * page + pos % page
    tokens = torch.tensor([w[ctx:ctx + width] for w in rows], device=dev)
    step.load(input_ids=tokens, positions=pos, slot_mapping=slots, block_tables=bt,
              seq_lens=torch.full((capacity,), ctx + width, dtype=torch.long, device=dev),
              active_rows=torch.ones(capacity, dtype=torch.bool, device=dev))
    step.load_drafts(tokens[:, 1:], torch.full((capacity,), width - 1, dtype=torch.long, device=dev))
    outputs = lambda: (step.emitted[:capacity].clone(), step.n_emitted[:capacity].clone(),  # noqa: E731
                       step.logits[:capacity].clone())
    raw, first, again, identical, restored = _time_restored(bench, step, capacity, slots.reshape(-1), outputs,
                                                            samples, warmup)
    return {"round_s": raw, "tokens_first": first[0].tolist(), "tokens_last": again[0].tolist(),
            "accepted_first": (first[1] - 1).tolist(), "identical": identical, "state_restored": restored,
            "context_token_head": [w[:8] for w in rows]}


def prefill_case(bench, stream: list[int], chunk: int, seed: int, samples: int, warmup: int) -> dict:
    """Time ``samples`` exact ``chunk``-token prefill chunks at positions ``bench.context ..``."""
    import torch

    from qualify.timing import time_samples

    ctx, state, cache = bench.context, bench.graphs.sampling, bench.model.kv_cache
    (w,) = windows(stream, seed, 1, ctx + chunk)
    if ctx:
        bench.prefill_row(0, w[:ctx], chunk)
    state.set_row(0, _row_params(bench, seed, 0), w)
    step = bench.graphs.step("prefill", 1, chunk)
    inputs = bench.prefill_inputs(0, w[ctx:], ctx)
    step.load(**inputs)
    slots = inputs["slot_mapping"][0]
    kf, vf = (pool.view(pool.shape[0], -1, *pool.shape[-2:]) for pool in (cache.k, cache.v))
    step0, counts0 = state.step[:1].clone(), state.output_counts[:1].clone()

    def setup():
        state.step[:1].copy_(step0)
        state.output_counts[:1].copy_(counts0)

    setup()
    step.execute()
    first = step.tokens[:1].clone(), step.logits[:1].clone()
    k1, v1 = kf[:, slots].clone(), vf[:, slots].clone()
    raw = time_samples(step.execute, samples=samples, warmup=warmup, setup=setup, device=bench.device)
    kv_same = bool(torch.equal(kf[:, slots], k1) and torch.equal(vf[:, slots], v1))
    restored = bool(torch.equal(state.step[:1], step0 + 1))
    setup()
    step.execute()
    again = step.tokens[:1].clone(), step.logits[:1].clone()
    identical = bool(torch.equal(first[0], again[0]) and torch.equal(first[1], again[1]))
    return {"round_s": raw, "tokens_first": first[0].tolist(), "tokens_last": again[0].tolist(),
            "identical": identical, "state_restored": restored, "kv_rewritten_identically": kv_same,
            "context_token_head": [w[:8]]}


# -- the run -------------------------------------------------------------------------------------------


def score(samples: list[dict]) -> tuple[float, dict[str, float]]:
    """Equal-weight arithmetic mean of per-case medians (ms; each case's seeds pooled) and those medians."""
    pooled: dict[str, list[float]] = {}
    for s in samples:
        pooled.setdefault(json.dumps(s["case"], sort_keys=True), []).extend(s["round_s"])
    medians = {k: statistics.median(v) * 1e3 for k, v in pooled.items()}
    return statistics.fmean(medians.values()), medians


def run(args) -> dict:
    from qualify.gpu_replay import ReplayBench
    from qualify.timing import summarize

    from ignition.core import load_core

    cuda = args.device.startswith("cuda")
    seeds = _ints(args.seeds, "--seeds")
    if not seeds:
        raise BenchError("--seeds: at least one seed")
    m = load_core(args.core, verify_checksums=False, progress=False).manifest  # the catalog, before preparing
    declared = list(m.graph_catalog.prefill_chunk_sizes)
    if args.prefill:
        if args.prefill_chunk_size not in declared:
            raise BenchError(f"--prefill-chunk-size {args.prefill_chunk_size} is not declared by the core's catalog "
                             f"(prefill chunks {declared})")
        ctx = args.context if args.context is not None else 0
        last = ctx + args.prefill_chunk_size - 1
    else:
        caps = _ints(args.capacities, "--capacities")
        missing = [c for c in caps if c not in m.graph_catalog.decode_capacities]
        if not caps or missing:
            raise BenchError(f"--capacities {args.capacities!r}: {missing or 'none given'} not in the core's catalog "
                             f"{list(m.graph_catalog.decode_capacities)}")
        if not declared:
            raise BenchError(f"{args.core}: the core declares no prefill chunk to write the contexts with")
        ctx = args.context if args.context is not None else DEFAULT_DECODE_CONTEXT
        widths = _ints(args.widths, "--widths") if args.widths else ()
        if any(not 1 <= w <= 8 for w in widths):
            raise BenchError(f"--widths {args.widths!r}: round widths must be 1..8")
        last = ctx + max(widths, default=1) - 1
    limit = m.geometry.max_position_embeddings
    if limit and last >= limit:
        raise BenchError(f"--context {ctx}: the timed step reaches position {last}, beyond the core's "
                         f"max_position_embeddings {limit}")
    if args.prefill:
        chunk = args.prefill_chunk_size
        bench = ReplayBench(args.core, (), ctx, extra=chunk - 1, compile=cuda and not args.eager,
                            device=args.device, prefill=(chunk,), rows=1, attention=args.attention)
    else:
        bench = ReplayBench(args.core, caps, ctx, compile=cuda and not args.eager, device=args.device,
                            prefill=(max(declared),), widths=widths, attention=args.attention)
    refused: list[dict] = []
    stream = context_tokens(bench.loaded, args.context_source, refused)
    name = bench.manifest.source.repo_id or Path(args.core).name
    samples, cases = [], []
    plan = [(args.prefill_chunk_size, None)] if args.prefill else \
        [(c, None) for c in bench.capacities] + [(c, w) for c in bench.capacities for w in bench.widths]
    for size, width in plan:
        for seed in seeds:
            mode = "prefill" if args.prefill else ("decode" if width is None else "round")
            case = {"tool": "ignition.bench", "core": name, "mode": mode, **({"width": width} if width else {}),
                    ("chunk" if args.prefill else "capacity"): size, "context": ctx,
                    "context_source": args.context_source, "compiled": bench.compiled,
                    "attention": args.attention or "recipe default",
                    "graph": "captured" if cuda else "eager-launch"}
            if args.prefill:
                rec = prefill_case(bench, stream, size, seed, args.samples, args.warmup)
            elif width is not None:
                rec = round_case(bench, stream, size, width, seed, args.samples, args.warmup)
            else:
                rec = decode_case(bench, stream, size, seed, args.samples, args.warmup)
            rec = {"case": case, "seed": seed, **rec, **summarize(rec["round_s"])}
            samples.append(rec)
            cases.append({k: v for k, v in rec.items() if k != "round_s"})
    total, medians = score(samples)
    throughput = _prefill_throughput(bench, cases[0]["case"]["chunk"], medians, ctx, cuda) if args.prefill else None
    return {"core": args.core, "prefill_throughput": throughput, "device": args.device,
            "mode": "prefill" if args.prefill else "decode",
            "context": ctx, "context_source": args.context_source, "context_stream_tokens": len(stream),
            "context_examples_refused": refused,
            "cases": cases, "case_medians_ms": medians, "score_ms": total,
            "score_rule": "equal-weight arithmetic mean of per-case medians (seeds pooled), ms; lower is better",
            "samples": samples}


def _prefill_throughput(bench, chunk: int, case_medians_ms: dict[str, float], ctx: int, cuda: bool) -> dict:
    """Achieved TFLOP/s of the chunk (``qualify.flops``) at the case's median -- the one the score takes, its seeds
    pooled (:func:`score`) -- and, on CUDA, its share of the measured bf16 matmul throughput (an 8192^3 captured
    matmul timed in the same run: the best of its trials, ``qualify.flops``)."""
    from qualify.flops import measured_matmul_tflops, prefill_flops

    (median_ms,) = case_medians_ms.values()  # --prefill times one case
    flops = prefill_flops(bench.manifest.geometry, chunk, ctx)
    median_s = median_ms / 1e3
    out = {"flops": flops, "achieved_tflops": flops["total_flops"] / median_s / 1e12}
    if cuda:
        ref = measured_matmul_tflops()
        out.update(matmul_reference_tflops=ref["tflops"], matmul_reference=ref,
                   fraction_of_matmul=out["achieved_tflops"] / ref["tflops"])
    return out


def _print(out: dict) -> None:
    what = "chunk" if out["mode"] == "prefill" else "capacity"
    print(f"ignition bench: {out['mode']} at context {out['context']} ({out['context_source']}, "
          f"{out['context_stream_tokens']} tokens), device {out['device']}")
    for r in out.get("context_examples_refused", []):
        print(f"  example {r['conversation']!r} not in the context stream: this core refuses {r['field']} ({r['reason']})")
    print(f"{what:>8} {'width':>5} {'seed':>4} {'median ms':>10} {'min':>9} {'max':>9} {'repeat':>7}")
    for c in out["cases"]:
        ok = "same" if c["identical"] and c["state_restored"] else "DIFFER"
        width = c["case"].get("width", "-")
        print(f"{c['case'][what]:>8} {width:>5} {c['seed']:>4} {c['median_ms']:10.4f} {c['min_ms']:9.4f} "
              f"{c['max_ms']:9.4f} {ok:>7}")
    for key, med in out["case_medians_ms"].items():
        case = json.loads(key)
        label = f"{case[what]}" + (f" x W{case['width']}" if "width" in case else "")
        print(f"case median {label:>9}: {med:.4f} ms")
    print(f"score: {out['score_ms']:.4f} ms ({out['score_rule']})")
    t = out.get("prefill_throughput")
    if t:
        line = f"prefill: {t['flops']['total_flops'] / 1e9:.1f} GFLOP per chunk, {t['achieved_tflops']:.2f} TFLOP/s"
        if "fraction_of_matmul" in t:
            line += (f" = {100 * t['fraction_of_matmul']:.1f}% of the measured bf16 matmul throughput "
                     f"({t['matmul_reference_tflops']:.0f} TFLOP/s, 8192^3, best of "
                     f"{', '.join(f'{x:.0f}' for x in t['matmul_reference']['trial_tflops'])})")
        print(line)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("core", help="core directory (ignition export)")
    p.add_argument("--capacities", default=None, help="decode capacities (rows), e.g. 1,4 (default 1,4; not with "
                   "--prefill)")
    p.add_argument("--context", type=int, default=None,
                   help=f"context tokens per row (default {DEFAULT_DECODE_CONTEXT}; --prefill: 0)")
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seeds", default="0", help="comma-separated; each seed picks a different context")
    p.add_argument("--context-source", choices=CONTEXT_SOURCES, default="corpus")
    p.add_argument("--prefill", action="store_true", help="time exact prefill chunks instead of decode rounds")
    p.add_argument("--widths", default="", help="also speculative verification rounds of these widths per capacity "
                                                "(e.g. 1,2,4,8; decode mode)")
    p.add_argument("--prefill-chunk-size", type=int, default=None, metavar="N")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--attention", default=None, help="attention backend by name (ignition.components.backends), "
                                                      "e.g. triton; default: the recipe's")
    p.add_argument("--eager", action="store_true", help="on CUDA: capture the uncompiled prepared steps")
    p.add_argument("--out", default=None, help="results root (default <repo>/results)")
    p.add_argument("--no-archive", action="store_true")
    p.add_argument("--json", default=None, help="also write the summary JSON here")


def main(args, argv: list[str] | None = None) -> int:
    """``args`` from :func:`add_arguments`'s parser; ``["ignition", *argv]`` is recorded as the command line."""
    def usage(msg: str) -> int:
        print(f"ignition bench: error: {msg}", file=sys.stderr)
        return 2

    if args.samples < 1 or args.warmup < 0:
        return usage("--samples must be >= 1 and --warmup >= 0")
    if args.context is not None and args.context < (0 if args.prefill else 1):
        return usage(f"--context {args.context}: must be >= {0 if args.prefill else 1}")
    if args.prefill and args.prefill_chunk_size is None:
        return usage("--prefill needs --prefill-chunk-size N")
    if args.prefill_chunk_size is not None and not args.prefill:
        return usage("--prefill-chunk-size is only meaningful with --prefill")
    if args.prefill and args.prefill_chunk_size < 1:
        return usage(f"--prefill-chunk-size {args.prefill_chunk_size}: must be >= 1")
    if args.prefill and (args.capacities is not None or args.widths):
        return usage(f"--prefill times one chunk of one row: {'--capacities' if args.capacities else '--widths'} "
                     "does not apply")
    if args.capacities is None:
        args.capacities = "1,4"
    if not Path(args.core).is_dir():
        return usage(f"{args.core}: no such core folder")
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return usage("--device cuda: no CUDA device")
    from qualify.archive import new_run_dir, write_run

    run_dir = new_run_dir(args.out, "bench")
    try:
        out = run(args)
    except (ValueError, FileNotFoundError) as exc:  # BenchError, ReplayBench's catalog checks
        return usage(str(exc))
    _print(out)
    summary = {k: v for k, v in out.items() if k != "samples"}
    if not args.no_archive:
        write_run(run_dir, out["samples"], ["ignition", *(argv if argv is not None else sys.argv[1:])],
                  {"bench": summary})
        print(f"ignition bench: archived run -> {run_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    broken = [c for c in out["cases"] if not (c["identical"] and c["state_restored"]
                                              and c.get("kv_rewritten_identically", True))]
    if broken:
        print(f"ignition bench: {len(broken)} case(s) did not repeat identically from the restored state",
              file=sys.stderr)
        return 1
    return 0
