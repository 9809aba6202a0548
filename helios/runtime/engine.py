"""Core loading, the KV page pool and the step driver.

``load_engine(core_path, config)`` loads an exported core (nothing from preparation), builds the
frontend from the core's own tokenizer, annotated template and sampling defaults, allocates the paged
KV cache and prepares the core's graph catalog (eager prepared forwards on CPU; captured on CUDA).

``StepDriver`` turns host-side rows into step inputs.  It owns one invariant the catalog imposes:
the in-graph sampling state is shared by every capacity (row ``i`` of each step is the same state),
so a decoding request lives in a fixed *slot* and the active slots are kept compact
(``0 .. n-1``) -- the decode step for ``n`` rows is the smallest capacity ``>= n``.  The prefill
steps hold one row, whose sampling state is slot 0; a prefill therefore parks slot 0's state, runs
with the new request's parameters, and moves the result to the request's slot.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from ignition.components.attention import slot_mapping_for
from ignition.graphs.catalog import DECODE_GREEDY, DECODE_TOPK

log = logging.getLogger("flare.helios")

#: Catalog of the served embedded default core (tiny; decode batching up to 8 rows on CPU).
DEFAULT_CORE_DECODE = (1, 2, 4, 8)
DEFAULT_CORE_PREFILL = (256,)
_DEFAULT_CORE_VERSION = "1"
#: Served context without ``--max-context`` (see ``load_engine``).
DEFAULT_SERVED_CONTEXT = 8192


class EngineStartError(RuntimeError):
    """A core that cannot be served (missing, damaged, incompatible)."""


@dataclass
class EngineConfig:
    kv_tokens: int | None = None  # KV pool size in tokens (None: from free memory on CUDA, a default on CPU)
    max_context: int | None = None  # per-request context (None: min(model positions, kv_tokens))
    device: str | None = None
    queue_timeout_s: float = 30.0  # a request not admitted within this gets 503 + Retry-After
    prefix_cache: bool = True
    gpu_memory_fraction: float = 0.90  # of total device memory, for sizing the KV pool (kv_sizing.py)
    embedding_table_storage: str = "device"  # device | ram | disk (embeddings.py)
    compile: bool = True  # CUDA: torch.compile the prepared steps before capture (``flare run --eager``: no)
    speculative: str | None = None  # "ngram": prompt-lookup proposals verified by round graphs (rounds.py)
    speculative_width: int = 4  # verification width W: the pending token + up to W - 1 proposals
    attention: str | None = None  # attention backend by name (ignition.components.backends); None: the recipe's
    topk_variant: int | None = None  # K: also decode steps sampling with topk(K) for batches whose rows fit it

    def __post_init__(self):
        from .embeddings import STORAGES
        from .kv_sizing import validate_fraction

        if self.kv_tokens is not None and self.kv_tokens < 1:
            raise ValueError(f"--kv-tokens must be positive, got {self.kv_tokens}")
        if self.max_context is not None and self.max_context < 1:
            raise ValueError(f"--max-context must be positive, got {self.max_context}")
        if self.queue_timeout_s <= 0:
            raise ValueError(f"--queue-timeout must be positive, got {self.queue_timeout_s}")
        validate_fraction(self.gpu_memory_fraction)
        if self.speculative not in (None, "ngram", "self") and not str(self.speculative).startswith("draft:"):
            raise ValueError(f"--speculative {self.speculative}: expected ngram (prompt lookup), self (the target "
                             "drafts for itself: a correctness probe) or draft:CORE (a draft model's core)")
        if not 2 <= self.speculative_width <= 8:
            raise ValueError(f"--speculative-width must be 2..8, got {self.speculative_width}")
        if self.topk_variant is not None and self.topk_variant < 1:
            raise ValueError(f"--topk-variant must be positive, got {self.topk_variant}")
        if self.embedding_table_storage not in STORAGES:
            raise ValueError(f"--embedding-table-storage {self.embedding_table_storage!r}: expected one of "
                             f"{', '.join(STORAGES)}")


def cache_root() -> Path:
    base = os.environ.get("FLARE_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "flare") / "cores"


def default_core(progress: bool = False) -> Path:
    """The embedded tiny default exported once into the cache (concurrent builders: first rename wins)."""
    from ignition.checkpoints import embedded_default_checkpoint
    from ignition.preparation import export

    ckpt = embedded_default_checkpoint()
    key = f"{ckpt.name}-d{'.'.join(map(str, DEFAULT_CORE_DECODE))}-p{'.'.join(map(str, DEFAULT_CORE_PREFILL))}" \
          f"-v{_DEFAULT_CORE_VERSION}"
    root = cache_root()
    final = root / key
    if final.is_dir():  # complete: it only ever appears by an atomic rename
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        log.info("exporting the embedded default core to %s (once)", final)
        export(str(ckpt), str(tmp / "core"), decode=DEFAULT_CORE_DECODE, prefill=DEFAULT_CORE_PREFILL,
               device="cpu", compile=False, progress=progress)
        try:
            os.rename(tmp / "core", final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


class PagePool:
    """KV page allocator over pages ``0 .. num_pages-1`` (the sink page is never handed out)."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.num_pages - len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def release(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))


