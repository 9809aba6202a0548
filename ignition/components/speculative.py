"""Speculative verification with static shapes: capturable (no host syncs, no data-dependent shapes).

One verification round of ``B`` rows at width ``W`` sees, per row, the pending target token followed by
up to ``W - 1`` proposals (``n_proposals[b]`` of them, ragged), and the target's logits at all ``W``
positions: ``target_logits[b, i]`` are the logits for the token *after* the pending token and the
proposals ``0..i-1``.  :func:`accept` returns ``emitted[B, W]`` (``pad_id`` padded) and ``n_emitted[B]``:
the accepted prefix of the proposals, then one token drawn by the target (the correction at the first
rejection, or the bonus token after all ``n`` proposals were accepted).  ``1 <= n_emitted <= n + 1`` for
active rows; inactive rows emit nothing (``n_emitted = 0``, all ``pad_id``).

**Processing.**  Position ``i`` is processed exactly as :func:`ignition.components.sampling.sample`
would process the same logits at that point of plain decoding: :func:`filter_logits` (penalties,
temperature, min-p, top-k, top-p) with a *conditional* penalty histogram -- the row's ``output_counts``
plus the proposals ``0..i-1`` (the only tokens plain decoding would have emitted before position ``i``
if position ``i`` is reached at all) -- and the row's randomness counter at ``step + i``.  The
conditional histograms are materialized as ``int32[B, W, V]`` (sized from the actual ``(B, W)``).

**Greedy rows** (``temperature < GREEDY_EPS``): proposal ``i`` is accepted while it equals the argmax of
the penalized logits at position ``i``; the emitted token after the accepted prefix is the argmax at that
position.  The emitted sequence therefore equals plain greedy decoding token for token.

**Sampled rows**: speculative rejection sampling (Leviathan et al. 2023, Chen et al. 2023).  With ``p``
the softmax of the filtered target logits at position ``i`` and ``q`` the draft distribution
(``draft_probs[b, i]``; ``None`` means a deterministic proposer, ``q`` one-hot on the proposal),
proposal ``t`` is accepted when ``u < p(t) / q(t)`` (probability ``min(1, p/q)``); at the first
rejection the row emits a draw from ``normalize(max(0, p - q))`` (for a one-hot ``q``: ``p`` with ``t``
removed); after ``n`` acceptances it emits the bonus token drawn from ``p`` at position ``n``.  The
emitted tokens are then distributed exactly as plain sampling from the target (given the draft's
proposals are drawn from ``q`` with randomness independent of the verifier's).

**Randomness**, all from :func:`uniform_noise` (counter-based, per request, independent of the batch):

* acceptance uniform of position ``i``: key ``(seed ^ ACCEPT_STREAM, step + i)``, vocabulary index 0;
* residual draw at position ``i``: Gumbel-max with key ``(seed ^ RESIDUAL_STREAM, step + i)``;
* bonus draw at position ``i``: Gumbel-max with key ``(seed, step + i)`` -- *the plain sampling stream*,
  so a round without proposals (width one, or ``n = 0``) emits bytewise the token :func:`sample` emits;
* drafts (:mod:`ignition.components.drafts`) draw their proposals with key
  ``(seed ^ DRAFT_STREAM, step + i)``, independent of all three above.

After a round the row's step advances by ``n_emitted``, so the next round's keys start beyond every key
whose value influenced the emitted tokens; keys of positions beyond the first rejection were computed
but did not influence anything, so reusing them later keeps the draws independent of the history.

**Penalty state** (:func:`advance_accepted`): plain decoding counts each emitted token once in
``output_counts`` and steps once per token.  After a round, every emitted token (the accepted proposals
*and* the correction/bonus token) is added to ``output_counts`` once, and ``step`` advances by
``n_emitted``; rejected proposals and positions past the first rejection leave no trace.  Calling
:func:`advance` ``n_emitted`` times with the emitted tokens gives the identical state.

Cost: the verification processes ``P = B * W`` target rows (one :func:`filter_logits` over ``[P, V]``,
plus one ``[B, V]`` residual and bonus draw); proposals beyond ``n_proposals`` cost the same as real ones.
"""

from __future__ import annotations

from dataclasses import fields

import torch

from ignition.components.sampling import (GREEDY_EPS, SamplingTensors, argmax_last, filter_logits, gumbel_argmax,
                                          uniform_noise)

__all__ = ["accept", "advance_accepted", "position_params", "full_acceptance_violations", "stream_seed",
           "gumbel_draw", "ACCEPT_STREAM", "RESIDUAL_STREAM", "DRAFT_STREAM"]

#: Stream tags XOR-ed into the row seed (64-bit two's complement values; the plain stream is tag 0).
ACCEPT_STREAM = 0x5EC0_A11C_E000_0001
RESIDUAL_STREAM = 0x5EC0_4E51_D000_0002
DRAFT_STREAM = 0x5EC0_D4AF_7000_0003


