"""Speculative verification rounds as prepared steps of the graph catalog (issue 7, the target side).

A round of ``B`` rows at width ``W`` is one static-shape step: each row feeds its pending token followed by
up to ``W - 1`` proposals (``n_proposals[b]``, ragged) at positions ``L .. L + n`` (``L`` = the row's committed
length), the target forward writes their K/V and produces logits at every position, and in the same step
:func:`ignition.components.speculative.accept` decides the emitted tokens and
:func:`~ignition.components.speculative.advance_accepted` updates the shared in-graph sampling state.
Physical target rows ``P = B x W``; every buffer is sized from the actual ``(B, W)``.

**Commit.**  K/V of the pending token and of every proposal is written, but only the pending token and the
accepted proposals become visible: the caller advances the row's committed length by ``n_emitted``
(pending + accepted), and attention never reads at or beyond a row's length (``seq_lens``).  The first
rejected position is exactly the next round's first write, so a rejected token's K/V is overwritten before
any step could read it -- the conformance test poisons those slots between rounds to prove it.  The last
emitted token (correction or bonus) is the new pending token: its K/V is written by the next round.

**Width one** is decode: the pending token only, the same body (decode attention, direct cache update), the
decode head (last-token gather) and :func:`accept` with no proposal, which emits bytewise what
:func:`~ignition.components.sampling.sample` emits and advances the state as
:func:`~ignition.components.sampling.advance` does -- no prefill path, no staging, no rollback.

Deterministic proposers (n-gram lookup, self-drafting) pass no draft probabilities; a draft model's
probabilities go in ``draft_probs`` (``with_draft_probs=True``: a ``[B, W-1, V]`` static input).
"""

from __future__ import annotations

import torch

from ignition.graphs.catalog import INPUTS, PreparedStep, StepShape, head_logits

ROUND = "round"
DRAFT_INPUTS = ("draft_tokens", "n_proposals")


def round_tail(model, sampling, hidden: torch.Tensor, batch, active: torch.Tensor, width: int,
               draft_tokens: torch.Tensor, n_proposals: torch.Tensor, draft_probs: torch.Tensor | None):
    """A round after its layers: the head (the last-token head at width one, as decode; every position otherwise),
    :func:`~ignition.components.speculative.accept` and the sampling state's update -> ``(logits [B, W, V], emitted
    [B, W], n_emitted [B])``.  One compile region per ``(rows, width)`` under regional compilation (the round's
    ``tail``).  Eager, Qwen3-8B's width-one round at batch 1 ran it as 235 kernels, 737 us of its critical path on the
    H200, against 315 us of compiled head and sampler in the decode graph: the round's step 4.448 ms, decode's 4.062
    (``results/20261205T020913Z-sm90-run168``)."""
    from ignition.components.speculative import accept, advance_accepted

    if width == 1:  # decode: the last-token head, nothing else
        logits = head_logits(model, hidden, batch)[:, None]
    else:
        logits = model.head_all(hidden, batch)
    emitted, n_emitted = accept(logits, draft_tokens, draft_probs, n_proposals, sampling, active)
    advance_accepted(sampling, emitted, n_emitted, active)
    return logits, emitted, n_emitted


