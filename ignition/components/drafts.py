"""Draft sources for speculative rounds, one interface, static shapes (capturable: pure tensor ops).

Every draft implements ``propose(history, lengths, params, active=None, limit=None)``:

* ``history int64[B, L]``: each row's own tokens -- prompt, then output, ending with the *pending* token
  (the last emitted token, already counted in ``params.output_counts``, whose target logits the next
  round computes) at ``lengths[b] - 1``.  Entries at ``>= lengths[b]`` are ignored (any value).
* ``params``: the target's :class:`SamplingTensors` (greedy vs sampled rows, seeds, steps, penalties).
* ``active bool[B]`` (default ``params.active``): inactive rows propose nothing.
* ``limit int[B]`` (optional): per-row cap on the proposal count (a graph of width ``W`` verifies at most
  ``W - 1``; a request near its token limit may want fewer).

and returns ``(tokens int64[B, K], probs float32[B, K, V] | None, n int64[B])``: ``K = draft.k``
proposals, ``tokens[b, i] = -1`` for ``i >= n[b]``, and ``probs`` the distributions the proposals were
drawn from (``None``: a deterministic proposer, which :func:`ignition.components.speculative.accept`
treats as one-hot).  All shapes depend only on ``(B, L, K, V)``.

Proposals of position ``i`` are processed as the target processes its position ``i`` (the same
:func:`filter_logits` with the conditional penalty histogram ``output_counts + proposals[:i]``), drawn
by Gumbel-max on the draft stream ``(seed ^ DRAFT_STREAM, step + i)``, which is independent of every
stream the verifier uses -- the precondition for exact rejection sampling.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol

import torch

from ignition.components.sampling import GREEDY_EPS, SamplingTensors, argmax_last, filter_logits
from ignition.components.speculative import DRAFT_STREAM, gumbel_draw, stream_seed

__all__ = ["Draft", "PromptLookupDraft", "ModelDraft", "SelfDraft", "LogitsFn"]

#: ``fn(tokens int64[B, T], lengths int64[B]) -> logits[B, V]``: the logits of the token following
#: ``tokens[b, :lengths[b]]``.  An autoregressive draft calls it ``k`` times on the same ``[B, L + k]``
#: buffer, each call with ``lengths`` one larger for active rows (the previous proposal appended), so a
#: KV-cached core may consume just ``tokens[b, lengths[b] - 1]``; rolling its cache back to the accepted
#: length after verification is the caller's business.
LogitsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Draft(Protocol):
    k: int

    def propose(self, history: torch.Tensor, lengths: torch.Tensor, params: SamplingTensors,
                active: torch.Tensor | None = None, limit: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        ...


def _finish(tokens: torch.Tensor, n: torch.Tensor, active: torch.Tensor, limit: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    n = torch.where(active, n.to(torch.int64), 0)
    if limit is not None:
        n = torch.minimum(n, limit.to(torch.int64).clamp_min(0))
    pos = torch.arange(tokens.shape[1], device=tokens.device, dtype=torch.int64)
    return torch.where(pos[None, :] < n[:, None], tokens, -1), n


class PromptLookupDraft:
    """Prompt lookup (n-gram) over each row's own history, no weights, deterministic (``probs=None``).

    The last ``n`` tokens (ending with the pending token) are searched for among the row's *earlier*
    positions; the most recent earlier occurrence proposes the tokens that followed it, up to ``k`` and
    up to the end of the history.  With ``min_n < n`` the lengths ``n, n-1, ..., min_n`` are tried, the
    longest match winning.  Pure tensor ops with static shapes: an ``[B, L - m + 1, m]`` window
    comparison per length ``m`` (``O(B * L * n)`` per step, on the device, no host work).
    """

    def __init__(self, n: int = 3, k: int = 4, *, min_n: int | None = None):
        if n < 1 or k < 1 or not 1 <= (min_n or n) <= n:
            raise ValueError(f"need n >= 1, k >= 1 and 1 <= min_n <= n, got n={n}, k={k}, min_n={min_n}")
        self.n, self.k, self.min_n = n, k, (min_n or n)

    def _match(self, history: torch.Tensor, lengths: torch.Tensor, m: int) -> torch.Tensor:
        """``int64[B]``: start of the continuation after the most recent earlier ``m``-gram match, -1 if none."""
        B, L = history.shape
        if L < m + 1:
            return torch.full((B,), -1, dtype=torch.int64, device=history.device)
        ar = torch.arange(m, device=history.device, dtype=torch.int64)
        suffix = history.gather(1, (lengths[:, None] - m + ar[None, :]).clamp(0, L - 1))  # [B, m]
        windows = history.unfold(1, m, 1)  # [B, L - m + 1, m], window s covers s .. s + m - 1
        hit = (windows == suffix[:, None, :]).all(dim=-1)
        starts = torch.arange(L - m + 1, device=history.device, dtype=torch.int64)
        hit = hit & (starts[None, :] <= (lengths[:, None] - m - 1))  # match ends before the pending token
        last = torch.where(hit, starts[None, :], -1).amax(dim=1)
        return torch.where(last >= 0, last + m, -1)

    def propose(self, history, lengths, params, active=None, limit=None):
        act = params.active if active is None else active
        B, L = history.shape
        lengths = lengths.to(torch.int64)
        cont = torch.full((B,), -1, dtype=torch.int64, device=history.device)
        for m in range(self.n, self.min_n - 1, -1):  # longest first
            cont = torch.where(cont >= 0, cont, self._match(history, lengths, m))
        idx = (cont[:, None] + torch.arange(self.k, device=history.device, dtype=torch.int64)[None, :])
        tokens = history.gather(1, idx.clamp(0, L - 1)).to(torch.int64)
        n = torch.where(cont >= 0, (lengths - cont).clamp(0, self.k), 0)
        tokens, n = _finish(tokens, n, act, limit)
        return tokens, None, n


class ModelDraft:
    """A draft model (a callable returning logits, see :data:`LogitsFn`) proposing ``k`` tokens
    autoregressively with the target's sampling parameters; returns the distributions it drew from.

    Greedy rows propose the argmax of the penalized draft logits; sampled rows draw from the filtered
    distribution on the draft stream.  ``probs`` are ``softmax`` of the filtered draft logits (for
    greedy rows they are returned but the verifier does not read them).
    """

    def __init__(self, logits_fn: LogitsFn, k: int):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.logits_fn, self.k = logits_fn, k

    def propose(self, history, lengths, params, active=None, limit=None):
        act = params.active if active is None else active
        B, L = history.shape
        lengths = lengths.to(torch.int64)
        buf = torch.nn.functional.pad(history.to(torch.int64), (0, self.k))  # [B, L + k], static
        counts = None if params.output_counts is None else params.output_counts.clone()
        seed = stream_seed(params.seed, DRAFT_STREAM)
        greedy_row = params.temperature < GREEDY_EPS
        tokens, probs = [], []
        for j in range(self.k):
            logits = self.logits_fn(buf, lengths + j * act.to(torch.int64))
            view = dataclasses.replace(params, output_counts=counts, seed=seed, step=params.step + j)
            penalized, filtered = filter_logits(logits, view)
            t = torch.where(greedy_row, argmax_last(penalized), gumbel_draw(filtered, seed, view.step))
            tokens.append(t)
            probs.append(torch.softmax(filtered, dim=-1))
            at = (lengths + j).clamp(max=L + self.k - 1)[:, None]
            buf = buf.scatter(1, at, torch.where(act, t, buf.gather(1, at)[:, 0])[:, None])
            if counts is not None:
                counts.scatter_add_(1, t[:, None], act.to(torch.int32)[:, None])
        tokens_t, n = _finish(torch.stack(tokens, dim=1), torch.full_like(lengths, self.k), act, limit)
        return tokens_t, torch.stack(probs, dim=1), n


class SelfDraft(ModelDraft):
    """The target as its own draft (``logits_fn`` = the target's next-token logits): a correctness
    probe.  Under greedy sampling every proposal must be accepted (and under sampling too, when the
    draft's logits equal the verification logits bitwise, since then ``p = q``);
    :func:`ignition.components.speculative.full_acceptance_violations` reports the rows that were not."""