def _copy_row(state, src: int, dst: int) -> None:
    for f in fields(state):
        t = getattr(state, f.name)
        if isinstance(t, torch.Tensor):
            t[dst] = t[src]


def _save_row(state, i: int) -> dict:
    return {f.name: getattr(state, f.name)[i].clone() for f in fields(state)
            if isinstance(getattr(state, f.name), torch.Tensor)}


def _restore_row(state, i: int, saved: dict) -> None:
    for name, value in saved.items():
        getattr(state, name)[i] = value


class StepDriver:
    """Builds step inputs from rows (pages + length) and runs the catalog's prepared steps.  ``embeddings``
    (a :class:`~helios.runtime.embeddings.HostEmbeddings`): each step's embedding rows are gathered on the
    host and passed as ``input_embeds``; ``timer`` (:class:`~helios.runtime.replay_timing.ReplayTimer`)
    brackets each replay for GPU time."""

    def __init__(self, model, graphs, page_size: int, on_replay=None, embeddings=None, timer=None):
        from .replay_timing import ReplayTimer

        self.model, self.graphs, self.page_size = model, graphs, page_size
        self.embeddings = embeddings
        self.timer = timer or ReplayTimer(cuda=False)
        self.replays = 0  # steps run so far (the index of the next replay)
        self.width = graphs.steps[0].max_pages
        self.sink = model.kv_cache.sink_page
        self.decode_caps = sorted(s.shape.rows for s in graphs.steps if s.shape.kind == "decode")
        self.has_greedy_variant = any(s.shape.kind == DECODE_GREEDY for s in graphs.steps)
        #: the bound K of the decode_topk steps (None: not prepared); the scheduler asks whether its rows fit it
        self.topk_bound = next((s.sampling.max_top_k for s in graphs.steps if s.shape.kind == DECODE_TOPK), None)
        self.prefill_chunks = sorted(s.shape.tokens for s in graphs.steps if s.shape.kind == "prefill")
        self.slots = max(self.decode_caps)
        self.on_replay = on_replay or (lambda kind, capacity: None)
        self._tables: dict[int, tuple[list[int], int, torch.Tensor]] = {}

    @staticmethod
    def capacity(shape):
        """A step's capacity label: rows for decode, tokens for prefill, ``"BxW"`` for a verification round."""
        if shape.kind == "round":
            return f"{shape.rows}x{shape.tokens}"
        return shape.rows if shape.kind in ("decode", DECODE_GREEDY, DECODE_TOPK) else shape.tokens

    def replay_keys(self) -> list[tuple[str, int]]:
        return [(s.shape.kind, self.capacity(s.shape)) for s in self.graphs.steps]

    def _run(self, step, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Load ``inputs`` (embedding rows gathered here when the table is on the host), replay, count."""
        kind, capacity = step.shape.kind, self.capacity(step.shape)
        if self.embeddings is not None:
            inputs["input_embeds"] = self.embeddings.gather(inputs["input_ids"])
        self.timer.poll()
        b, _ = step.load(**inputs)
        if self.embeddings is not None:
            self.embeddings.enqueued()
        self.timer.record(step.execute, kind, capacity)
        self.replays += 1
        self.on_replay(kind, capacity)
        return step.logits[:b], step.tokens[:b]

    def _table(self, pages: list[int]) -> torch.Tensor:
        """The block-table row of a request's page list (padded with the sink page), built once per list: a
        request's pages are reserved at admission and replaced, never edited, so the list object (held here, so
        its id is not reused while cached) and its length identify the row.  Building a full-width row per step
        cost ~30 us per running row on the host (``qualify.serve_overhead``); callers only read it."""
        hit = self._tables.get(id(pages))
        if hit is not None and hit[0] is pages and hit[1] == len(pages):
            return hit[2]
        table = torch.tensor(pages + [self.sink] * (self.width - len(pages)), dtype=torch.int32)
        if len(self._tables) >= 4 * self.slots + 64:
            self._tables.clear()
        self._tables[id(pages)] = (pages, len(pages), table)
        return table

    def prefill(self, pages: list[int], start: int, tokens: list[int], resolved: dict | None,
                prompt_ids: list[int], slot: int, occupied: bool) -> int | None:
        """One chunk of ``tokens`` at positions ``start..``.  On the final chunk (``resolved`` given) the
        request's sampling row is admitted, the first token sampled and the row moved to ``slot``;
        ``occupied`` says whether slot 0 belongs to a decoding request (its state is parked)."""
        chunk = next(c for c in self.prefill_chunks if c >= len(tokens))
        state = self.graphs.sampling
        saved = _save_row(state, 0) if occupied else None  # every prefill chunk samples (and advances) row 0
        if resolved is not None:
            state.set_row(0, resolved, prompt_ids)
        bt = self._table(pages)[None]
        pos = torch.arange(start, start + len(tokens))[None]
        valid = torch.ones_like(pos, dtype=torch.bool)
        step = self.graphs.step("prefill", 1, chunk)
        _, out = self._run(step, dict(
            input_ids=torch.tensor([tokens]), positions=pos, slot_mapping=slot_mapping_for(bt, pos, valid, self.page_size),
            block_tables=bt, seq_lens=torch.tensor([start + len(tokens)]), active_rows=torch.tensor([True])))
        token = int(out[0]) if resolved is not None else None
        if resolved is not None and slot != 0:
            _copy_row(state, 0, slot)
        if saved is not None:
            _restore_row(state, 0, saved)
        return token

    def decode(self, rows: list[tuple[list[int], int, int]], greedy: bool = False, bounded: bool = False
               ) -> list[int]:
        """``rows[i] = (pages, position, token)`` for slots ``0..n-1``; returns each row's next token.
        ``greedy``: every row is plain greedy (``catalog.plain_greedy``): the greedy-only variant serves it;
        ``bounded``: every row fits the top-k bound (``catalog.within_top_k``): the decode_topk variant, if
        prepared, serves it."""
        n = len(rows)
        if greedy and self.has_greedy_variant:
            kind = DECODE_GREEDY
        elif bounded and self.topk_bound is not None:
            kind = DECODE_TOPK
        else:
            kind = "decode"
        step = self.graphs.step(kind, n)
        bt = torch.stack([self._table(p) for p, _, _ in rows])
        pos = torch.tensor([[p] for _, p, _ in rows])
        valid = torch.ones_like(pos, dtype=torch.bool)
        _, out = self._run(step, dict(
            input_ids=torch.tensor([[t] for _, _, t in rows]), positions=pos,
            slot_mapping=slot_mapping_for(bt, pos, valid, self.page_size), block_tables=bt, seq_lens=pos[:, 0] + 1,
            active_rows=torch.ones(n, dtype=torch.bool)))
        return [int(t) for t in out.tolist()]

    def self_draft(self, rows: list[tuple[list[int], int, int]], k: list[int], feed_last: bool = False
                   ) -> list[list[int]]:
        """Up to ``k[i]`` greedy tokens per row from this driver's model by its greedy-only decode variant (it
        leaves the sampling state alone), each row continuing from ``(pages, position, pending token)``.  For the
        target itself the verification round rewrites these K/V; a draft core passes ``feed_last`` so that its
        last proposal's K/V is written too (needed when every proposal is accepted)."""
        props = [[] for _ in rows]
        for j in range(max(k, default=0) + (1 if feed_last and any(k) else 0)):
            live = [i for i in range(len(rows)) if len(props[i]) < k[i]]
            # every row steps (one static batch); a row past its k re-writes a position the verification round
            # rewrites anyway (pos + its last proposal index), never beyond its own drafted range
            last = [k[i] if feed_last else max(k[i] - 1, 0) for i in range(len(rows))]
            step_rows = [(p, pos + min(j, last[i]), (props[i][-1] if props[i] else t))
                         for i, (p, pos, t) in enumerate(rows)]
            toks = self.decode(step_rows, greedy=True)
            for i in live:
                props[i].append(toks[i])
        return props

    def verify(self, rows: list[tuple[list[int], int, int, list[int]]], width: int) -> list[list[int]]:
        """One verification round: ``rows[i] = (pages, position, pending token, proposals)`` for slots
        ``0..n-1``; returns each row's emitted tokens (accepted proposals, then the target's own token)."""
        n = len(rows)
        step = self.graphs.step("round", n, width)
        bt = torch.stack([self._table(p) for p, _, _, _ in rows])
        ids = torch.zeros(n, width, dtype=torch.long)
        pos = torch.zeros(n, width, dtype=torch.long)
        valid = torch.zeros(n, width, dtype=torch.bool)
        drafts = torch.zeros(n, width - 1, dtype=torch.long)
        for i, (_, p, t, props) in enumerate(rows):
            k = len(props)
            ids[i, :k + 1] = torch.tensor([t, *props])
            pos[i, :k + 1] = torch.arange(p, p + k + 1)
            valid[i, :k + 1] = True
            if k:
                drafts[i, :k] = torch.tensor(props)
        n_props = torch.tensor([len(r[3]) for r in rows])
        step.load_drafts(drafts, n_props)
        self._run(step, dict(input_ids=ids, positions=pos, slot_mapping=slot_mapping_for(bt, pos, valid, self.page_size),
                             block_tables=bt, seq_lens=pos[:, 0] + 1 + n_props, active_rows=torch.ones(n, dtype=torch.bool)))
        emitted, counts = step.emitted[:n].tolist(), step.n_emitted[:n].tolist()
        return [e[:c] for e, c in zip(emitted, counts)]

    def clear(self, slot: int) -> None:
        self.graphs.sampling.clear_row(slot)

    def move(self, src: int, dst: int) -> None:
        _copy_row(self.graphs.sampling, src, dst)
        self.graphs.sampling.clear_row(src)