class RoundStep(PreparedStep):
    """One ``(rows, width)`` verification round; static inputs are the step's plus the draft inputs."""

    def __init__(self, rows: int, width: int, model, max_pages: int, sampling, with_draft_probs: bool = False):
        if sampling is None:
            raise ValueError("speculative rounds sample in-graph: prepare the catalog with sampling=True")
        if width < 1:
            raise ValueError(f"round width must be >= 1, got {width}")
        super().__init__(StepShape(ROUND, rows, width), model, max_pages, sampling)
        dev, v = model.device, model.vocab_size
        self.width = width
        self.draft = {"draft_tokens": torch.zeros(rows, max(width - 1, 0), dtype=torch.long, device=dev),
                      "n_proposals": torch.zeros(rows, dtype=torch.long, device=dev)}
        if with_draft_probs and width > 1:
            self.draft["draft_probs"] = torch.zeros(rows, width - 1, v, dtype=torch.float32, device=dev)
        self.logits = torch.zeros(rows, width, v, dtype=torch.float32, device=dev)
        self.emitted = torch.full((rows, width), -1, dtype=torch.long, device=dev)
        self.n_emitted = torch.zeros(rows, dtype=torch.long, device=dev)

    #: The round's non-repeated tail: a compile region of its own under regional compilation (``catalog.compile``).
    tail = staticmethod(round_tail)

    def regional_forward(self, *inputs, layer_fn=None, head_fn=None, batch_fn=None, tail_fn=None):
        step_inputs, extra = inputs[:len(self.names)], inputs[len(self.names):]
        draft_tokens, n_proposals = extra[0], extra[1]
        draft_probs = extra[2] if len(extra) > 2 else None
        active = step_inputs[INPUTS.index("active_rows")]
        batch, hidden = self.model.body(*step_inputs, layer_fn=layer_fn, batch_fn=batch_fn)
        return (tail_fn or round_tail)(self.model, self.sampling, hidden, batch, active, self.width, draft_tokens,
                                       n_proposals, draft_probs)

    def _body(self):
        logits, emitted, n_emitted = self.fn(*(self.inputs[k] for k in self.names), *self.draft.values())
        self.logits.copy_(logits)
        self.emitted.copy_(emitted)
        self.n_emitted.copy_(n_emitted)

    def load_drafts(self, draft_tokens: torch.Tensor | None = None, n_proposals: torch.Tensor | None = None,
                    draft_probs: torch.Tensor | None = None) -> None:
        """Copy the draft inputs of ``b <= rows`` rows into the static draft buffers (the rest: no proposal)."""
        w1 = self.width - 1
        if draft_probs is not None and "draft_probs" not in self.draft:
            raise ValueError(f"{self.shape.name} was prepared without draft probabilities")
        for name, x in (("draft_tokens", draft_tokens), ("n_proposals", n_proposals), ("draft_probs", draft_probs)):
            if name not in self.draft:
                continue
            buf = self.draft[name]
            buf.zero_()
            if x is None:
                continue
            if name == "n_proposals" and x.numel() and int(x.max()) > w1:
                raise ValueError(f"{self.shape.name}: n_proposals must be <= {w1}")
            (buf[:x.shape[0]] if name == "n_proposals" else buf[:x.shape[0], :x.shape[1]]).copy_(x)

    def run(self, draft_tokens: torch.Tensor | None = None, n_proposals: torch.Tensor | None = None,
            draft_probs: torch.Tensor | None = None, **inputs: torch.Tensor):
        """Load a round of ``b <= rows`` rows (``input_ids [b, t]``: pending token then the proposals,
        ``t <= width``), execute, return views ``(logits [b, W, V], emitted [b, W], n_emitted [b])``."""
        b, _ = self.load(**inputs)
        self.load_drafts(draft_tokens, n_proposals, draft_probs)
        self.execute()
        return self.logits[:b], self.emitted[:b], self.n_emitted[:b]


def prepare_rounds(graphs, capacities, widths, with_draft_probs: bool = False) -> list[RoundStep]:
    """Round steps for every ``(capacity, width)``, sharing the catalog's model, KV pool and sampling state;
    appended to ``graphs.steps`` so that compile and capture treat them like every other step."""
    if graphs.stage != "prepared":
        raise RuntimeError("prepare rounds before tune/compile/capture")
    max_pages = graphs.steps[0].max_pages
    rounds = [RoundStep(c, w, graphs.model, max_pages, graphs.sampling, with_draft_probs)
              for c in capacities for w in widths]
    graphs.steps.extend(rounds)
    return rounds
