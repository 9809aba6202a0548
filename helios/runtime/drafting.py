"""Proposal sources of ``flare run --speculative``, one interface for the scheduler.

Each source proposes up to ``limits[i]`` tokens for every running row from ``heads[i] = (pages, position of the
pending token, pending token)``; ``follow_prefill`` / ``follow_decode`` let a source that keeps its own state
(a draft core's KV pool) see every token the target commits.  ``probe``: every proposal must be accepted (the
self-drafting correctness probe; the scheduler counts the rows that do not).

- :class:`NgramProposer`: prompt lookup over each row's own tokens (``ignition.components.drafts``), any batch.
- :class:`SelfProposer`: the target drafts for itself with its greedy-only decode variant -- plain greedy
  batches only (the variant leaves the sampling state alone); the verification round rewrites the K/V.
- :class:`DraftCoreProposer`: a draft model from its own core (same tokenizer), its own KV pool on the target's
  page ids, kept in step on every prefill chunk and decode step; plain greedy batches only.
"""

from __future__ import annotations

from pathlib import Path

from ignition.graphs.catalog import plain_greedy


class Proposer:
    probe = False
    description = ""

    def propose(self, target, rows, heads, limits) -> list[list[int]]:
        raise NotImplementedError

    def follow_prefill(self, pages, start, tokens, prompt_ids, slot, occupied) -> None:
        pass

    def follow_decode(self, heads) -> None:
        pass


def _greedy_batch(rows) -> bool:
    return all(plain_greedy(r.resolved) for r in rows)


class NgramProposer(Proposer):
    description = "n-gram prompt lookup (n 3..1)"

    def __init__(self, width: int):
        from ignition.components.drafts import PromptLookupDraft

        self.draft = PromptLookupDraft(n=3, k=width - 1, min_n=1)

    def propose(self, target, rows, heads, limits):
        import torch

        hist = [r.prompt_ids + r.generated for r in rows]
        width = max(len(h) for h in hist)
        history = torch.tensor([h + [0] * (width - len(h)) for h in hist])
        tokens, _, n = self.draft.propose(history, torch.tensor([len(h) for h in hist]), None,
                                          active=torch.ones(len(rows), dtype=torch.bool), limit=torch.tensor(limits))
        return [tokens[i, :int(n[i])].tolist() for i in range(len(rows))]


class SelfProposer(Proposer):
    probe = True
    description = "self-drafting (greedy batches; a probe: every proposal must be accepted)"

    def propose(self, target, rows, heads, limits):
        return target.self_draft(heads, limits) if _greedy_batch(rows) else [[] for _ in rows]


class DraftCoreProposer(Proposer):
    def __init__(self, path: Path, driver):
        self.path, self.driver = path, driver
        self.description = f"draft core {path} (greedy batches)"

    @classmethod
    def load(cls, path: str, target_core, device: str, num_pages: int, page_size: int, max_context: int, decode,
             prefill, compile: bool) -> "DraftCoreProposer":
        from ignition.core import CoreFormatError
        from ignition.graphs.catalog import GraphCatalog
        from ignition.preparation import ExportError, load_prepared

        from .engine import EngineStartError, StepDriver

        try:
            model, core = load_prepared(path, device=device)
        except (CoreFormatError, ExportError, OSError, KeyError, ValueError) as e:
            raise EngineStartError(f"--speculative draft:{path}: cannot load the draft core: {e}") from e
        if Path(core.tokenizer_path).read_bytes() != Path(target_core.tokenizer_path).read_bytes():
            raise EngineStartError(f"--speculative draft:{path}: the draft core's tokenizer differs from the "
                                   "target's (a draft must share the tokenizer)")
        model.allocate_kv_cache(num_pages, page_size, max_context)
        graphs = GraphCatalog(decode_capacities=tuple(decode), prefill_chunks=tuple(prefill)).prepare(
            model, greedy_variant=True)
        graphs.ready(compile=compile)
        return cls(Path(path), StepDriver(model, graphs, page_size))

    def propose(self, target, rows, heads, limits):
        if not _greedy_batch(rows):
            return [[] for _ in rows]
        props = self.driver.self_draft(heads, limits, feed_last=True)  # its last proposal's K/V written too
        return [p[:n] for p, n in zip(props, limits)]

    def follow_prefill(self, pages, start, tokens, prompt_ids, slot, occupied) -> None:
        self.driver.prefill(pages, start, tokens, None, prompt_ids, slot, occupied=occupied)

    def follow_decode(self, heads) -> None:
        self.driver.decode(heads, greedy=True)


def make_proposer(spec: str, width: int, **draft_core) -> Proposer:
    """``spec``: ngram | self | draft:CORE (``draft_core``: what :meth:`DraftCoreProposer.load` needs)."""
    if spec == "self":
        return SelfProposer()
    if spec.startswith("draft:"):
        return DraftCoreProposer.load(spec[len("draft:"):], **draft_core)
    return NgramProposer(width)