def _signed64(x: int) -> int:
    x %= 1 << 64
    return x - (1 << 64) if x >= 1 << 63 else x


def stream_seed(seed: torch.Tensor, tag: int) -> torch.Tensor:
    """The row seeds of stream ``tag`` (``seed ^ tag``; tag 0 is the plain sampling stream)."""
    return seed ^ _signed64(tag) if tag else seed


# ----------------------------------------------------------------------------- per-position parameters

def position_params(params: SamplingTensors, proposals: torch.Tensor, valid: torch.Tensor,
                    width: int) -> SamplingTensors:
    """``SamplingTensors`` for the ``B * width`` flattened positions (row-major: ``b * width + i``).

    Position ``i`` of row ``b`` carries row ``b``'s parameters, ``step + i`` and (with penalty state) the
    conditional histogram ``output_counts[b] + counts(proposals[b, :i] where valid)``.  ``proposals``
    and ``valid`` are ``[B, >= width - 1]``; only their first ``width - 1`` columns are read.
    """
    B = params.capacity
    rep = lambda t: t.repeat_interleave(width, dim=0)  # noqa: E731
    pos = torch.arange(width, device=params.step.device, dtype=torch.int64)
    out = {}
    for f in fields(params):
        value = getattr(params, f.name)
        if f.name == "step":
            out[f.name] = (value[:, None] + pos[None, :]).reshape(B * width)
        elif f.name == "output_counts":
            out[f.name] = None if value is None else _conditional_counts(value, proposals, valid, width)
        elif isinstance(value, torch.Tensor):
            out[f.name] = rep(value)
        else:
            out[f.name] = value
    return SamplingTensors(**out)


def _conditional_counts(counts: torch.Tensor, proposals: torch.Tensor, valid: torch.Tensor,
                        width: int) -> torch.Tensor:
    """``int32[B * width, V]``: ``counts`` plus the valid proposals strictly before each position."""
    B, V = counts.shape
    if width == 1:
        return counts.clone()
    tok = torch.where(valid[:, :width - 1], proposals[:, :width - 1], 0).clamp(0, V - 1).to(torch.int64)
    inc = torch.zeros(B, width - 1, V, dtype=torch.int32, device=counts.device)
    inc.scatter_(2, tok[:, :, None], valid[:, :width - 1, None].to(torch.int32))
    before = torch.nn.functional.pad(torch.cumsum(inc, dim=1, dtype=torch.int32), (0, 0, 1, 0))  # [B, W, V]
    return (counts[:, None, :] + before).reshape(B * width, V)


# ----------------------------------------------------------------------------- rules (small, separately testable)

