"""Complete decode-graph replay time of a core against its measured bandwidth floor.

``python -m qualify.gpu_replay --core CORE --capacities 1,4 [--context N] [--samples N] [--seeds 0,1]
[--eager] [--timeline [--timeline-widths 1,2] [--timeline-variants decode_greedy]] [--check-compiled --steps 256]
[--widths 1,2,4,8] [--greedy-variant] [--topk-variant K] [--out DIR] [--no-archive]
[--ab NAME=VALUE[:NAME=VALUE] ... [--ab-blocks N] [--ab-null]] [--device cuda|cpu]``

``--widths``: speculative verification rounds (``ignition.graphs.rounds``) of each capacity ``B`` and width
``W`` -- the pending token plus ``W - 1`` proposals per row -- timed the same way, with the ratio to decode
at the same ``B`` (graph rounds per second = 1 / the round median).

For each capacity ``B`` and seed the core is loaded as the runtime loads it (``load_prepared``), its
decode steps are prepared, tuned, compiled (unless ``--eager``) and captured into one graph pool, every
row is given ``--context`` tokens of seeded K/V (the KV content does not change the work), and the
complete graph -- embedding, every layer, final norm, vocabulary projection and in-graph sampling -- is
replayed ``--samples`` times after warm-up, each timed by CUDA events around the replay
(:mod:`qualify.timing`).  What advances between replays: the rows' sampling counters and output counts
(in-graph state); the KV write lands in the same slot each replay and positions do not advance, so every
replay does the same work.

The floor is measured, not assumed (:func:`qualify.replay_floor.measured_floor`): a minimal captured graph
that reads exactly the single-token weight-traffic bytes of the case (all weights except the gathered
embedding rows, plus the KV at the context), timed the same way.  Printed per case: median/min/max of the
replay, the floor, and the ratio median / floor.  Raw samples of both are archived
(``results/<stamp>-<class>-<sha>-gpu-replay/samples.jsonl``, the ``qualify.report`` format).  A run cut by
SIGTERM (a stage's ``timeout``) prints and archives the cases it timed before, its summary naming what was cut, and
exits 1.

``--timeline`` (CUDA): for B = 1 and 4 (of the given capacities) a kernel timeline of the graph replays
(kernel names, counts, summed durations vs the graph's elapsed time) and an attributed profile of the
same compiled step launched without the graph, with a profiler range per region (``embed``,
``layer.<i>``, ``head``, ``sampler``): kernel count and summed kernel time per layer and per operator
(kernel name).  Tables printed and archived with gzip'd Chrome/Perfetto traces.  With ``--widths`` holding 1,
the width-one round gets a timeline too (its head, acceptance and sampling-state advance ranged separately when
they run eager; compiled -- the default -- one ``head`` range, as the graph runs them: one compiled region) and
a difference table against decode at the same B: where the round's extra time goes, by region and kernel;
``--timeline-widths 1,2`` names the round widths that get one (default 1; those not in ``--widths`` are left out);
``--timeline-variants decode_greedy,decode_topk`` the decode variants (timed with ``--greedy-variant`` /
``--topk-variant``), each with its difference against decode.

``--check-compiled``: compiled vs uncompiled captured graphs on the same model, weights and KV buffers:
from the same restored state, ``--steps`` decode steps each (tokens fed back; rows alternate greedy and
seeded sampling), logits and tokens compared bytewise every step and the final KV pool and sampling state
compared bytewise.  The uncompiled graph is run twice: if it is not repeatable its measured
repeatability is the stated bound, otherwise the check requires bytewise equality.

``--ab NAME=VALUE[:NAME=VALUE...]``: a side by side inside one process -- a second bench of the same core is built
with those environment switches set (``ignition.components.switches``: read when the steps are traced and captured;
Dynamo's caches are reset around it), and every decode case is timed on both, interleaved in ``--ab-blocks`` blocks
(A B B A ...), so that the machine, its clocks and the order of runs weigh on both alike (separate processes run one
after the other showed ~15 us order effects on the H200, ``results/20261201T104724Z-sm90-run26``).  The cases carry
``ab``: ``A`` (the environment as started) or ``B: NAME=VALUE...``; ``qualify.report`` compares runs, the printed
table compares A with B.  Rounds and ``--check-compiled`` use A only; with ``--timeline`` B's decode graphs at B = 1
and 4 get a timeline too (traces ``*-ab-b<rows>``) and its critical path is set against A's per region and per layer
position (``qualify.critical_path.compare``): where B's time goes differently.  Without a GPU it needs
``--eager`` (an uncompiled step reads the switches at every call).  ``--ab-null`` builds A once more after B (``ab``
``A2: ...``) and times the three interleaved: the bench built second ran 0.35-0.6% slower than the first where
both were the same kernels (Qwen3-8B batch 1, ``results/20261201T114716Z-sm90-run28``), so A2 / A states that bias
in the run and B is called faster or slower only when its min-max range clears both A's and A2's.  A second verdict
pairs the blocks (:func:`paired_blocks`: each block's median ratio, the blocks where B was faster, the exact sign
test) and calls B faster or slower only when that holds against A and A2 alike at p < 0.05; it is stated beside the
min-max one, which stays the rule.  ``--ab`` repeated builds one B bench per entry (``ab`` ``B1: ...``, ``B2: ...``),
all timed interleaved with A (and A2, built after every B) and each compared with them as above: the A side, its
build and the null are shared (each bench holds its own copy of the weights: Qwen3-8B's 16 GiB each).

On CPU (``--device cpu``) the same paths run without capture (perf_counter timing, no floor): it is how
CI exercises the tool; the numbers mean nothing there.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from qualify.arguments import int_list
from qualify.paired_blocks import block_sizes, describe, paired_blocks, paired_verdict

SAMPLED_ROW = {"temperature": 0.8, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
#: The decode variants a bench can prepare beside the plain decode steps (``catalog.DECODE_GREEDY``,
#: ``catalog.DECODE_TOPK``), in the order they are timed.
VARIANT_KINDS = ("decode_greedy", "decode_topk")


def variant_kinds(greedy_variant: bool, topk_variant: int | None) -> tuple[str, ...]:
    """The decode variants prepared and timed with ``--greedy-variant`` / ``--topk-variant K``."""
    return tuple(k for k, on in zip(VARIANT_KINDS, (greedy_variant, topk_variant)) if on)


#: ``ab`` of the samples of ``--ab-null``'s second A bench
NULL_LABEL = "A2: A rebuilt after B (null)"
#: The weight-traffic fields each sample archives: the report splits the floor by timeline region from them
#: (``qualify.replay_floor.region_bytes``) to say where the step's time above the floor goes.
TRAFFIC_FIELDS = ("num_layers", "weight_bytes_read", "lm_head_bytes", "embedding_bytes_gathered", "kv_bytes",
                  "total_bytes", "layer_projection_bytes", "layer_projection_names")


def parse_ab(text: str) -> dict[str, str]:
    """``NAME=VALUE[:NAME=VALUE...]`` -> the environment of the B bench; names must be ``FLARE_*`` switches."""
    env = {}
    for part in (p for p in text.split(":") if p):
        name, sep, value = part.partition("=")
        if not sep or not name.startswith("FLARE_") or not value:
            raise ValueError(f"--ab {text!r}: {part!r} is not FLARE_NAME=VALUE")
        env[name] = value
    if not env:
        raise ValueError(f"--ab {text!r}: no switch given")
    return env


def ab_labels(envs: list[dict[str, str]]) -> list[str]:
    """The ``ab`` labels of the B benches: ``B: NAME=VALUE...`` for one, ``B1: ...``, ``B2: ...`` for several (in the
    order given); raises when two entries set the same switches."""
    texts = [":".join(f"{k}={v}" for k, v in env.items()) for env in envs]
    if len({tuple(sorted(env.items())) for env in envs}) != len(envs):
        raise ValueError(f"--ab: the same switches given twice ({', '.join(texts)})")
    if len(envs) == 1:
        return [f"B: {texts[0]}"]
    return [f"B{i}: {t}" for i, t in enumerate(texts, 1)]


@contextlib.contextmanager
def switched_env(env: dict[str, str], reset: bool):
    """The process environment with ``env`` set inside the block, restored after (and Dynamo's caches reset on both
    sides when ``reset``: a compiled region does not guard on the environment)."""
    import torch

    from ignition.components.switches import environment

    with environment(env):
        if reset:
            torch._dynamo.reset()
        try:
            yield
        finally:
            if reset:
                torch._dynamo.reset()


def interleaved(timers, samples: int, warmup: int, blocks: int) -> list[list[float]]:
    """``timer(samples, warmup) -> samples_s`` of each bench in ``timers``, in ``blocks`` blocks each, the order
    reversed every other block (A B B A A B ...; with three, A B C C B A A B C ...); the first block of each warms up
    ``warmup`` replays, later ones a few.  Returns each timer's samples, in the order given."""
    sizes = block_sizes(samples, blocks)
    raw = [[] for _ in timers]
    order = list(range(len(timers)))
    for i, n in enumerate(sizes):
        w = warmup if i == 0 else min(warmup, 5)
        for j in (order if i % 2 == 0 else order[::-1]):
            raw[j].extend(timers[j](n, w))
    return raw


