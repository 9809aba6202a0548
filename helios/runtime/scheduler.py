"""The engine loop: one thread, continuous batching, chunked prefill, admission by KV pages.

Each iteration (1) drops cancelled requests and fails requests that waited longer than the queue
timeout (503), (2) admits waiting requests in arrival order while a slot and their KV pages are free
(pages for ``prompt + max_tokens`` are reserved at admission, so a running request never stalls),
(3) runs one prefill chunk of the oldest admitted request, and (4) runs one decode step over every
decoding row at the smallest decode capacity holding them.  Finished rows free their pages and slot
at once; the last slot moves into the freed one so the active slots stay compact.

Results go back to the HTTP side as events on each request's asyncio queue:
``("delta", text)``, ``("done", finish_reason, stop_sequence)``, ``("error", status, message)``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ignition.graphs.catalog import plain_greedy, within_top_k

from .detokenize import IncrementalText

log = logging.getLogger("flare.helios")
_ids = itertools.count()


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    resolved: dict
    max_tokens: int
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    id: int = field(default_factory=lambda: next(_ids))
    pages: list[int] = field(default_factory=list)
    prefilled: int = 0
    generated: list[int] = field(default_factory=list)
    detok: IncrementalText | None = None  # the text tokens (generated, end of sequence excluded), decoded incrementally
    sent: int = 0  # characters of text already sent
    searched: int = 0  # characters of text already searched for stop strings (none found there)
    finish_reason: str | None = None
    stop_sequence: str | None = None
    cancelled: bool = False
    arrived: float = field(default_factory=time.monotonic)
    last_token_at: float | None = None
    cache_points: list[int] = field(default_factory=list)  # token endpoints the prefix cache may keep
    cached_tokens: int = 0  # prompt tokens consumed from the prefix cache
    cached_nodes: list = field(default_factory=list)

    def post(self, *event) -> None:
        """Queue ``event`` for the request's asyncio side.  Inside an engine-loop iteration the events are
        collected and handed over once per event loop at the iteration's end (:func:`_deliver`: one wake-up
        instead of one per row and token); from any other thread, at once."""
        outbox = getattr(_OUTBOX, "events", None)
        if outbox is not None:
            outbox.append((self.loop, self.queue, event))
        else:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


_OUTBOX = threading.local()  # the engine thread's events of the current iteration (Request.post)


def _put_all(items) -> None:
    for queue, event in items:
        queue.put_nowait(event)


def _deliver(events) -> None:
    """Hand the iteration's events to their event loops, in order, one ``call_soon_threadsafe`` per loop."""
    by_loop: dict = {}
    for loop, queue, event in events:
        by_loop.setdefault(loop, []).append((queue, event))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:  # the loop is closed: its requests are gone
            pass