@dataclass
class LoadedEngine:
    core_path: Path
    model_name: str
    frontend: object
    tokenizer: object
    driver: StepDriver
    pool: PagePool
    page_size: int
    max_context: int
    eos_token_ids: set[int]
    description: list[str]
    vocab_size: int = 0  # token IDs a prompt may hold (0 .. vocab_size-1)
    tool_call_format: str | None = None  # the recipe's (helios/frontend/tool_calls.py); None: replies stay text
    draft: object = None  # the proposal source of speculative rounds (drafting.Proposer; None: plain decode)
    speculative_width: int = 0


def load_engine(core_path: str | os.PathLike, config: EngineConfig, on_replay=None, on_gpu_ns=None) -> LoadedEngine:
    """``on_replay(kind, capacity)`` after each step; ``on_gpu_ns(kind, capacity, ns)`` with each step's GPU
    time once its CUDA events completed (CUDA only; never called on CPU)."""
    from helios.frontend.frontend import Frontend
    from helios.frontend.tokens import PromptTokenizer
    from ignition.core import CoreFormatError
    from ignition.components.backends import BackendUnavailable
    from ignition.preparation import ExportError, load_prepared

    path = Path(core_path)
    if not path.is_dir():
        raise EngineStartError(f"{core_path}: no such core folder (export one with `ignition export`)")
    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    storage = config.embedding_table_storage
    try:
        model, core = load_prepared(str(path), device=device, host_embedding=storage != "device",
                                    attention_backend=config.attention)
    except BackendUnavailable as e:
        raise EngineStartError(f"--attention {config.attention}: {e}") from e
    except (CoreFormatError, ExportError, OSError, KeyError, ValueError) as e:
        raise EngineStartError(f"{core_path}: cannot serve this core: {e}") from e
    m = core.manifest
    page_size = m.kv_layout.page_size or 16
    decode, prefill = list(m.graph_catalog.decode_capacities), list(m.graph_catalog.prefill_chunk_sizes)
    if not decode or not prefill:
        raise EngineStartError(f"{core_path}: the core's graph catalog needs decode and prefill steps "
                               f"(decode {decode}, prefill {prefill})")
    positions = m.geometry.max_position_embeddings
    # Without --max-context the served context is capped at DEFAULT_SERVED_CONTEXT: the graphs' attention reads
    # every row's full block-table width (the reference attention has no per-row length bound yet), so a
    # 40,960-token width makes each decode step ~40x slower than the 1,024-token case (measured on the H200:
    # 176 ms per batch-4 step of Qwen3-0.6B). Longer contexts are served when asked for explicitly.
    context = min(config.max_context or min(positions, DEFAULT_SERVED_CONTEXT), positions)
    if config.max_context is None and positions > DEFAULT_SERVED_CONTEXT:
        log.warning("max context %d of %d positions (default cap: decode attention reads the full width; "
                    "--max-context N serves longer contexts at that cost)", context, positions)
    if config.kv_tokens:
        kv_tokens, why = config.kv_tokens, "--kv-tokens"
    elif cuda:
        kv_tokens, why = _kv_tokens_from_memory(m.geometry, config, device, page_size, decode, prefill, context)
    else:
        kv_tokens = max(decode) * min(positions, 4096)
        why = "CPU default: largest decode capacity x min(context, 4096)"
    max_context = min(context, kv_tokens)
    num_pages = math.ceil(kv_tokens / page_size)
    model.allocate_kv_cache(num_pages, page_size, max_context)
    embeddings, embedding_line = None, "token embeddings on the device"
    if storage != "device":
        from .embeddings import host_embeddings

        embeddings, embedding_line = host_embeddings(core, model, storage, max(max(decode), max(prefill)), device)
    from ignition.graphs.catalog import GraphCatalog

    catalog = GraphCatalog(decode_capacities=tuple(decode), prefill_chunks=tuple(prefill))
    graphs = catalog.prepare(model, greedy_variant=True, topk_variant=config.topk_variant)
    draft = None
    if config.speculative:
        from ignition.graphs.rounds import prepare_rounds

        from .drafting import make_proposer

        prepare_rounds(graphs, decode, (config.speculative_width,))
        draft = make_proposer(config.speculative, config.speculative_width, target_core=core, device=device,
                              num_pages=num_pages, page_size=page_size, max_context=max_context, decode=decode,
                              prefill=prefill, compile=cuda and config.compile)
    graphs.ready(compile=cuda and config.compile)
    tokenizer = PromptTokenizer.from_file(core.tokenizer_path)
    frontend = Frontend(core.template_text(), tokenizer, core.special_token_variables, core.frontend_spec(),
                        core.sampling_defaults())
    name = m.source.repo_id or path.name
    desc = [f"core {path} (recipe {m.recipe.name}, model {name})",
            f"device {device}; steps {[s.shape.name for s in graphs.steps]} ({graphs.stage})",
            f"KV pool {num_pages} pages x {page_size} tokens ({why}); max context {max_context}",
            embedding_line]
    if draft is not None:
        desc.append(f"speculative: {draft.description}, verification width {config.speculative_width}")

    from .replay_timing import ReplayTimer

    driver = StepDriver(model, graphs, page_size, on_replay, embeddings, ReplayTimer(cuda, on_gpu_ns))
    return LoadedEngine(path, name, frontend, tokenizer, driver, PagePool(num_pages), page_size, max_context,
                        set(core.eos_token_ids), desc, int(m.geometry.vocab_size),
                        _tool_call_format(m.recipe.name), draft, config.speculative_width if draft else 0)


