"""The graph catalog: static-shape prepared steps, tuned, compiled, then captured into one graph pool.

A recipe declares a ``GraphCatalog`` (decode capacities in rows, prefill chunk sizes in tokens).
``GraphCatalog.prepare(model, ...)`` builds one ``PreparedStep`` per shape with static input and output
buffers; ``PreparedGraphs`` then runs the stages in order:

1. ``tune()``: each step runs once on its declaration example (its own static buffers: every row
   inactive, so all KV writes land in the sink page); the model's optional ``tune(step)`` hook may
   keep plans.  Examples and tuning workspaces are released afterwards (``release_examples``).
2. ``compile()``: ``torch.compile(fullgraph=True, dynamic=False)`` with ``emulate_precision_casts`` so
   fused kernels keep the model's bf16 rounding points.  Two scopes:

   * ``"regional"`` (default): the repeated decoder layer is one region (the model's ``run_layer``,
     compiled once per shape and reused by every layer: parameters are graph inputs, and each layer
     sees a one-layer view of the KV pool, so no per-layer value is guarded); the non-repeated head
     (last-token gather, final norm, vocabulary projection: :func:`head_logits`) is a second, and the
     in-graph sampler with its state update (:func:`sample_rows`) -- or the model's own sampler hook
     (:func:`run_sampler`: the greedy variant's) -- a third.  The sampler only sees
     ``[rows, vocab]`` logits, so every prefill chunk (one row) reuses the one-row decode sampler.
     The per-step attention metadata (``attention.batch_tensors``: integer and boolean ops only, so
     compiled equals eager bit for bit) is a fourth: eager it was a dozen small kernels per step on
     the H200.  Embedding and rotary stay eager between the regions (the canonical rotary's cos/sin in
     its own rounding) -- on a GPU the whole step is captured into one CUDA graph anyway, so that Python
     costs nothing at replay.  Compile time scales with the number of shapes, not shapes x layers.
   * ``"whole"``: each step's complete forward is one graph (more fusion across layer boundaries, but
     Inductor sees every layer unrolled: compile time grows with depth).

   Regional compilation needs the model to split its forward: ``body(*inputs, layer_fn=None,
   batch_fn=None) -> (batch, hidden)``, the static ``run_layer(layer, hidden, position_embeddings, layer_batch)`` and
   ``head(hidden, batch) -> logits``.
3. ``capture()`` (CUDA only): each step is warmed up on a side stream and captured into a
   ``torch.cuda.CUDAGraph``; all graphs share one pool (``torch.cuda.graph_pool_handle()``), largest
   first.  The captured step's head and sampler regions store logits and tokens into per-step output buffers
   allocated outside the pool (no copy kernel after them), so a later replay of another graph never overwrites
   them.

``PreparedStep.run(...)`` copies a (possibly smaller) batch into the static inputs -- padding rows are
inactive, padding tokens carry ``slot_mapping = -1`` -- then replays the graph (CUDA) or calls the
eager/compiled forward (CPU), and returns views of the static outputs for the live rows.  Nothing in
a step advances by itself: all state it changes is the KV pages its inputs name.

A model with ``takes_input_embeds`` (its embedding table kept off the device: ``flare run
--embedding-table-storage ram|disk``) gets one more static input, ``input_embeds [rows, tokens, hidden]``,
filled by the caller with the rows of the step's tokens; every other model's steps are unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from ignition.components.sampling import GREEDY_EPS
from ignition.components.switches import switch

log = logging.getLogger(__name__)

DECODE = "decode"
PREFILL = "prefill"
#: The greedy-only decode variant: the same body and head, then argmax (the model's greedy hook) instead of the
#: in-graph sampler -- no penalties, filters or sort over the vocabulary.  A scheduler may replay it only when
#: every active row is greedy with neutral penalties (:func:`plain_greedy`): such rows never read the
#: sampling state, so the variant leaves it untouched.
DECODE_GREEDY = "decode_greedy"
#: The bounded top-k decode variant: the same step, its sampler cutting with ``topk(K)`` instead of sorting the
#: whole vocabulary (``SamplingTensors.max_top_k``; the sort and its scans are most of the sampler's cost on the
#: H200).  Every active row must be greedy or have ``1 <= top_k <= K`` (:func:`within_top_k`): then its kept set
#: lies inside the top K values and the variant draws from the same distribution as ``decode`` (the top-p masses
#: are summed over K values instead of V -- another fp32 order).  It shares the sampling state with ``decode``.
DECODE_TOPK = "decode_topk"
INPUTS = ("input_ids", "positions", "slot_mapping", "block_tables", "seq_lens", "active_rows")
#: An extra static input of models prepared with ``takes_input_embeds`` (embedding rows gathered outside the
#: step, e.g. from a host-side table): ``[rows, tokens, hidden]`` in the model's dtype, after ``INPUTS``.
EMBEDS = "input_embeds"


@dataclass(frozen=True)
class StepShape:
    kind: str  # "decode" | "prefill"
    rows: int
    tokens: int

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.rows}x{self.tokens}"


@dataclass(frozen=True)
class GraphCatalog:
    """What a recipe declares: decode capacities (rows, one token each) and prefill chunks (tokens, one row)."""

    decode_capacities: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    prefill_chunks: tuple[int, ...] = (256, 1024, 4096)

    def __post_init__(self):
        for what, values in (("decode_capacities", self.decode_capacities), ("prefill_chunks", self.prefill_chunks)):
            if list(values) != sorted(set(values)) or any(v < 1 for v in values):
                raise ValueError(f"{what} must be positive, unique and ascending: {values}")

    def shapes(self, decode: Iterable[int] | None = None, prefill: Iterable[int] | None = None) -> list[StepShape]:
        decode = self.decode_capacities if decode is None else tuple(decode)
        prefill = self.prefill_chunks if prefill is None else tuple(prefill)
        unknown = [c for c in decode if c not in self.decode_capacities]
        unknown += [c for c in prefill if c not in self.prefill_chunks]
        if unknown:
            raise ValueError(f"capacities {unknown} are not declared by the catalog {self}")
        return [StepShape(DECODE, c, 1) for c in decode] + [StepShape(PREFILL, 1, t) for t in prefill]

    def prepare(self, model, decode: Iterable[int] | None = None, prefill: Iterable[int] | None = None,
                max_pages_per_row: int | None = None, sampling: bool = True,
                max_top_k: int | None = None, greedy_variant: bool = False,
                topk_variant: int | None = None) -> "PreparedGraphs":
        """Static buffers and eager step callables for each selected shape.  With ``sampling`` (default)
        every step samples in-graph from one shared :class:`SamplingTensors` (rows of the largest shape;
        smaller shapes use views of its first rows); without it the model's greedy hook decides.
        ``greedy_variant``: also a :data:`DECODE_GREEDY` step per decode capacity (its layers compile to the
        decode step's graphs: same shapes).  ``topk_variant`` K: also a :data:`DECODE_TOPK` step per decode
        capacity, sampling with the bound K over the same state."""
        if topk_variant is not None and (not sampling or max_top_k is not None or not 1 <= topk_variant):
            raise ValueError(f"topk_variant {topk_variant}: needs in-graph sampling without max_top_k and K >= 1")
        if topk_variant is not None and model.vocab_size is not None and topk_variant > model.vocab_size:
            raise ValueError(f"topk_variant {topk_variant} exceeds the vocabulary ({model.vocab_size})")
        cache = model.kv_cache
        if cache is None:
            raise RuntimeError("the model needs its KV cache allocated before the catalog is prepared")
        pages = max_pages_per_row or cache.max_pages_per_row
        shapes = self.shapes(decode, prefill)
        state = None
        if sampling:
            from ignition.components.sampling import SamplingTensors

            state = SamplingTensors.empty(max(s.rows for s in shapes), vocab_size=model.vocab_size,
                                          device=model.device, max_top_k=max_top_k)
            state.temperature.zero_()  # greedy until the scheduler admits a request's parameters (set_row)
        steps = [PreparedStep(s, model, pages, state) for s in shapes]
        if greedy_variant and sampling:
            steps += [PreparedStep(StepShape(DECODE_GREEDY, s.rows, 1), model, pages, None)
                      for s in shapes if s.kind == DECODE]
        if topk_variant is not None:
            bounded = dataclasses.replace(state, max_top_k=int(topk_variant))  # the same tensors, another bound
            steps += [PreparedStep(StepShape(DECODE_TOPK, s.rows, 1), model, pages, bounded)
                      for s in shapes if s.kind == DECODE]
        graphs = PreparedGraphs(self, model, steps)
        graphs.sampling = state
        return graphs


def plain_greedy(resolved: dict) -> bool:
    """Whether a request's resolved sampling parameters make it a row the greedy variant may serve: greedy
    (temperature below the sampler's threshold) with neutral presence/frequency/repetition penalties."""
    def value(name, neutral):
        v = resolved.get(name)
        return neutral if v is None else v

    return (value("temperature", 1.0) < GREEDY_EPS and value("presence_penalty", 0.0) == 0.0
            and value("frequency_penalty", 0.0) == 0.0 and value("repetition_penalty", 1.0) == 1.0)


def within_top_k(resolved: dict, k: int | None) -> bool:
    """Whether a request's row may be served by the :data:`DECODE_TOPK` variant of bound ``k``: greedy (its token
    is the argmax, before any filter) or ``1 <= top_k <= k``."""
    if k is None:  # no decode_topk steps: the scheduler's per-step question ends here
        return False
    temperature, top_k = resolved.get("temperature"), resolved.get("top_k")
    return (temperature is not None and temperature < GREEDY_EPS) or (top_k is not None and 1 <= top_k <= k)


#: Whether Inductor's own kernels (the sampler's, the step metadata's, the head's glue) launch with programmatic
#: dependent launch on sm90+ (``FLARE_INDUCTOR_PDL=1``, read at ``compile()``: Inductor's ``triton.enable_pdl``):
#: each waits (``gdc_wait``) before its first read of what the kernel before it wrote -- at the start of a compiled
#: region before any read -- and lets its dependents launch only after that wait, so the rules of
#: ``kernels.launch`` hold across them (an ``EARLY`` kernel of ours is followed by our own kernels, or by a region's
#: first kernel, which waits before reading anything).  Qwen3-8B's one-row step runs ~20 such kernels on its critical
#: path (the sampler's 16, the head's gather, the metadata's: ~45 us in run 159), each now a full launch boundary.
#: Off: within noise at Qwen3-8B side by side in one process with the null (``results/20261205T014952Z-sm90-run165``,
#: 1024-token context): batch 1 0.9996x (paired blocks 6/10 faster against A, 9/10 against A2), batch 4 0.9995x (10/10,
#: 8/10); at batch 1 the sampler's critical path 36.1 -> 30.9 us and the head's -2.1, the layers +5.8 (noise).
INDUCTOR_PDL = False


#: Whether regional compilation compiles the steps' tails that ran eager before: the model's own sampler hook (the
#: greedy variant's argmax, :func:`run_sampler`) and a verification round's head and acceptance
#: (``rounds.round_tail``).  ``FLARE_COMPILE_TAILS=0`` leaves them eager (read at compile; side-by-side runs).  Not
#: measured on a GPU yet: on -- compiled is what every other region of the step already is.
COMPILE_TAILS = True


def _inductor_options() -> dict:
    from torch._inductor import config as inductor_config

    opts = {"emulate_precision_casts": True} if hasattr(inductor_config, "emulate_precision_casts") else {}
    if switch("FLARE_INDUCTOR_PDL", INDUCTOR_PDL):
        if not hasattr(inductor_config.triton, "enable_pdl"):
            raise ValueError(f"FLARE_INDUCTOR_PDL=1: this torch ({torch.__version__}) has no Inductor option "
                             "triton.enable_pdl")
        opts["triton.enable_pdl"] = True
    return opts


def _recompile_limit(n: int):
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            # One recompile per static shape is intended; several models in one process share the
            # per-code-object counter, so the limit must cover all of them.
            return cfg.patch(**{name: max(n, 256, getattr(cfg, name))})
    return contextlib.nullcontext()


def _into(out: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``x`` stored into the step's static output ``out`` inside the region (None: ``x``).  Compiled, the region's
    last fused kernel stores there itself, instead of a copy kernel after it: a captured Qwen3-8B decode step ended
    with two ``memcpy32_post`` copies of its outputs, 1.3 + 1.2 us (run 168's batch-1 trace)."""
    return x if out is None or x is out else out.copy_(x)


def head_logits(model, hidden: torch.Tensor, batch, out: torch.Tensor | None = None) -> torch.Tensor:
    """The model's head: last token, final norm, vocabulary projection (a compile region); into ``out`` if given --
    by the head itself where the model's head takes ``out`` (``head_takes_out``; its launch may store there)."""
    if out is not None and getattr(model, "head_takes_out", False):
        return _into(out, model.head(hidden, batch, out=out))
    return _into(out, model.head(hidden, batch))


def sample_rows(sampling, logits: torch.Tensor, active_rows: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """In-graph sampling of ``logits [rows, V]`` and its state update (a compile region keyed by rows); the tokens
    into ``out`` if given."""
    from ignition.components.sampling import sample_advance

    return _into(out, sample_advance(logits, sampling, active=active_rows, out=out))


def run_sampler(sampler: Callable, logits: torch.Tensor, active: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """The model's own sampler hook on ``logits`` (a compile region keyed by rows, as :func:`sample_rows`).  Eager, the
    greedy hook's two-stage argmax ran as aten reductions and elementwise kernels: Qwen3-8B's greedy variant on the H200
    (``results/20261204T054200Z-sm90-run129``, batch 1) spent 33.6 us of its critical path in its 10 eager kernels
    with the embedding, rotary and metadata (the decode graph: 5.9 us there, its compiled argmax two fused kernels)."""
    return _into(out, sampler(logits, active))


def step_head(model, sampling, hidden: torch.Tensor, batch, active_rows: torch.Tensor,
              logits_fn: Callable = head_logits, sample_fn: Callable = sample_rows, hook_fn: Callable = run_sampler,
              out: tuple[torch.Tensor, torch.Tensor] | None = None):
    """The non-repeated tail of a step -- the model's head (last token, final norm, vocabulary projection)
    then in-graph sampling and its state update (``sampling``), or the model's own sampler hook.
    ``logits_fn``/``sample_fn``/``hook_fn`` are the compiled regions under ``compile(scope="regional")``;
    ``out``: the step's static ``(logits, tokens)``, which the regions write themselves."""
    out_logits, out_tokens = out if out is not None else (None, None)
    logits = logits_fn(model, hidden, batch, out_logits)
    if sampling is None:
        return logits, hook_fn(model.sampler, logits, batch.active, out_tokens)
    return logits, sample_fn(sampling, logits, active_rows, out_tokens)


COMPILE_SCOPES = ("regional", "whole")


class PreparedStep:
    """One static shape: input buffers, output buffers, and the callable that fills the outputs."""

    #: A step kind's own non-repeated tail, compiled as a region of its own under regional compilation and handed to
    #: :meth:`regional_forward` as ``tail_fn`` (None: the step's tail is :func:`step_head` with its regions).
    tail: Callable | None = None

    def __init__(self, shape: StepShape, model, max_pages: int, sampling=None):
        self.shape, self.model, self.max_pages = shape, model, max_pages
        # In-graph sampling state: views of the catalog's shared rows (None: the model's own greedy hook).
        self.sampling = None if sampling is None else sampling.rows(shape.rows)
        dev, b, t = model.device, shape.rows, shape.tokens
        self.inputs = {
            "input_ids": torch.zeros(b, t, dtype=torch.long, device=dev),
            "positions": torch.zeros(b, t, dtype=torch.long, device=dev),
            "slot_mapping": torch.full((b, t), -1, dtype=torch.long, device=dev),
            "block_tables": torch.full((b, max_pages), model.kv_cache.sink_page, dtype=torch.int32, device=dev),
            "seq_lens": torch.zeros(b, dtype=torch.long, device=dev),
            "active_rows": torch.zeros(b, dtype=torch.bool, device=dev),
        }
        self.pad = {"input_ids": 0, "positions": 0, "slot_mapping": -1, "block_tables": model.kv_cache.sink_page,
                    "seq_lens": 0, "active_rows": False}
        self.names = INPUTS
        if getattr(model, "takes_input_embeds", False):
            self.names = INPUTS + (EMBEDS,)
            self.inputs[EMBEDS] = torch.zeros(b, t, model.config.hidden_size, dtype=model.dtype, device=dev)
            self.pad[EMBEDS] = 0
        self.logits = torch.zeros(b, model.vocab_size, dtype=torch.float32, device=dev)
        self.tokens = torch.zeros(b, dtype=torch.long, device=dev)
        self.fn: Callable = self.forward
        self.mode = "eager"
        self.compile_scope: str | None = None  # "regional" | "whole" once compiled
        self.graph = None
        self.example: dict | None = None  # declaration example, alive only until release_examples()

    def forward(self, *inputs, **outputs):
        """The complete step: prepared forward (vocabulary projection included), then sampling and the
        in-graph update of the sampling state (counts, random step) when the catalog samples; ``outputs``: the
        step kind's own (``out=`` here, see :meth:`regional_forward`)."""
        return self.regional_forward(*inputs, **outputs)

    def regional_forward(self, *inputs, layer_fn: Callable | None = None, head_fn: Callable | None = None,
                         batch_fn: Callable | None = None, out: tuple[torch.Tensor, torch.Tensor] | None = None):
        """The step as its regions: the model's body (the attention metadata through ``batch_fn``, each decoder
        layer through ``layer_fn`` when given), then ``head_fn`` (default :func:`step_head`, eager) writing
        ``out`` (the static ``(logits, tokens)``).  Compiled regions are passed in by
        ``PreparedGraphs.compile(scope="regional")``."""
        batch, hidden = self.model.body(*inputs, layer_fn=layer_fn, batch_fn=batch_fn)
        return (head_fn or step_head)(self.model, self.sampling, hidden, batch, inputs[INPUTS.index("active_rows")],
                                      out=out)

    def _body(self):
        logits, tokens = self.fn(*(self.inputs[k] for k in self.names), out=(self.logits, self.tokens))
        # the head and sampler regions wrote the static outputs themselves; a head that handed back other storage
        # (none here) is copied, so the outputs are always the step's
        for buf, x in ((self.logits, logits), (self.tokens, tokens)):
            if x.data_ptr() != buf.data_ptr():
                buf.copy_(x)

    def execute(self) -> None:
        """Run on whatever the static inputs hold (graph replay when captured)."""
        if self.graph is not None:
            self.graph.replay()
        else:
            with torch.no_grad():
                self._body()

    def load(self, **inputs: torch.Tensor) -> tuple[int, int]:
        """Copy a batch of ``b <= rows`` rows and ``t <= tokens`` tokens into the static inputs; pad the rest."""
        missing = [k for k in self.names if k not in inputs]
        if missing:
            raise TypeError(f"{self.shape.name}: missing inputs {missing}")
        b, t = inputs["input_ids"].shape
        p = inputs["block_tables"].shape[1]
        if b > self.shape.rows or t > self.shape.tokens or p > self.max_pages:
            raise ValueError(f"{self.shape.name} (max pages {self.max_pages}) cannot hold a batch of {b} rows x "
                             f"{t} tokens x {p} pages")
        for k in self.names:
            buf, x = self.inputs[k], inputs[k]
            buf.fill_(self.pad[k])
            region = buf[:b, :t] if k in ("input_ids", "positions", "slot_mapping", EMBEDS) else (
                buf[:b, :p] if k == "block_tables" else buf[:b])
            region.copy_(x, non_blocking=True)
        return b, t

    def run(self, **inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Load, execute, and return ``(logits [b, V], tokens [b])`` -- views of the static outputs."""
        b, _ = self.load(**inputs)
        self.execute()
        return self.logits[:b], self.tokens[:b]


@dataclass
class PreparedGraphs:
    catalog: GraphCatalog
    model: object
    steps: list[PreparedStep]
    stage: str = "prepared"
    pool: object = None
    log_lines: list[str] = field(default_factory=list)
    sampling: object = None  # the shared SamplingTensors (None: greedy hook)

    def step(self, kind: str, rows: int = 1, tokens: int = 1) -> PreparedStep:
        """The smallest prepared step of ``kind`` holding ``rows`` rows and ``tokens`` tokens."""
        fits = [s for s in self.steps if s.shape.kind == kind and s.shape.rows >= rows and s.shape.tokens >= tokens]
        if not fits:
            raise KeyError(f"no prepared {kind} step holds {rows} rows x {tokens} tokens "
                           f"(prepared: {[s.shape.name for s in self.steps]})")
        return min(fits, key=lambda s: (s.shape.rows, s.shape.tokens))

    def _note(self, msg: str) -> None:
        self.log_lines.append(msg)
        log.info(msg)

    def tune(self) -> "PreparedGraphs":
        self._expect("prepared", "tune")
        hook = getattr(self.model, "tune", None)
        for s in self.steps:
            s.example = {k: v.clone() for k, v in s.inputs.items()}  # declaration example: all rows inactive
            if hook is not None:
                hook(s)
            s.execute()
        self.release_examples()
        self.stage = "tuned"
        return self

    def release_examples(self) -> None:
        for s in self.steps:
            s.example = None
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def compile(self, scope: str = "regional", **options) -> "PreparedGraphs":
        """Compile every step (``scope``: "regional" or "whole", see the module docstring); ``options`` go to
        ``torch.compile`` (``mode``, ``backend``, ...).  Each shape is one specialization of each compiled
        code object, so the recompile limit covers the number of shapes."""
        if scope not in COMPILE_SCOPES:
            raise ValueError(f"compile scope {scope!r}: expected one of {COMPILE_SCOPES}")
        if self.stage == "prepared":
            self.tune()
        self._expect("tuned", "compile")
        opts = {"fullgraph": True, "dynamic": False, "options": _inductor_options(), **options}
        if scope == "regional":
            # One wrapper per region; Dynamo caches compiled code on the code object, so every layer (and
            # every step) shares the entries: one layer graph and one head graph per shape.
            layer_fn = torch.compile(type(self.model).run_layer, **opts)
            tails_on = switch("FLARE_COMPILE_TAILS", COMPILE_TAILS)
            head_fn = functools.partial(step_head, logits_fn=torch.compile(head_logits, **opts),
                                        sample_fn=torch.compile(sample_rows, **opts),
                                        hook_fn=torch.compile(run_sampler, **opts) if tails_on else run_sampler)
            from ignition.components.attention import batch_tensors

            batch_fn = torch.compile(batch_tensors, **opts)  # a dozen eager integer kernels -> a few fused
            tails: dict = {}  # a step kind's own tail region (a round's head and acceptance), one wrapper per function
        with _recompile_limit(len(self.steps) + 8):
            for s in self.steps:
                if scope == "regional":
                    if s.tail is not None and tails_on and s.tail not in tails:
                        tails[s.tail] = torch.compile(s.tail, **opts)
                    tail = {"tail_fn": tails[s.tail]} if s.tail in tails else {}
                    s.fn = functools.partial(s.regional_forward, layer_fn=layer_fn, head_fn=head_fn, batch_fn=batch_fn,
                                             **tail)
                else:
                    s.fn = torch.compile(s.forward, **opts)
                s.mode, s.compile_scope = "compiled", scope
                t0 = time.perf_counter()
                s.execute()  # compiles this shape now (each shape is one specialization of the forward)
                self._note(f"compiled {s.shape.name} ({scope}) in {time.perf_counter() - t0:.1f} s")
        self.stage = "compiled"
        return self

    def ready(self, compile: bool = True, capture: bool | None = None) -> "PreparedGraphs":
        """The stages a runtime needs, in order: tune, then compile (``compile``), then capture (``capture``;
        default: on a CUDA model).  On CPU the steps stay eager or compiled."""
        self.tune()
        if compile:
            self.compile()
        if self.model.device.type == "cuda" if capture is None else capture:
            self.capture()
        return self

    def capture(self, warmup: int = 2) -> "PreparedGraphs":
        if self.model.device.type != "cuda":
            raise RuntimeError("capture() needs a CUDA model; on CPU the prepared steps run eagerly or compiled")
        if self.stage == "prepared":
            self.tune()
        self.pool = torch.cuda.graph_pool_handle()
        order = sorted(self.steps, key=lambda s: s.shape.rows * s.shape.tokens, reverse=True)
        with torch.no_grad(), _recompile_limit(len(self.steps) + 8):
            for s in order:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(warmup):
                        s._body()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    s._body()
                s.graph, s.mode = graph, f"captured({s.mode})"
                self._note(f"captured {s.shape.name}")
        torch.cuda.synchronize()
        # Compile and warm-up transients go back to the device; the graphs' private pool stays reserved.
        torch.cuda.empty_cache()
        self.stage = "captured"
        return self

    def _expect(self, stage: str, what: str) -> None:
        if self.stage != stage:
            raise RuntimeError(f"{what}() runs on a {stage} catalog, this one is {self.stage}")