def ab_verdict(b: dict, refs: list[dict]) -> str:
    """B's verdict by ``qualify.report``'s min-max rule against every reference (A, and A2 with ``--ab-null``):
    faster or slower only when it is so against them all."""
    from qualify.report import verdict

    seen = {verdict([r["min_ms"], r["max_ms"]], [b["min_ms"], b["max_ms"]]) for r in refs}
    return f"B {seen.pop()}" if len(seen) == 1 and "within noise" not in seen else "within noise"


def _caps(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in str(text).split(",") if x.strip())


class ReplayBench:
    """One core, its decode steps prepared for ``capacities`` at ``context`` (+ ``extra`` decode steps)."""

    def __init__(self, core: str, capacities, context: int, *, extra: int = 0, compile: bool = True,
                 device: str = "cuda", graph: bool | None = None, prefill=(), rows: int | None = None,
                 widths=(), attention: str | None = None, greedy_variant: bool = False,
                 topk_variant: int | None = None):
        """``prefill``: prefill chunk sizes (tokens) to prepare beside the decode steps (each must be declared
        by the core's catalog); ``rows``: KV rows to allocate (default the largest capacity, at least 1)."""
        import torch

        from ignition.preparation import _recipe_model, load_prepared
        from ignition.recipes.registry import load_recipe

        self.core, self.capacities, self.context, self.device = core, tuple(capacities), context, device
        self.prefill = tuple(prefill)
        self.widths = tuple(widths)  # speculative round widths prepared beside each decode capacity
        self.greedy_variant = greedy_variant  # also the greedy-only decode steps (catalog.DECODE_GREEDY)
        self.topk_variant = topk_variant  # also the bounded top-k decode steps (catalog.DECODE_TOPK)
        self.model, self.loaded = load_prepared(core, device=device, attention_backend=attention)
        m = self.loaded.manifest
        self.manifest, self.page = m, m.kv_layout.page_size
        declared = tuple(m.graph_catalog.decode_capacities)
        missing = [c for c in self.capacities if c not in declared]
        if missing:
            raise ValueError(f"--capacities {missing} are not in the core's catalog {list(declared)}")
        chunks = tuple(m.graph_catalog.prefill_chunk_sizes)
        missing = [c for c in self.prefill if c not in chunks]
        if missing:
            raise ValueError(f"--prefill-chunk-size {missing} not declared by the core's catalog "
                             f"(prefill chunks {list(chunks)})")
        self.max_context = context + extra + max(self.widths, default=1)
        self.pages_per_row = math.ceil(self.max_context / self.page)
        self.rows = rows or max(self.capacities, default=1)
        self.model.allocate_kv_cache(self.rows * self.pages_per_row, self.page, self.max_context)
        _, module = _recipe_model(load_recipe(m.recipe.name))
        self.compiled = compile
        self.graphs = self._prepare(module, compile, graph)
        self.module = module
        torch.manual_seed(0)

    @property
    def variants(self) -> tuple[str, ...]:
        """The decode variants prepared beside the plain decode steps (``decode_greedy``, ``decode_topk``)."""
        return variant_kinds(self.greedy_variant, self.topk_variant)

    def _prepare(self, module, compile: bool, graph: bool | None):
        graphs = module.graph_catalog().prepare(self.model, decode=self.capacities, prefill=self.prefill,
                                                greedy_variant=self.greedy_variant, topk_variant=self.topk_variant)
        if self.widths:
            from ignition.graphs.rounds import prepare_rounds

            prepare_rounds(graphs, self.capacities, self.widths)
        return graphs.ready(compile=compile, capture=graph)

    # -- state ---------------------------------------------------------------------------------------

    def fill_context(self, seed: int) -> None:
        """Seeded K/V for every page (the sink page included: it is never attended)."""
        import torch

        gen = torch.Generator(device=self.model.device).manual_seed(seed)
        for pool in (self.model.kv_cache.k, self.model.kv_cache.v):
            pool.copy_(torch.randn(pool.shape, generator=gen, device=pool.device, dtype=torch.float32).to(pool.dtype))

    def inputs(self, capacity: int, tokens, position: int) -> dict:
        """Decode inputs for ``capacity`` rows at ``position`` (row r owns pages r*P .. r*P+P-1)."""
        import torch

        dev, page = self.model.device, self.page
        bt = torch.arange(capacity * self.pages_per_row, dtype=torch.int32, device=dev).view(capacity, -1)
        pos = torch.full((capacity, 1), position, dtype=torch.long, device=dev)
        slots = bt[:, position // page].long()[:, None] * page + position % page
        return {"input_ids": torch.as_tensor(tokens, dtype=torch.long, device=dev).view(capacity, 1),
                "positions": pos, "slot_mapping": slots, "block_tables": bt,
                "seq_lens": torch.full((capacity,), position + 1, dtype=torch.long, device=dev),
                "active_rows": torch.ones(capacity, dtype=torch.bool, device=dev)}

    def prefill_inputs(self, row: int, tokens, start: int) -> dict:
        """One prefill chunk of ``tokens`` for ``row`` (its pages as in :meth:`inputs`) at positions ``start..``."""
        import torch

        from ignition.components.attention import slot_mapping_for

        dev, n = self.model.device, len(tokens)
        bt = torch.arange(row * self.pages_per_row, (row + 1) * self.pages_per_row, dtype=torch.int32).view(1, -1)
        pos = torch.arange(start, start + n, dtype=torch.long).view(1, n)
        slots = slot_mapping_for(bt, pos, torch.ones_like(pos, dtype=torch.bool), self.page)
        return {"input_ids": torch.as_tensor(list(tokens), dtype=torch.long).view(1, n).to(dev),
                "positions": pos.to(dev), "slot_mapping": slots.to(dev), "block_tables": bt.to(dev),
                "seq_lens": torch.tensor([start + n], dtype=torch.long, device=dev),
                "active_rows": torch.ones(1, dtype=torch.bool, device=dev)}

    def prefill_row(self, row: int, tokens, chunk: int | None = None) -> None:
        """Write ``row``'s KV for ``tokens`` (positions 0..) by running the prepared ``chunk``-token prefill
        step over them (the last chunk padded).  Advances the sampling state of slot 0, as every prefill does."""
        chunk = chunk or max(self.prefill)
        step = self.graphs.step("prefill", 1, chunk)
        tokens = list(tokens)
        for start in range(0, len(tokens), chunk):
            step.run(**self.prefill_inputs(row, tokens[start:start + chunk], start))

    def time_round(self, capacity: int, width: int, seed: int, samples: int, warmup: int) -> list[float]:
        """A verification round of ``capacity`` rows at ``width``: the pending token plus ``width - 1``
        proposals per row at ``context``.  The round's work does not depend on what is accepted (static
        shapes): each replay rewrites the same slots; the rows' sampling counters advance."""
        from qualify.timing import time_samples

        step = self.load_round(capacity, width, seed)
        return time_samples(step.execute, samples=samples, warmup=warmup, device=self.device)

    def load_round(self, capacity: int, width: int, seed: int):
        """The round step of ``(capacity, width)`` with the context written and :meth:`time_round`'s inputs
        loaded (every row proposes ``width - 1`` tokens); returns the step, ready to execute."""
        import torch

        self.fill_context(seed)
        step = self.graphs.step("round", capacity, width)
        dev, page = self.model.device, self.page
        bt = torch.arange(capacity * self.pages_per_row, dtype=torch.int32, device=dev).view(capacity, -1)
        pos = self.context + torch.arange(width, device=dev)[None].expand(capacity, width)
        slots = torch.gather(bt.long(), 1, pos // page) * page + pos % page
        tokens = torch.tensor(self.seed_tokens(capacity * width, seed), device=dev).view(capacity, width)
        step.load(input_ids=tokens, positions=pos, slot_mapping=slots, block_tables=bt,
                  seq_lens=torch.full((capacity,), self.context + width, dtype=torch.long, device=dev),
                  active_rows=torch.ones(capacity, dtype=torch.bool, device=dev))
        step.load_drafts(tokens[:, 1:], torch.full((capacity,), width - 1, dtype=torch.long, device=dev))
        return step

    def seed_tokens(self, capacity: int, seed: int) -> list[int]:
        import random

        rng = random.Random(seed)
        return [rng.randrange(self.model.vocab_size) for _ in range(capacity)]

    # -- timing --------------------------------------------------------------------------------------

    def time_case(self, capacity: int, seed: int, samples: int, warmup: int, kind: str = "decode") -> list[float]:
        from qualify.timing import time_samples

        self.fill_context(seed)
        step = self.graphs.step(kind, capacity)
        step.load(**self.inputs(capacity, self.seed_tokens(capacity, seed), self.context))
        return time_samples(step.execute, samples=samples, warmup=warmup, device=self.device)


# -- check-compiled ------------------------------------------------------------------------------------


def check_compiled(bench: ReplayBench, capacity: int, steps: int, seed: int = 0) -> dict:
    """Uncompiled (twice) vs compiled captured graphs from one restored state over ``steps`` decodes."""
    import torch

    cache = bench.model.kv_cache
    cuda = bench.device.startswith("cuda")
    variants = {"uncompiled": bench._prepare(bench.module, False, cuda)}
    variants["compiled"] = bench.graphs if bench.compiled else bench._prepare(bench.module, True, cuda)
    bench.fill_context(seed)
    k0, v0 = cache.k.clone(), cache.v.clone()
    first = bench.seed_tokens(capacity, seed)

    def run(graphs):
        cache.k.copy_(k0), cache.v.copy_(v0)
        state = graphs.sampling
        for r in range(capacity):
            params = SAMPLED_ROW if r % 2 else {"temperature": 0.0}
            state.set_row(r, {**params, "seed": 1000 + seed * 64 + r}, [first[r]])
        step, tokens, logits, toks = graphs.step("decode", capacity), first, [], []
        for i in range(steps):
            lg, tk = step.run(**bench.inputs(capacity, tokens, bench.context + i))
            logits.append(lg.clone()), toks.append(tk.clone())
            tokens = tk.clamp(min=0)
        # the case's rows only: rows beyond ``capacity`` of the catalog's shared sampling state belong to other
        # capacities (advanced by earlier timing of the compiled catalog, never by this case)
        return logits, toks, (cache.k.clone(), cache.v.clone()), (state.step[:capacity].clone(),
                                                                   state.output_counts[:capacity].clone())

    a = run(variants["uncompiled"])
    a2 = run(variants["uncompiled"])
    b = run(variants["compiled"])

    def diff(x, y):
        lg = max(float((p - q).abs().max()) for p, q in zip(x[0], y[0]))
        first = next((i for i, (p, q) in enumerate(zip(x[0], y[0])) if not torch.equal(p, q)), None)
        return {"logits_bytewise": all(torch.equal(p, q) for p, q in zip(x[0], y[0])), "logits_max_abs_diff": lg,
                "first_logits_mismatch_step": first,
                "first_mismatch_max_abs_diff": None if first is None else float((x[0][first] - y[0][first]).abs().max()),
                "tokens_equal": all(torch.equal(p, q) for p, q in zip(x[1], y[1])),
                "first_token_mismatch_step": next((i for i, (p, q) in enumerate(zip(x[1], y[1]))
                                                   if not torch.equal(p, q)), None),
                "kv_bytewise": torch.equal(x[2][0], y[2][0]) and torch.equal(x[2][1], y[2][1]),
                "kv_max_abs_diff": max(_max_abs_diff(x[2][0], y[2][0]), _max_abs_diff(x[2][1], y[2][1])),
                "sampling_state_equal": torch.equal(x[3][0], y[3][0]) and torch.equal(x[3][1], y[3][1])}

    repeat, cmp = diff(a, a2), diff(a, b)
    rule, passed = compiled_verdict(repeat, cmp)
    del variants
    return {"capacity": capacity, "steps": steps, "seed": seed, "rule": rule, "passed": passed,
            "repeatability": repeat, "compiled_vs_uncompiled": cmp}


def _checked(bench, capacity: int, steps: int) -> dict:
    """:func:`check_compiled`, or a failed entry naming the exception it raised -- the timings already taken are
    archived either way (a check that cannot run is a failure of the run, not a lost run)."""
    try:
        return check_compiled(bench, capacity, steps)
    except Exception as exc:  # noqa: BLE001 -- reported as the check's failure, with its message
        return {"capacity": capacity, "steps": steps, "seed": 0, "passed": False,
                "rule": f"the check could not run: {exc!r}", "compiled_vs_uncompiled": {}}


def _max_abs_diff(x, y) -> float:
    """``max |x - y|`` in fp32, one slice of the leading dimension at a time (a KV pool: no pool-sized temporary)."""
    return max((float((p.float() - q.float()).abs().max()) for p, q in zip(x, y) if p.numel()), default=0.0)


def compiled_verdict(repeat: dict, cmp: dict) -> tuple[str, bool]:
    """``(rule, passed)`` of ``--check-compiled`` from :func:`check_compiled`'s two comparisons (``repeat``: the
    uncompiled graph against itself; ``cmp``: compiled against uncompiled).  Deterministic kernels are required: when
    the uncompiled graph repeats bytewise, the compiled one must equal it bytewise -- logits, tokens, the final KV and
    the sampling state.  A plan with a variable reduction order (the uncompiled graph not repeatable) is held to bounds
    from its measured repeatability: logits and KV within the two uncompiled runs' largest difference, and the tokens
    and the sampling state (which the tokens decide) equal."""
    exact = ("logits_bytewise", "tokens_equal", "kv_bytewise", "sampling_state_equal")
    if all(repeat[k] for k in exact):
        return ("uncompiled graph repeatable bytewise: compiled must equal it bytewise (logits, tokens, KV, state)",
                all(cmp[k] for k in exact))
    rule = (f"uncompiled graph not repeatable (between two runs max |dlogits| {repeat['logits_max_abs_diff']:.3g}, "
            f"max |dKV| {repeat['kv_max_abs_diff']:.3g}): bound = that repeatability for logits and KV; tokens and "
            "sampling state must match")
    return rule, (cmp["logits_max_abs_diff"] <= repeat["logits_max_abs_diff"]
                  and cmp["kv_max_abs_diff"] <= repeat["kv_max_abs_diff"]
                  and cmp["tokens_equal"] and cmp["sampling_state_equal"])


# -- the run -------------------------------------------------------------------------------------------


def run(args) -> dict:
    from qualify.replay_floor import measured_floor, weight_traffic
    from qualify.timing import summarize

    cuda = args.device.startswith("cuda")
    if args.no_fused_projections:
        from ignition.components.fused_linear import set_fused_projections

        set_fused_projections(False)
    envs_b = [parse_ab(text) for text in args.ab or ()]
    labels_b = ab_labels(envs_b)
    if envs_b and not cuda and not args.eager:
        raise ValueError("--ab without a GPU needs --eager (an uncompiled step reads the switches at every call)")

    def make(widths, extra):
        return ReplayBench(args.core, _caps(args.capacities), args.context, compile=not args.eager,
                           device=args.device, extra=extra, widths=widths, attention=args.attention,
                           greedy_variant=args.greedy_variant, topk_variant=args.topk_variant)

    bench = make(_caps(args.widths), args.steps if args.check_compiled else 0)
    benches_b, bench_null, failed_b = [], None, []
    for env_b, label_b in zip(list(envs_b), list(labels_b)):
        try:
            with switched_env(env_b, reset=not args.eager):
                benches_b.append(make((), 0))
        except Exception as exc:  # noqa: BLE001 -- one of several B's: named, dropped, the run fails at its end
            if len(envs_b) == 1:
                raise
            failed_b.append({"ab": label_b, "error": repr(exc)})
            print(f"gpu_replay: {label_b} could not be built, left out of the side by side: {exc!r}", file=sys.stderr)
            envs_b.remove(env_b), labels_b.remove(label_b)
    if envs_b and args.ab_null:  # A again, built after every B the same way: the side by side's own build-order bias
        with switched_env({}, reset=not args.eager):
            bench_null = make((), 0)
    elif args.ab_null:
        raise ValueError("--ab-null needs --ab")
    name = f"{bench.manifest.source.repo_id or Path(args.core).name}"
    # the records so far, where main() finds them when the run is cut by its time limit (:class:`Cut`)
    progress = getattr(args, "progress", {})
    samples, cases = progress.setdefault("samples", []), progress.setdefault("cases", [])
    for cap in bench.capacities:
        traffic = weight_traffic(bench.loaded.manifest, cap, args.context)
        floor = measured_floor(traffic["total_bytes"], samples=args.samples) if cuda else None
        kinds = ("decode",) + variant_kinds(args.greedy_variant, args.topk_variant)
        for seed, kind in ((sd, k) for k in kinds for sd in _caps(args.seeds)):
            paired = {}
            if not benches_b:
                timed = [(None, bench.time_case(cap, seed, args.samples, args.warmup, kind))]
            else:
                def time_on(which, env=None):
                    def time(n, w, cap=cap, seed=seed, kind=kind):
                        with switched_env(env or {}, reset=False):  # uncompiled steps read the switches per call
                            return which.time_case(cap, seed, n, w, kind)
                    return time

                timers = ([time_on(bench)] + [time_on(b, env) for b, env in zip(benches_b, envs_b)]
                          + ([time_on(bench_null)] if bench_null is not None else []))
                raws = interleaved(timers, args.samples, args.warmup, args.ab_blocks)
                timed = list(zip(["A", *labels_b, NULL_LABEL], raws))
                for i, label in enumerate(labels_b, 1):  # each B against A (and A2), block by block
                    paired[label] = {"A": paired_blocks(raws[0], raws[i], args.ab_blocks),
                                     **({"A2": paired_blocks(raws[-1], raws[i], args.ab_blocks)}
                                        if bench_null is not None else {})}
            for ab, raw in timed:
                s = summarize(raw)
                case = {"tool": "gpu_replay", "core": name, "capacity": cap, "context": args.context,
                        "variant": kind, "attention": args.attention or "recipe default",
                        "projections": "separate" if args.no_fused_projections else "fused where preferred",
                        "compiled": bench.compiled, "graph": "captured" if cuda else "eager-launch",
                        **({"ab": ab} if ab else {})}
                rec = {"case": case, "seed": seed, "replay_s": raw, **s, "traffic_bytes": traffic["total_bytes"],
                       "traffic": {k: traffic[k] for k in TRAFFIC_FIELDS if k in traffic}}
                if ab in paired:  # this B against each reference, block by block
                    rec["paired_blocks"] = paired[ab]
                if floor is not None:
                    rec.update(floor_s=floor["floor_s"], floor_samples_s=floor["samples_s"],
                               floor_bandwidth_bytes_per_s=floor["bandwidth_bytes_per_s"],
                               ratio=s["median_ms"] / 1e3 / floor["floor_s"])
                samples.append(rec)
                cases.append({k: v for k, v in rec.items() if not k.endswith("samples_s") and k != "replay_s"})
    decode_median = {(c["case"]["capacity"], c["seed"]): c["median_ms"] for c in cases
                     if c["case"]["variant"] == "decode" and c["case"].get("ab", "A") == "A"}
    for cap in bench.capacities:
        for width in bench.widths:
            for seed in _caps(args.seeds):
                raw = bench.time_round(cap, width, seed, args.samples, args.warmup)
                s = summarize(raw)
                case = {"tool": "gpu_replay.round", "core": name, "capacity": cap, "width": width,
                        "context": args.context, "compiled": bench.compiled,
                        "graph": "captured" if cuda else "eager-launch"}
                rec = {"case": case, "seed": seed, "replay_s": raw, **s,
                       "vs_decode": s["median_ms"] / decode_median[cap, seed]}  # the same rows and seed
                samples.append(rec)
                cases.append({k: v for k, v in rec.items() if k != "replay_s"})
    out = {"core": args.core, "device": args.device, "cases": cases, **({"ab": labels_b} if envs_b else {}),
           **({"ab_failed": failed_b} if failed_b else {})}
    if args.timeline:  # main() refused --timeline without CUDA
        out["timeline"] = decode_and_round_timelines(bench, args.timeline_widths, args.timeline_dir, cases,
                                                     args.timeline_variants)
        a_side = list(out["timeline"])
        for i, (bench_b, env_b, label_b) in enumerate(zip(benches_b, envs_b, labels_b), 1):
            for cap in (c for c in bench.capacities if c in (1, 4)):
                make_b = b_timeline_maker(bench_b, env_b, cap, args.timeline_dir, compiled=not args.eager,
                                          prefix="ab-" if len(benches_b) == 1 else f"ab{i}-")
                out["timeline"].append(ab_timeline(a_side, cap, label_b, make_b))
    if args.check_compiled:
        out["check_compiled"] = [_checked(bench, cap, args.steps) for cap in bench.capacities]
        for c in out["check_compiled"]:
            samples.append({"case": {"tool": "gpu_replay.check_compiled", "core": name, "capacity": c["capacity"],
                                     "steps": c["steps"]}, "seed": c["seed"], "passed": c["passed"],
                            "result": c})
    out["samples"] = samples
    return out


def decode_and_round_timelines(bench, widths, trace_dir, cases, variants=()) -> list[dict]:
    """The ``--timeline`` entries of A: for B = 1 and 4 (of ``bench.capacities``) the decode timeline (with its gap
    to the floor from ``cases``), and the timelines of the verification rounds of ``widths`` that ``bench`` times
    and of the decode ``variants`` it prepared (``decode_greedy``, ``decode_topk``; ``bench.variants``), each
    followed by its difference against decode at the same B.  A profile that fails is an entry saying so, never
    raised: the timings before it stay."""
    from qualify.timeline import difference, step_label, timeline

    out = []
    for cap in (c for c in bench.capacities if c in (1, 4)):
        entries = []
        steps = [(None, "decode"), *((w, "decode") for w in widths if w in bench.widths),
                 *((None, k) for k in variants if k in bench.variants)]
        for width, kind in steps:
            which = {"capacity": cap, "width": width, **({} if kind == "decode" else {"kind": kind})}
            try:
                t = timeline(bench, cap, trace_dir, width=width, kind=kind)
            except Exception as exc:  # a profiler failure must not lose the timings above: reported, not hidden
                t = {**which, "error": repr(exc), "table": f"timeline {step_label(which, '')}: {exc!r}"}
            if width is None and kind == "decode" and "error" not in t:
                try:  # regions the floor cannot split (no layer ranges): said, the timeline kept
                    _add_gap_to_floor(t, cases)
                except ValueError as exc:
                    t["gap_error"] = str(exc)
                    t["table"] += f"\nnot set against the floor: {exc}"
            entries.append(t)
        out += entries
        base = entries[0] if "error" not in entries[0] else None
        out += [difference(base, t) for t in entries[1:] if base is not None and "error" not in t]
    return out


def b_timeline_maker(bench_b, env_b: dict[str, str], capacity: int, trace_dir, compiled: bool,
                     prefix: str = "ab-"):
    """The B side's decode timeline of ``capacity`` rows as a thunk for :func:`ab_timeline`.  Its attributed run
    calls the step's compiled regions uncaptured, and Dynamo's caches do not guard on the environment: whatever they
    hold then (A's regions, compiled by A's attributed run) would run in B's place -- the kernel list no longer
    matches B's captured replay (run 113: "only 221 of the attributed run's 241 kernels found in order").  So the
    caches are reset on entry (B's regions recompile under B's switches) and on exit (A's after it recompile under
    A's)."""
    from qualify.timeline import timeline

    def make_b():
        with switched_env(env_b, reset=compiled):
            return timeline(bench_b, capacity, trace_dir, prefix=prefix)

    return make_b


def ab_timeline(a_timelines: list[dict], capacity: int, label_b: str, make_b) -> dict:
    """B's decode timeline of ``capacity`` rows (``make_b()``, an ``--ab`` run with ``--timeline``) with its critical
    path set against A's decode one of the same rows from ``a_timelines`` (``critical_path.compare``: per region and
    per layer position, A the baseline) appended to its table; a failure is reported in the entry, never raised (the
    timings before it stay)."""
    from qualify.critical_path import compare

    head = f"timeline of the B side ({label_b}), B={capacity}:"
    try:
        t = make_b()
    except Exception as exc:  # a profiler failure must not lose the timings above: reported, not hidden
        return {"capacity": capacity, "width": None, "ab": label_b, "error": repr(exc), "table": f"{head} {exc!r}"}
    t["ab"] = label_b
    a = next((x for x in a_timelines if x.get("capacity") == capacity and x.get("width") is None
              and "error" not in x and "critical_path" in x), None)
    a_cp, b_cp = (a or {}).get("critical_path"), t.get("critical_path")
    if a_cp and b_cp and "error" not in a_cp and "error" not in b_cp:
        lines = [f"critical path B={capacity}: A (baseline) against the B side (candidate):", *compare(a_cp, b_cp)]
    else:
        lines = [f"critical path B={capacity}: no A / B comparison (A: "
                 f"{'missing' if a_cp is None else a_cp.get('error', 'ok')}; B: "
                 f"{'missing' if b_cp is None else b_cp.get('error', 'ok')})"]
    t["table"] = "\n".join([head, t.get("table", ""), *lines])
    return t


def _add_gap_to_floor(t: dict, cases: list[dict]) -> None:
    """The decode timeline ``t``'s critical path against the floor per region (``critical_path.gap_from_samples``,
    from this run's own decode case of the same rows): ``t["gap_to_floor"]``, and its table appended to the printed
    one."""
    from qualify import critical_path

    cp = t.get("critical_path")
    gap = critical_path.gap_from_samples(cp, cases, t["capacity"]) if cp and "error" not in cp else None
    if gap is not None:
        t["gap_to_floor"] = gap
        t["table"] += "\n" + "\n".join([f"time above the floor B={t['capacity']} (critical path per region against "
                                         "its bytes over the floor's measured bandwidth):"]
                                        + critical_path.gap_lines({"this run": gap}))
    pos = critical_path.position_gaps_from_samples(cp, cases, t["capacity"]) if cp and "error" not in cp else None
    if pos is not None:
        t["position_gaps"] = pos
        t["table"] += "\n" + "\n".join([f"per layer position B={t['capacity']} against its own floor (its "
                                         "projection's bytes, the attention its KV cache):"]
                                        + critical_path.position_gap_lines({"this run": pos})).rstrip()


def _print(out: dict) -> None:
    print(f"{'capacity':>8} {'variant':>13} {'seed':>4} {'median ms':>10} {'min':>8} {'max':>8} {'floor ms':>9} "
          f"{'ratio':>6}")
    for c in (c for c in out["cases"] if c["case"]["tool"] == "gpu_replay"):
        floor = f"{c['floor_s'] * 1e3:9.4f}" if "floor_s" in c else f"{'-':>9}"
        ratio = f"{c['ratio']:6.3f}" if "ratio" in c else f"{'-':>6}"
        ab = f" {c['case']['ab'][0]}" if "ab" in c["case"] else ""
        print(f"{c['case']['capacity']:>8} {c['case']['variant']:>13} {c['seed']:>4} {c['median_ms']:10.4f} "
              f"{c['min_ms']:8.4f} {c['max_ms']:8.4f} {floor} {ratio}{ab}")
    if "ab" in out:
        by = {}
        for c in out["cases"]:
            if "ab" in c["case"]:
                by.setdefault(c["case"]["ab"], {})[(c["case"]["capacity"], c["case"]["variant"], c["seed"])] = c
        a_cases, null = by.pop("A"), by.pop(NULL_LABEL, None)
        for label, b_cases in by.items():  # each B in the order given
            print(f"side by side in one process: A = the environment as started, {label}; B / A per case"
                  + (" and the null A2 / A (A built again after every B: the side by side's own bias; B's verdict is "
                     "against both)" if null else "") + ":")
            for key, c in b_cases.items():
                a = a_cases[key]
                refs = [a] + ([null[key]] if null else [])
                extra = f"  null A2/A {null[key]['median_ms'] / a['median_ms']:.4f}" if null else ""
                pb = c.get("paired_blocks")
                if pb:
                    extra += f"  (paired blocks: {paired_verdict(list(pb.values()))}; {describe(pb)})"
                print(f"{key[0]:>8} {key[1]:>13} {key[2]:>4} {c['median_ms'] / a['median_ms']:10.4f}  "
                      f"({ab_verdict(c, refs)}: min-max ranges){extra}")
    rounds = [c for c in out["cases"] if c["case"]["tool"] == "gpu_replay.round"]
    if rounds:
        print(f"{'capacity':>8} {'width':>5} {'seed':>4} {'median ms':>10} {'min':>8} {'max':>8} {'vs decode':>9}")
        for c in rounds:
            print(f"{c['case']['capacity']:>8} {c['case']['width']:>5} {c['seed']:>4} {c['median_ms']:10.4f} "
                  f"{c['min_ms']:8.4f} {c['max_ms']:8.4f} {c['vs_decode']:9.3f}")
    for t in out.get("timeline", []):
        print(t["table"])
    for c in out.get("check_compiled", []):
        print(f"check-compiled B={c['capacity']} steps={c['steps']}: {'PASS' if c['passed'] else 'FAIL'} -- {c['rule']}; "
              f"{json.dumps(c['compiled_vs_uncompiled'])}")


class Cut(BaseException):
    """The run cut by its time limit: SIGTERM, what ``timeout`` sends (a BaseException, so that no ``except
    Exception`` on the way -- a timeline's, a side's -- takes it for a failure of its own)."""


def _cut(signum, frame):
    raise Cut(f"signal {signum} ({signal.Signals(signum).name})")


def _cut_out(args, cut: Cut) -> dict:
    """What a cut run archives: the cases timed before the signal (``args.progress``, :func:`run`'s records), and what
    was cut, named in its summary."""
    progress = getattr(args, "progress", {})
    cases, samples = progress.get("cases", []), progress.get("samples", [])
    labels = [x for x in dict.fromkeys(c["case"].get("ab") for c in cases) if x not in (None, "A", NULL_LABEL)]
    return {"core": args.core, "device": args.device, "cases": cases, "samples": samples,
            **({"ab": labels} if labels else {}),
            "incomplete": f"cut by {cut} after {len(cases)} timed cases: the cases after them, the timelines and "
                          "--check-compiled did not run"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qualify.gpu_replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--core", required=True)
    p.add_argument("--capacities", default="1,4")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--seeds", default="0")
    p.add_argument("--eager", action="store_true", help="capture the uncompiled prepared steps")
    p.add_argument("--timeline", action="store_true")
    p.add_argument("--check-compiled", action="store_true")
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--attention", default=None, help="attention backend by name (ignition.components.backends), "
                                                      "e.g. triton; default: the recipe's")
    p.add_argument("--no-fused-projections", action="store_true",
                   help="run every projection as separate modules (cuBLAS, norm, add kernels): the side-by-side "
                        "baseline of flare::fused_linear")
    p.add_argument("--greedy-variant", action="store_true",
                   help="also time the greedy-only decode variant (argmax instead of the in-graph sampler)")
    p.add_argument("--topk-variant", type=int, default=None, metavar="K",
                   help="also time the bounded top-k decode variant (its sampler cuts with topk(K) instead of "
                        "sorting the vocabulary; served to batches whose rows fit the bound)")
    p.add_argument("--widths", default="", help="speculative round widths to time per capacity, e.g. 1,2,4,8 "
                                                "(each also against decode at the same batch)")
    p.add_argument("--timeline-widths", default="1",
                   help="with --timeline and --widths: the round widths that get a timeline too, each with its "
                        "difference against decode at the same batch (default 1; e.g. 1,2)")
    p.add_argument("--timeline-variants", default="",
                   help="with --timeline: the decode variants that get a timeline too (decode_greedy with "
                        "--greedy-variant, decode_topk with --topk-variant), each with its difference against decode "
                        "at the same batch (default none)")
    p.add_argument("--ab", default=None, action="append", metavar="NAME=VALUE[:NAME=VALUE]",
                   help="also a bench built with these FLARE_* switches, every decode case timed on both, "
                        "interleaved (see the module docstring); repeated: one bench per entry, all interleaved "
                        "with A")
    p.add_argument("--ab-blocks", type=int, default=10, help="blocks per case of an --ab side by side (A B B A ...)")
    p.add_argument("--ab-null", action="store_true",
                   help="with --ab: also A built again after B, timed interleaved with both (A B A2 A2 B A ...): "
                        "A2 / A is the side by side's own bias, and B's verdict holds only against both")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default=None, help="results root (default <repo>/results)")
    p.add_argument("--no-archive", action="store_true")
    p.add_argument("--json", default=None, help="also write the summary JSON here")
    args = p.parse_args(argv)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for flag, value, least in (("--context", args.context, 1), ("--samples", args.samples, 1),
                               ("--warmup", args.warmup, 0), ("--ab-blocks", args.ab_blocks, 1),
                               ("--steps", args.steps, 1 if args.check_compiled else 0)):
        if value < least:
            p.error(f"{flag} {value}: must be >= {least}" + (" with --check-compiled" if flag == "--steps" else ""))
    # every list checked here, before anything is loaded or timed (a late failure would lose the timings)
    caps = int_list(p, "--capacities", args.capacities)
    int_list(p, "--seeds", args.seeds, least=0)
    int_list(p, "--widths", args.widths, empty=True)
    args.timeline_widths = int_list(p, "--timeline-widths", args.timeline_widths, empty=True)
    if args.timeline and not args.device.startswith("cuda"):
        p.error(f"--timeline needs a CUDA GPU (device {args.device})")
    if args.timeline and args.eager:
        p.error("--timeline with --eager: an uncompiled step has no layer regions to attribute kernels to")
    if args.timeline and not {1, 4} & set(caps):
        p.error(f"--timeline profiles batch 1 and 4 only; --capacities {args.capacities} has neither")
    args.timeline_variants = tuple(v.strip() for v in args.timeline_variants.split(",") if v.strip())
    unknown = [v for v in args.timeline_variants if v not in VARIANT_KINDS]
    if unknown:
        p.error(f"--timeline-variants {unknown}: expected decode_greedy and/or decode_topk")
    missing = [v for v in args.timeline_variants if v not in variant_kinds(args.greedy_variant, args.topk_variant)]
    if missing:
        p.error(f"--timeline-variants {missing}: time the variant too (--greedy-variant / --topk-variant K)")
    from ignition.components.backends import BackendUnavailable
    from qualify.archive import new_run_dir, write_run

    run_dir = new_run_dir(args.out, "gpu-replay")
    args.timeline_dir = Path(tempfile.mkdtemp(prefix="flare-timeline-"))
    args.progress = {}
    previous = signal.signal(signal.SIGTERM, _cut)  # a time limit (timeout's SIGTERM) keeps what was measured
    try:
        out = run(args)
    except (ValueError, FileNotFoundError, KeyError, BackendUnavailable) as exc:
        print(f"gpu_replay: error: {exc}", file=sys.stderr)
        return 2
    except Cut as cut:
        out = _cut_out(args, cut)
    finally:
        signal.signal(signal.SIGTERM, previous)
    _print(out)
    summary = {k: v for k, v in out.items() if k != "samples"}
    if not args.no_archive:
        write_run(run_dir, out["samples"], [sys.executable, "-m", "qualify.gpu_replay", *(argv or sys.argv[1:])],
                  {"gpu_replay": summary})
        for f in args.timeline_dir.iterdir():
            with open(f, "rb") as src, gzip.open(run_dir / (f.name + ".gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
        print(f"gpu_replay: archived run -> {run_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if "incomplete" in out:
        print(f"gpu_replay: incomplete: {out['incomplete']}", file=sys.stderr)
        return 1
    failed = [c for c in out.get("check_compiled", []) if not c["passed"]]
    broken = timeline_failures(out.get("timeline", []))
    for line in broken:
        print(f"gpu_replay: timeline failed: {line}", file=sys.stderr)
    for b in out.get("ab_failed", []):
        print(f"gpu_replay: {b['ab']} was not timed (it could not be built): {b['error']}", file=sys.stderr)
    return 1 if failed or broken or out.get("ab_failed") else 0


def timeline_failures(timelines: list[dict]) -> list[str]:
    """What went wrong in ``--timeline``'s entries (a profile that raised, a critical path that could not be read, a
    decode timeline the floor could not split), one line each -- the run then exits 1, its timings archived."""
    out = []
    for t in timelines:
        what = f"B={t.get('capacity')}" + (f" W={t['width']}" if t.get("width") else "") + (
            f" {t['kind']}" if t.get("kind") else "") + (f" ({t['ab']})" if t.get("ab") else "")
        cp = t.get("critical_path") or {}
        for key, err in (("profile", t.get("error")), ("critical path", cp.get("error")),
                         ("floor", t.get("gap_error"))):
            if err:
                out.append(f"{what} {key}: {err}")
    return out


if __name__ == "__main__":
    sys.exit(main())