def _greedy_match(proposals: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    """``bool[B, W-1]``: proposal ``i`` equals the target's argmax at position ``i``."""
    return proposals == greedy[:, :-1]


def _accept_ratio(p_tok: torch.Tensor, q_tok: torch.Tensor) -> torch.Tensor:
    """``p(t) / q(t)`` (acceptance when ``u < ratio``, i.e. with probability ``min(1, p/q)``).

    ``q(t) = 0`` (a proposal the draft could not have drawn) accepts when ``p(t) > 0``."""
    inf = torch.full_like(p_tok, float("inf"))
    return torch.where(q_tok > 0, p_tok / q_tok.clamp_min(torch.finfo(q_tok.dtype).tiny),
                       torch.where(p_tok > 0, inf, torch.zeros_like(p_tok)))


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Unnormalized ``max(0, p - q)`` (Gumbel-max needs no normalization); ``p`` where it is empty
    (only reachable through rounding: a rejection implies ``q(t) > p(t)``, hence positive mass)."""
    r = (p - q).clamp_min(0.0)
    return torch.where(r.sum(dim=-1, keepdim=True) > 0, r, p)


def gumbel_draw(log_weights: torch.Tensor, seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """``argmax(x - log(-log u))``: :func:`sample`'s own draw (``sampling.gumbel_argmax``, here without a cut), so the
    width-one round and decode draw alike -- the traced expression, or ``flare::gumbel_argmax`` under
    ``FLARE_GUMBEL_KERNEL`` for both (bytewise parity)."""
    return gumbel_argmax(log_weights, torch.full_like(log_weights[:, 0], float("-inf")), seed, step)


# ----------------------------------------------------------------------------- acceptance

def accept(target_logits: torch.Tensor, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
           n_proposals: torch.Tensor, params: SamplingTensors, active: torch.Tensor | None = None, *,
           pad_id: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(emitted int64[B, W], n_emitted int64[B])`` for one verification round; pure (writes nothing).

    ``target_logits[B, W, V]``; ``draft_tokens[B, W-1]`` (entries at ``i >= n_proposals[b]`` are
    ignored, any value); ``draft_probs[B, W-1, V]`` or ``None`` (deterministic proposer);
    ``n_proposals[B]`` in ``0..W-1`` (clamped); ``active[B]`` (default ``params.active``).
    See the module docstring for the rules, the random streams and :func:`advance_accepted`.
    """
    B, W, V = target_logits.shape
    device = target_logits.device
    act = params.active if active is None else active
    pos = torch.arange(W, device=device, dtype=torch.int64)
    n = torch.where(act, n_proposals.to(torch.int64).clamp(0, W - 1), 0)
    if W > 1:
        valid = pos[None, :W - 1] < n[:, None]  # [B, W-1]
        tok = torch.where(valid, draft_tokens[:, :W - 1].to(torch.int64), 0).clamp(0, V - 1)
    else:
        valid = torch.zeros(B, 0, dtype=torch.bool, device=device)
        tok = torch.zeros(B, 0, dtype=torch.int64, device=device)

    pp = position_params(params, tok, valid, W)
    penalized, filtered = filter_logits(target_logits.reshape(B * W, V), pp)
    greedy = argmax_last(penalized).view(B, W)
    filtered = filtered.view(B, W, V)
    greedy_row = params.temperature < GREEDY_EPS

    if W > 1:
        p = torch.softmax(filtered[:, :W - 1], dim=-1)  # [B, W-1, V]
        p_tok = p.gather(2, tok[:, :, None])[:, :, 0]
        if draft_probs is None:
            q_tok = torch.ones_like(p_tok)
        else:
            q_tok = draft_probs[:, :W - 1].to(p.dtype).gather(2, tok[:, :, None])[:, :, 0]
        u = uniform_noise(stream_seed(pp.seed, ACCEPT_STREAM), pp.step, 1).view(B, W)[:, :W - 1]
        ok_sampled = u < _accept_ratio(p_tok, q_tok)
        ok = torch.where(greedy_row[:, None], _greedy_match(tok, greedy), ok_sampled) & valid
        n_acc = torch.cumprod(ok.to(torch.int64), dim=1).sum(dim=1)  # leading accepted run
    else:
        n_acc = torch.zeros(B, dtype=torch.int64, device=device)

    # The target's own token at position n_acc: bonus (plain stream) or, below, the residual draw.
    step_a = params.step + n_acc
    f_a = filtered.gather(1, n_acc[:, None, None].expand(B, 1, V))[:, 0]
    drawn = gumbel_draw(f_a, params.seed, step_a)
    if W > 1:
        j = n_acc.clamp(max=W - 2)[:, None, None]
        p_a = p.gather(1, j.expand(B, 1, V))[:, 0]
        if draft_probs is None:
            q_a = torch.nn.functional.one_hot(tok.gather(1, j[:, :, 0])[:, 0], V).to(p_a.dtype)
        else:
            q_a = draft_probs[:, :W - 1].to(p_a.dtype).gather(1, j.expand(B, 1, V))[:, 0]
        resampled = gumbel_draw(torch.log(_residual(p_a, q_a)), stream_seed(params.seed, RESIDUAL_STREAM),
                                   step_a)
        drawn = torch.where(n_acc < n, resampled, drawn)
    last = torch.where(greedy_row, greedy.gather(1, n_acc[:, None])[:, 0], drawn)

    padded = torch.nn.functional.pad(tok, (0, 1), value=pad_id) if W > 1 else \
        torch.full((B, 1), pad_id, dtype=torch.int64, device=device)
    emitted = torch.where(pos[None, :] < n_acc[:, None], padded, pad_id)
    emitted = torch.where(pos[None, :] == n_acc[:, None], last[:, None], emitted)
    emitted = torch.where(act[:, None], emitted, pad_id)
    return emitted, torch.where(act, n_acc + 1, 0)


def advance_accepted(params: SamplingTensors, emitted: torch.Tensor, n_emitted: torch.Tensor,
                     active: torch.Tensor | None = None) -> None:
    """In-graph state update after :func:`accept`: each active row counts its ``n_emitted`` emitted
    tokens once in ``output_counts`` and advances ``step`` by ``n_emitted`` (identical to calling
    :func:`advance` once per emitted token); inactive rows are untouched.  Capturable."""
    act = params.active if active is None else active
    B, W = emitted.shape
    pos = torch.arange(W, device=emitted.device, dtype=torch.int64)
    valid = (pos[None, :] < n_emitted[:, None]) & act[:, None]
    if params.output_counts is not None:
        v = params.output_counts.shape[1]
        params.output_counts.scatter_add_(1, emitted.clamp(0, v - 1).to(torch.int64), valid.to(torch.int32))
    params.step.add_(torch.where(act, n_emitted.to(torch.int64), 0))


def full_acceptance_violations(n_proposals: torch.Tensor, n_emitted: torch.Tensor,
                               active: torch.Tensor) -> torch.Tensor:
    """``bool[B]``: active rows that did not accept every proposal (``n_emitted != n + 1``).  The
    self-drafting probe: under greedy sampling (and, with bitwise-identical target and draft
    probabilities, under sampling too) any ``True`` is a verification bug."""
    return active & (n_emitted.to(torch.int64) != n_proposals.to(torch.int64) + 1)