class Scheduler:
    def __init__(self, engine, queue_timeout_s: float, metrics=None, prefix_cache: bool = True):
        from .prefix_cache import PrefixCache

        self.engine, self.driver, self.pool = engine, engine.driver, engine.pool
        self.cache = PrefixCache(engine.page_size) if prefix_cache else None
        self.queue_timeout_s = queue_timeout_s
        self.metrics = metrics
        self.cond = threading.Condition()
        self.waiting: deque[Request] = deque()
        self.prefilling: deque[Request] = deque()
        self.running: list[Request] = []  # index == sampling slot
        self._stop = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        # on_iteration(prefilled, decode_rows, wall_s): one busy loop iteration (measurement tools)
        self.on_iteration = None

    # -- thread-safe API ---------------------------------------------------------------------------
    def pages_for(self, prompt_len: int, max_tokens: int) -> int:
        return math.ceil(min(prompt_len + max_tokens, self.engine.max_context) / self.engine.page_size)

    def submit(self, req: Request) -> None:
        with self.cond:
            self.waiting.append(req)
            self.cond.notify()

    def cancel(self, req: Request) -> None:
        with self.cond:
            req.cancelled = True
            self.cond.notify()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="flare-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self.cond:
            self._stop = True
            self.cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- the loop ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self._stop and not (self.waiting or self.prefilling or self.running):
                        self.cond.wait()
                    if self._stop:
                        break
                    t0 = time.perf_counter()
                    _OUTBOX.events = []
                    self._reap()
                    self._admit()
                prefilled = bool(self.prefilling)
                if prefilled:
                    self._prefill_chunk()
                rows = len(self.running)
                if rows:
                    self._decode()
                self._gauges()
                events, _OUTBOX.events = _OUTBOX.events, None
                _deliver(events)
                if self.on_iteration is not None:
                    self.on_iteration(prefilled, rows, time.perf_counter() - t0)
        except BaseException as e:  # a broken engine fails every request instead of hanging them
            events, _OUTBOX.events = getattr(_OUTBOX, "events", None) or [], None
            _deliver(events)  # what the iteration produced before the failure, then the errors
            log.exception("engine loop failed")
            self.error = e
            with self.cond:
                for r in list(self.waiting) + list(self.prefilling) + self.running:
                    r.post("error", 500, f"engine failure: {e}")
                self.waiting.clear(), self.prefilling.clear(), self.running.clear()

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self.waiting))
            self.metrics.running.set(len(self.running) + len(self.prefilling))
            self.metrics.kv_pages_used.set(self.pool.used)
            self.metrics.kv_pages_free.set(self.pool.free)
            self.metrics.kv_pages_cached.set(self.cache.pages if self.cache else 0)

    def _reap(self) -> None:
        now = time.monotonic()
        for r in [r for r in self.waiting if r.cancelled or now - r.arrived > self.queue_timeout_s]:
            self.waiting.remove(r)
            if not r.cancelled:
                r.post("error", 503, f"the KV cache is full: not admitted within {self.queue_timeout_s:g} s; "
                                     "retry later")
        for r in [r for r in self.prefilling if r.cancelled]:
            self.prefilling.remove(r)
            self._free(r)
        for slot in sorted((i for i, r in enumerate(self.running) if r.cancelled), reverse=True):
            self._retire(slot)

    def _admit(self) -> None:
        while self.waiting and len(self.running) + len(self.prefilling) < self.driver.slots:
            r = self.waiting[0]
            nodes = self.cache.match(r.prompt_ids) if self.cache else []
            pages = self._allocate(self.pages_for(len(r.prompt_ids), r.max_tokens) - len(nodes))
            if pages is None:
                if self.cache:
                    self.cache.release(nodes)
                break  # arrival order: the head waits for pages (or its timeout)
            self.waiting.popleft()
            r.cached_nodes, r.pages = nodes, [n.page for n in nodes] + pages
            r.prefilled = r.cached_tokens = len(nodes) * self.engine.page_size
            if self.metrics is not None:
                self.metrics.cached_tokens.inc(r.cached_tokens)
            self.prefilling.append(r)

    def _allocate(self, n: int) -> list[int] | None:
        pages = self.pool.allocate(n)
        if pages is None and self.cache is not None and n <= self.pool.free + self.cache.pages:
            self.pool.release(self.cache.evict(n - self.pool.free))
            pages = self.pool.allocate(n)
        return pages

    def _free(self, r: Request) -> None:
        """Give a request's pages back: its complete prompt pages up to its last recorded endpoint go to
        the prefix cache (those it matched stay there), the rest to the pool."""
        own = range(len(r.cached_nodes), len(r.pages))
        adopted: set[int] = set()
        if self.cache is not None:
            cut = max((p for p in r.cache_points if p <= len(r.prompt_ids)), default=0)
            if r.prefilled >= len(r.prompt_ids) and cut:
                adopted = self.cache.insert(r.prompt_ids, cut, r.pages)
            self.cache.release(r.cached_nodes)
        self.pool.release([r.pages[i] for i in own if i not in adopted])
        r.pages, r.cached_nodes = [], []

    def _prefill_chunk(self) -> None:
        r = self.prefilling[0]
        size = max(self.driver.prefill_chunks)
        part = r.prompt_ids[r.prefilled:r.prefilled + size]
        final = r.prefilled + len(part) == len(r.prompt_ids)
        slot = len(self.running)
        token = self.driver.prefill(r.pages, r.prefilled, part, r.resolved if final else None, r.prompt_ids,
                                    slot, occupied=slot > 0)
        if self.engine.draft is not None:  # a source with its own state (a draft core) sees the chunk too
            self.engine.draft.follow_prefill(r.pages, r.prefilled, part, r.prompt_ids, slot, slot > 0)
        r.prefilled += len(part)
        if final:
            self.prefilling.popleft()
            self.running.append(r)
            if self.metrics is not None:
                self.metrics.ttft.observe(time.monotonic() - r.arrived)
            self._accept(r, token)
            if r.finish_reason is not None:
                self._retire(slot)

    def _heads(self) -> list[tuple[list[int], int, int]]:
        """``(pages, position of the pending token, pending token)`` per running row."""
        return [(r.pages, len(r.prompt_ids) + len(r.generated) - 1, r.generated[-1]) for r in self.running]

    def _proposals(self, heads) -> list[list[int]]:
        """The speculative source's proposals per running row: at most ``W - 1``, never past ``max_tokens``."""
        width = self.engine.speculative_width
        limits = [max(min(r.max_tokens - len(r.generated) - 1, width - 1), 0) for r in self.running]
        return self.engine.draft.propose(self.driver, self.running, heads, limits)

    def _decode(self) -> None:
        draft, heads = self.engine.draft, self._heads()
        proposals = self._proposals(heads) if draft is not None else []
        if any(proposals):
            emitted = self.driver.verify([(*h, p) for h, p in zip(heads, proposals)], self.engine.speculative_width)
            if self.metrics is not None:
                self.metrics.speculative(proposals, emitted)
            if draft.probe:
                short = [(r.id, len(e) - 1, len(p)) for r, e, p in zip(self.running, emitted, proposals)
                         if len(e) - 1 < len(p)]
                if short:  # the probe: a greedy target must accept its own greedy proposals
                    log.warning("self-draft probe: rows accepted fewer of their own greedy proposals than "
                                "drafted (request id, accepted, drafted): %s", short)
                    if self.metrics is not None:
                        self.metrics.self_probe_misses.inc(len(short))
            for r, toks in zip(self.running, emitted):
                for t in toks:
                    if r.finish_reason is None:
                        self._accept(r, t)
        else:
            bound = getattr(self.driver, "topk_bound", None)
            tokens = self.driver.decode(heads, greedy=all(plain_greedy(r.resolved) for r in self.running),
                                        bounded=all(within_top_k(r.resolved, bound) for r in self.running))
            if draft is not None:  # a source with its own state writes the committed token's K/V too
                draft.follow_decode(heads)
            for r, t in zip(self.running, tokens):
                self._accept(r, t)
        for slot in sorted((i for i, r in enumerate(self.running) if r.finish_reason is not None), reverse=True):
            self._retire(slot)

    def _retire(self, slot: int) -> None:
        r = self.running[slot]
        last = len(self.running) - 1
        if slot != last:
            self.driver.move(last, slot)
            self.running[slot] = self.running[last]
        else:
            self.driver.clear(slot)
        self.running.pop()
        self._free(r)

    # -- tokens -> text ----------------------------------------------------------------------------
    def _accept(self, r: Request, token: int) -> None:
        now = time.monotonic()
        if r.last_token_at is not None and self.metrics is not None:
            self.metrics.itl.observe(now - r.last_token_at)
        r.last_token_at = now
        r.generated.append(token)
        if token in self.engine.eos_token_ids:
            self._flush(r, final=True)
            return self._finish(r, "stop")
        if r.detok is None:
            r.detok = IncrementalText(self.engine.tokenizer.decode)
        r.detok.append(token)
        self._flush(r, final=False)
        if r.finish_reason is None and len(r.generated) >= r.max_tokens:
            self._flush(r, final=True)
            self._finish(r, "length")

    def _flush(self, r: Request, final: bool) -> None:
        if r.finish_reason is not None:
            return
        if r.detok is None:
            text = ""
        else:  # complete characters only while streaming (an incomplete UTF-8 tail waits for the next token)
            text = r.detok.full() if final else r.detok.text
        first = None  # (index, stop) of the earliest stop string; text before r.searched held none
        for s in r.stop:
            i = text.find(s, max(0, r.searched - len(s) + 1))
            if i >= 0 and (first is None or i < first[0]):
                first = (i, s)
        r.searched = len(text)
        if first is not None:
            r.stop_sequence = first[1]
            text = text[:first[0]]
            if len(text) > r.sent:
                r.post("delta", text[r.sent:])
            r.sent = len(text)
            return self._finish(r, "stop")
        end = len(text)
        if not final:
            hold = max((k for s in r.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
            end -= hold
        if end > r.sent:
            r.post("delta", text[r.sent:end])
            r.sent = end

    def _finish(self, r: Request, reason: str) -> None:
        r.finish_reason = reason
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(len(r.prompt_ids))
            self.metrics.completion_tokens.inc(len(r.generated))
        r.post("done", reason, r.stop_sequence)