def _kv_tokens_from_memory(geometry, config: EngineConfig, device: str, page_size: int, decode, prefill,
                           context: int) -> tuple[int, str]:
    """KV tokens from free device memory after the weights are loaded (``kv_sizing.py``)."""
    from .kv_sizing import Geometry, graph_reserve_bytes, kv_plan_from_memory

    g = Geometry.from_manifest(geometry)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # load transients are free memory
    free, total = torch.cuda.mem_get_info(device)
    steps = [(c, 1) for c in decode] + [(1, t) for t in prefill]
    try:
        plan = kv_plan_from_memory(free=free, total=total, fraction=config.gpu_memory_fraction,
                                   reserve=graph_reserve_bytes(g, steps, context),
                                   bytes_per_page=g.bytes_per_page(page_size), page_size=page_size, min_tokens=context)
    except ValueError as e:
        raise EngineStartError(str(e)) from None
    return plan.tokens, f"{plan.pages} pages from free memory: {plan.reason}"


def _tool_call_format(recipe_name: str) -> str | None:
    """The recipe's tool-call format, by the core's recipe name (the core does not carry it yet)."""
    from ignition.recipes.registry import load_recipe

    try:
        return load_recipe(recipe_name).tool_call_format
    except (KeyError, ValueError):
        log.warning("recipe %r is not registered here: replies carry no parsed tool calls", recipe_name)
        return None
