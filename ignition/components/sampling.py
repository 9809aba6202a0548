"""In-graph sampling with static shapes: capturable (no host syncs, no data-dependent shapes).

``sample(logits[B, V], params) -> tokens[B]`` works row by row with per-row parameters held in
:class:`SamplingTensors` (caller-owned, fixed addresses, so a captured graph reads whatever the runtime
wrote into them before replay).  Order, as vLLM's v1 sampler applies it:

1. **penalties** (vLLM ``apply_penalties`` semantics; transformers' repetition processor agrees):
   repetition -- for tokens in the prompt *or* the output so far, ``x / r`` where ``x > 0`` else ``x * r``;
   then frequency and presence over *output* tokens only (OpenAI semantics):
   ``x -= frequency * count + presence * (count > 0)``.  Counts are the caller-owned int32 histogram
   ``output_counts[B, V]`` (:func:`advance` maintains it in-graph); the prompt set is ``prompt_mask[B, V]``.
   The greedy token is the argmax here (filters below never change the argmax).
2. **temperature**: ``x / t``; rows with ``t < 1e-5`` (vLLM's ``_SAMPLING_EPS``) are greedy.
3. **filters**, on the temperature-scaled logits: min-p (keep ``p >= min_p * p_max``, evaluated as
   ``x >= x_max + log(min_p)``), top-k (keep values ``>=`` the k-th largest; ``0`` = off), top-p (keep the
   smallest descending prefix whose mass reaches ``p``: a token stays when the mass strictly above it is
   ``< p``; probabilities after top-k).  Cuts are value thresholds, so tokens *tied* with the boundary
   value are kept -- the result does not depend on sort order (vLLM splits such ties arbitrarily).
4. **sample**: Gumbel-max, ``argmax(x + g)`` with ``g = -log(-log u)`` -- the same distribution as vLLM's
   exponential race ``argmax(p / e)``.  ``u`` comes from a counter-based hash of (row seed, row step,
   vocabulary index) computed with int64 tensor ops (32-bit lanes, products kept below 2**63 so every
   backend computes identical bits): no global generator, per-request reproducible, independent of the
   batch the row shares, and replaying a step (rollback, re-capture) redraws the same token.

Inactive rows return ``pad_id`` and :func:`advance` leaves their counts and step untouched.
Cost: without a bound the cut is stated by sorting the whole vocabulary (``[B, V]`` fp32), as vLLM's PyTorch path
does; with ``FLARE_SAMPLER_PREFIX=N`` (off by default: ``sampling_cut.GENERAL_PREFIX`` gives the measurements) the
top ``N`` values (``flare::topk_values``) cut the CUDA rows with ``1 <= top_k <= N`` exactly as the bounded variant
below cuts them, and ``flare::sampling_cut``'s sort-free kernel the others.  ``SamplingTensors.max_top_k``
(static, a graph-variant property) replaces the sort by the top ``max_top_k`` values (``flare::topk_values``:
``torch.topk``'s values; two Triton launches on CUDA unless ``FLARE_TRITON_TOPK=0``); it is exact because admission
requires ``1 <= top_k <= max_top_k`` for every row -- e.g. a recipe whose ``top_k`` default has no range (Qwen3: fixed
at 20).  Either way the cut of the sorted values is ``sampling_cut.sorted_cut`` (one Triton launch on CUDA,
``flare::sorted_cut``; traced elsewhere or with ``FLARE_SORTED_CUT_KERNEL=0``).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional, Sequence

import torch

from ignition.components.custom_ops import opaque_op
from ignition.components.sampling_cut import (general_prefix, sampling_cut, sampling_cut_compact,
                                              sampling_cut_reference, sort_free, sorted_cut)
from ignition.components.switches import switch
from ignition.components.topk import topk_values

__all__ = ["SamplingTensors", "sample", "advance", "sample_advance", "draw_finish_op", "draw_finish_into_op",
           "sample_advance_into_op", "DONE_IN_FRONT", "EARLY_SKIP", "DRAW_FINISH", "make_sampler", "apply_penalties",
           "apply_temperature", "apply_min_p", "cut_of", "filter_cut", "filter_logits", "front_logits", "penalized",
           "uniform_noise", "gumbel_argmax", "gumbel_argmax_reference", "sampler_front", "sampler_front_reference",
           "GREEDY_EPS", "GUMBEL_KERNEL", "SAMPLER_FRONT_KERNEL"]

GREEDY_EPS = 1e-5
_M32 = 0xFFFFFFFF
_NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


@dataclass
class SamplingTensors:
    """Per-row sampling parameters and penalty state for ``capacity`` rows (fixed addresses).

    ``seed`` holds the request seed's 64 bits (two's complement); ``step`` counts the tokens the row has
    sampled (its randomness counter).  ``output_counts``/``prompt_mask`` exist when a vocabulary size
    was given; without them penalties must be neutral.
    """

    temperature: torch.Tensor  # f32[B]
    top_k: torch.Tensor  # i32[B], 0 = off
    top_p: torch.Tensor  # f32[B], 1 = off
    min_p: torch.Tensor  # f32[B], 0 = off
    presence_penalty: torch.Tensor  # f32[B]
    frequency_penalty: torch.Tensor  # f32[B]
    repetition_penalty: torch.Tensor  # f32[B], 1 = off
    seed: torch.Tensor  # i64[B]
    step: torch.Tensor  # i64[B]
    active: torch.Tensor  # bool[B]
    output_counts: torch.Tensor | None = None  # i32[B, V]
    prompt_mask: torch.Tensor | None = None  # bool[B, V]
    #: Static: when set, every admitted row has ``1 <= top_k <= max_top_k`` (checked in set_row) and
    #: the filters use ``topk(max_top_k)`` instead of sorting the whole vocabulary -- exact, cheaper.
    max_top_k: int | None = None

    @property
    def capacity(self) -> int:
        return self.temperature.shape[0]

    def rows(self, b: int) -> "SamplingTensors":
        """The first ``b`` rows as views of the same storage (graphs of smaller capacities share state)."""
        if not 0 < b <= self.capacity:
            raise IndexError(f"{b} rows outside capacity {self.capacity}")
        view = {f.name: (getattr(self, f.name)[:b] if isinstance(getattr(self, f.name), torch.Tensor)
                         else getattr(self, f.name)) for f in fields(self)}
        return SamplingTensors(**view)

    @property
    def vocab_size(self) -> int | None:
        return None if self.output_counts is None else self.output_counts.shape[1]

    @classmethod
    def empty(cls, capacity: int, *, vocab_size: int | None = None, device: torch.device | str = "cpu",
              max_top_k: int | None = None) -> "SamplingTensors":
        """All rows inactive with neutral parameters."""
        f = lambda v: torch.full((capacity,), v, dtype=torch.float32, device=device)  # noqa: E731
        return cls(
            temperature=f(1.0), top_k=torch.zeros(capacity, dtype=torch.int32, device=device), top_p=f(1.0),
            min_p=f(0.0), presence_penalty=f(0.0), frequency_penalty=f(0.0), repetition_penalty=f(1.0),
            seed=torch.zeros(capacity, dtype=torch.int64, device=device),
            step=torch.zeros(capacity, dtype=torch.int64, device=device),
            active=torch.zeros(capacity, dtype=torch.bool, device=device),
            output_counts=None if vocab_size is None else
            torch.zeros(capacity, vocab_size, dtype=torch.int32, device=device),
            prompt_mask=None if vocab_size is None else
            torch.zeros(capacity, vocab_size, dtype=torch.bool, device=device),
            max_top_k=max_top_k)

    @classmethod
    def from_resolved(cls, resolved: Sequence[dict[str, Any]], capacity: int, *, vocab_size: int | None = None,
                      prompt_token_ids: Sequence[Sequence[int]] | None = None,
                      device: torch.device | str = "cpu", max_top_k: int | None = None,
                      default_seed: Callable[[], int] | None = None) -> "SamplingTensors":
        """Rows ``0..len(resolved)-1`` from ``SamplingDefaults.resolve`` outputs, active; the rest inactive.

        A row whose ``seed`` is ``None`` gets ``default_seed()`` (default: 64 random bits from
        :mod:`secrets`); pass a deterministic ``default_seed`` where reproducibility matters.
        """
        if len(resolved) > capacity:
            raise ValueError(f"{len(resolved)} requests exceed the sampling capacity {capacity}")
        if prompt_token_ids is not None and len(prompt_token_ids) != len(resolved):
            raise ValueError("prompt_token_ids needs one entry per resolved request")
        out = cls.empty(capacity, vocab_size=vocab_size, device=device, max_top_k=max_top_k)
        for i, r in enumerate(resolved):
            out.set_row(i, r, None if prompt_token_ids is None else prompt_token_ids[i], default_seed=default_seed)
        return out

    def set_row(self, i: int, resolved: dict[str, Any], prompt_token_ids: Sequence[int] | None = None, *,
                step: int = 0, default_seed: Callable[[], int] | None = None) -> None:
        """Admit a request into row ``i`` (host side, between replays): parameters, seed, counters."""
        if not 0 <= i < self.capacity:
            raise IndexError(f"row {i} outside capacity {self.capacity}")
        v = {**_NEUTRAL, **{k: resolved[k] for k in _NEUTRAL if resolved.get(k) is not None}}
        _validate(v)
        if self.max_top_k is not None and not 1 <= v["top_k"] <= self.max_top_k:
            raise ValueError(f"top_k {v['top_k']} outside 1..{self.max_top_k}, the bound this graph variant was "
                             "prepared for (max_top_k); use a variant without the bound")
        penalized = (v["presence_penalty"], v["frequency_penalty"], v["repetition_penalty"]) != (0.0, 0.0, 1.0)
        if self.output_counts is None and (penalized or prompt_token_ids is not None):
            raise ValueError("penalties need the penalty state: build SamplingTensors with vocab_size")
        for name in _NEUTRAL:
            getattr(self, name)[i] = v[name]
        seed = resolved.get("seed")
        if seed is None:
            seed = (default_seed or (lambda: secrets.randbits(64)))()
        seed = int(seed) % (1 << 64)
        self.seed[i] = seed - (1 << 64) if seed >= 1 << 63 else seed
        self.step[i] = step
        self.active[i] = True
        if self.output_counts is not None:
            self.output_counts[i].zero_()
            self.prompt_mask[i].zero_()
            if prompt_token_ids:
                ids = torch.as_tensor(list(prompt_token_ids), dtype=torch.int64)
                if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
                    raise ValueError(f"prompt token id outside the vocabulary of {self.vocab_size}")
                self.prompt_mask[i, ids.to(self.prompt_mask.device)] = True

    def clear_row(self, i: int) -> None:
        """Retire row ``i``: inactive, neutral parameters, empty histograms."""
        for name, value in _NEUTRAL.items():
            getattr(self, name)[i] = value
        self.active[i] = False
        self.seed[i] = 0
        self.step[i] = 0
        if self.output_counts is not None:
            self.output_counts[i].zero_()
            self.prompt_mask[i].zero_()


def _validate(v: dict[str, Any]) -> None:
    checks = {
        "temperature": math.isfinite(v["temperature"]) and v["temperature"] >= 0,
        "top_p": 0 < v["top_p"] <= 1,
        "top_k": float(v["top_k"]).is_integer() and v["top_k"] >= 0,
        "min_p": 0 <= v["min_p"] <= 1,
        "presence_penalty": -2 <= v["presence_penalty"] <= 2,
        "frequency_penalty": -2 <= v["frequency_penalty"] <= 2,
        "repetition_penalty": math.isfinite(v["repetition_penalty"]) and v["repetition_penalty"] > 0,
    }
    bad = {k: v[k] for k, ok in checks.items() if not ok}
    if bad:
        raise ValueError(f"sampling values outside their ranges: {bad} (temperature >= 0, 0 < top_p <= 1, "
                         "integer top_k >= 0, 0 <= min_p <= 1, penalties in [-2, 2], repetition_penalty > 0)")


# ----------------------------------------------------------------------------- counter-based RNG

def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for ``x`` in [0, 2**32): 16-bit halves keep every product below 2**49."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 (C. Wellons' integer hash), on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform_noise(seed: torch.Tensor, step: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``u[B, V]`` in (0, 1), a pure function of (seed[b], step[b], v): 24-bit odd fractions."""
    lo, hi = seed & _M32, (seed >> 32) & _M32
    key = _mix32(_mix32(_mix32((step & _M32) ^ 0x9E3779B9) ^ hi) ^ lo)
    key2 = _mix32(key ^ 0x85EBCA6B)
    idx = torch.arange(vocab_size, device=seed.device, dtype=torch.int64)
    h = _mix32(_mix32(idx[None, :] ^ key[:, None]) ^ key2[:, None])
    return ((h >> 8) | 1).to(torch.float32) * (2.0 ** -24)


# ----------------------------------------------------------------------------- logit processing

def apply_penalties(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """Repetition (prompt or output tokens), then frequency and presence (output tokens); see module doc."""
    if params.output_counts is None:
        return logits
    return penalized(logits, params.output_counts, params.prompt_mask, params.repetition_penalty,
                     params.frequency_penalty, params.presence_penalty)


def penalized(logits: torch.Tensor, counts: torch.Tensor, prompt_mask: torch.Tensor, repetition: torch.Tensor,
              frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """:func:`apply_penalties` on its tensors: ``counts [B, V]`` int32, ``prompt_mask [B, V]`` bool, the three
    penalties ``[B]``."""
    seen = counts > 0
    rep = torch.where(seen | prompt_mask, repetition[:, None], 1.0)
    x = torch.where(logits > 0, logits / rep, logits * rep)
    return x - frequency[:, None] * counts.to(x.dtype) - presence[:, None] * seen.to(x.dtype)


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``x / t`` per row; greedy rows (``t < GREEDY_EPS``) divide by 1 so they stay finite."""
    t = torch.where(temperature < GREEDY_EPS, 1.0, temperature)
    return logits / t[:, None]


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens with ``p < min_p * p_max`` (as ``x < x_max + log(min_p)``; ``min_p = 0`` keeps all)."""
    cut = logits.amax(dim=-1, keepdim=True) + torch.log(min_p)[:, None]
    return logits.masked_fill(logits < cut, float("-inf"))


def _prefix_cut(y: torch.Tensor, params: SamplingTensors, n: int, skip: torch.Tensor) -> torch.Tensor:
    """``[B]`` cuts (keep ``y >= cut``) from the top ``n`` values of each row: rows with ``1 <= top_k <= n`` are cut
    there, as the bounded variant cuts them; the others by ``flare::sampling_cut`` (``skip``: rows whose filtered
    logits the caller ignores)."""
    in_prefix = (params.top_k >= 1) & (params.top_k <= n)
    return torch.where(in_prefix, sorted_cut(params.top_k, params.top_p, topk_values(y, n)),
                       sampling_cut(y, params.top_k, params.top_p, in_prefix | skip))


def filter_logits(logits: torch.Tensor, params: SamplingTensors,
                  skip: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(penalized, filtered)``: :func:`filter_cut`'s logits with the cut applied (the values below it ``-inf``)."""
    x, y, cut = filter_cut(logits, params, skip)
    return x, y.masked_fill(y < cut[:, None], float("-inf"))


def filter_cut(logits: torch.Tensor, params: SamplingTensors,
               skip: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(penalized, scaled, cut)``: penalized logits (greedy source), the temperature-scaled, min-p-masked logits
    and each row's top-k / top-p cut: random rows sample from the scaled values ``>= cut`` (top-k, then top-p on the
    probabilities it keeps; values tied with a cut are kept).  ``skip [B]`` bool: rows whose filtered logits the
    caller ignores (greedy rows in :func:`sample`); on CUDA their top-k / top-p cut may be left out.

    With ``max_top_k``: the top ``max_top_k`` values (every row has ``1 <= top_k <= max_top_k``, so its kept set lies
    inside them).  Without, on CUDA: with ``FLARE_SAMPLER_PREFIX=N`` (:func:`general_prefix`, default 0: off) the
    top ``N`` values, and ``flare::sampling_cut`` for the rows whose cut they do not decide (``sampling_cut.py``);
    otherwise (:func:`sort_free`, default on; ``FLARE_SAMPLER_SORT_FREE=0``: the full sort) every row by
    ``flare::sampling_cut_compact`` (no sort).  Elsewhere the full sort."""
    x, y = front_logits(*_front_args(logits, params))
    return x, y, cut_of(y, params, skip)


def front_logits(logits: torch.Tensor, counts: torch.Tensor | None, prompt_mask: torch.Tensor | None,
                 repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor, temperature: torch.Tensor,
                 min_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(penalized, scaled)`` in float32: the penalties (none without the penalty state: ``counts`` and
    ``prompt_mask`` None), then the temperature and the min-p mask -- the front of :func:`filter_cut`, on tensors."""
    x = logits.to(torch.float32)
    if counts is not None:
        x = penalized(x, counts, prompt_mask, repetition, frequency, presence)
    return x, apply_min_p(apply_temperature(x, temperature), min_p)


def _front_args(logits: torch.Tensor, params: SamplingTensors) -> tuple:
    """:func:`front_logits`' arguments (and ``flare::sampler_front``'s) from ``params``."""
    return (logits, params.output_counts, params.prompt_mask, params.repetition_penalty, params.frequency_penalty,
            params.presence_penalty, params.temperature, params.min_p)


#: Whether the compacted cut's kernels test the greedy rows themselves (``temperature < GREEDY_EPS``, from the
#: temperatures) where the sampler skips those rows, instead of a traced mask (``FLARE_CUT_SKIP_IN_KERNEL=1`` / ``0``;
#: read at each trace, for side-by-side runs): in run 194's Qwen3-8B batch-1 trace Inductor formed that mask in a
#: launch of its own between the sampler front and the cut (1.0 us, 1.4 us of the critical path).  The same rows.
CUT_SKIP_IN_KERNEL = True


def cut_of(y: torch.Tensor, params: SamplingTensors, skip: torch.Tensor | None = None, *,
           skip_greedy: bool = False) -> torch.Tensor:
    """``[B]``: each row's top-k / top-p cut of the scaled, min-p-masked logits ``y`` (:func:`filter_cut`);
    ``skip_greedy`` (instead of ``skip``): the greedy rows (temperature below :data:`GREEDY_EPS`) skipped."""
    if skip_greedy and skip is not None:
        raise ValueError("cut_of: skip or skip_greedy, not both")
    n = min(general_prefix(), y.shape[-1])
    if params.max_top_k is not None:
        cut = sorted_cut(params.top_k, params.top_p, topk_values(y, min(params.max_top_k, y.shape[-1])))
    elif skip_greedy and _compact_cut_route(y, params):
        cut = sampling_cut_compact(y, params.top_k, params.top_p, params.temperature, GREEDY_EPS)
    elif y.is_cuda and (sort_free() or n > 0):
        if skip_greedy:
            skip = params.temperature < GREEDY_EPS
        skipped = torch.zeros_like(params.active) if skip is None else skip
        cut = (_prefix_cut(y, params, n, skipped) if n > 0
               else sampling_cut_compact(y, params.top_k, params.top_p, skipped))
    else:
        cut = sorted_cut(params.top_k, params.top_p, torch.sort(y, dim=-1, descending=True).values)
    return cut


def _compact_cut_route(y: torch.Tensor, params: SamplingTensors) -> bool:
    """Whether :func:`cut_of` (greedy rows skipped) cuts the rows of ``y`` with ``flare::sampling_cut_compact``,
    which tests the greedy rows itself (:data:`CUT_SKIP_IN_KERNEL`): CUDA, no ``max_top_k``, no prefix, sort-free."""
    return (y.is_cuda and params.max_top_k is None and min(general_prefix(), y.shape[-1]) == 0 and sort_free()
            and switch("FLARE_CUT_SKIP_IN_KERNEL", CUT_SKIP_IN_KERNEL))


def argmax_last(x: torch.Tensor, block: int = 2048) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of ``[..., V]`` (the first maximum, as ``torch.argmax``), computed in two stages: the
    first maximum of each ``block`` (the tail padded with -inf), then the first block holding the row maximum.
    Same result; but a compiled graph reduces ``B * ceil(V / block)`` short rows in parallel instead of one
    vocabulary-long row per program (on the H200 the one-stage form took 109 us for one row of 151,936)."""
    v = x.shape[-1]
    if v <= block:
        return x.argmax(dim=-1)
    lead, n = x.shape[:-1], -(-v // block)
    xb = torch.nn.functional.pad(x.reshape(-1, v), (0, n * block - v), value=float("-inf")).view(-1, n, block)
    vals, idx = xb.max(dim=-1)  # first maximum within each block
    j = vals.argmax(dim=-1)  # first block holding the row maximum
    return (j * block + idx.gather(1, j[:, None]).squeeze(1)).view(lead)


#: Whether the CUDA sampler draws its Gumbel-max token with ``flare::gumbel_argmax`` (one Triton launch: each program
#: its chunk's cut, noise and first maximum, the row's last program the token -- ``kernels/gumbel.py``) instead of the
#: traced cut, noise, logs and argmax: in run 168's Qwen3-8B step at batch 1 three Inductor launches (the row keys; the
#: cut, noise and logs; the argmax's first stage: 6.2 us of kernel time), its second stage sharing a fourth with the
#: token's selection and the state update.  ``FLARE_GUMBEL_KERNEL=1`` / ``0`` sets it (read at each trace, for
#: side-by-side runs).  The same noise bits; the logs libdevice's, as torch's.  On since run 170 (with
#: :data:`SAMPLER_FRONT_KERNEL`, on an H100: both off, the Qwen3-8B step 1.0018x slower at batch 4, 10/10 paired
#: blocks; batch 1 within noise; GPU tests pass, runs 169 and 170).
GUMBEL_KERNEL = True


def gumbel_argmax_reference(scaled: torch.Tensor, cut: torch.Tensor, seed: torch.Tensor,
                            step: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64: the Gumbel-max draw from the values ``>= cut [B]`` of ``scaled [B, V]`` -- the first maximum of
    ``filtered - log(-log u)`` per row, ``filtered`` those values (-inf elsewhere), ``u`` the row's noise
    (:func:`uniform_noise`)."""
    filtered = scaled.masked_fill(scaled < cut[:, None], float("-inf"))
    u = uniform_noise(seed, step, scaled.shape[-1])
    return argmax_last(filtered - torch.log(-torch.log(u)))


def _check_draw(what: str, scaled: torch.Tensor, cut: torch.Tensor, seed: torch.Tensor, step: torch.Tensor) -> None:
    """The draw's arguments: ``scaled [B, V]`` float32, ``cut [B]`` float32, ``seed, step [B]`` int64 (raises naming
    ``what`` and the bad argument)."""
    b = scaled.shape[0] if scaled.dim() else 0
    if scaled.dim() != 2 or scaled.dtype != torch.float32:
        raise ValueError(f"{what}: scaled must be a [B, V] float32 tensor, got {tuple(scaled.shape)} {scaled.dtype}")
    for name, t, dtype in (("cut", cut, torch.float32), ("seed", seed, torch.int64), ("step", step, torch.int64)):
        if tuple(t.shape) != (b,) or t.dtype != dtype:
            raise ValueError(f"{what}: {name} must be a [{b}] {dtype} tensor, got {tuple(t.shape)} {t.dtype}")


def _gumbel_fake(scaled: torch.Tensor, cut: torch.Tensor, seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    return seed.new_empty((scaled.shape[0],))


@opaque_op("gumbel_argmax", mutates_args=(), fake=_gumbel_fake)
def gumbel_argmax_op(scaled: torch.Tensor, cut: torch.Tensor, seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """``scaled [B, V]`` float32, ``cut [B]`` float32, ``seed, step [B]`` int64 -> a new ``[B]`` int64:
    :func:`gumbel_argmax_reference`.  CUDA: one Triton launch (``kernels.gumbel``); elsewhere the reference."""
    _check_draw("gumbel_argmax", scaled, cut, seed, step)
    if scaled.is_cuda:
        from ignition.components.kernels.gumbel import gumbel_argmax_triton  # imports triton: CUDA only

        return gumbel_argmax_triton(scaled, cut.contiguous(), seed.contiguous(), step.contiguous())
    return gumbel_argmax_reference(scaled, cut, seed, step)


def gumbel_argmax(scaled: torch.Tensor, cut: torch.Tensor, seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The sampler's draw: ``flare::gumbel_argmax`` on CUDA with :data:`GUMBEL_KERNEL` (``FLARE_GUMBEL_KERNEL``),
    else :func:`gumbel_argmax_reference` traced inline."""
    if scaled.is_cuda and switch("FLARE_GUMBEL_KERNEL", GUMBEL_KERNEL):
        return gumbel_argmax_op(scaled, cut, seed, step)
    return gumbel_argmax_reference(scaled, cut, seed, step)


#: Whether the CUDA sampler forms its penalized, scaled and min-p-masked logits and its greedy token with
#: ``flare::sampler_front`` (two Triton launches, ``kernels/sampler_front.py``) instead of the traced penalties,
#: temperature, split ``amax``, mask and first argmax stage: in run 168's Qwen3-8B step at batch 1 the seven Inductor
#: launches before the cut, 12.0 us of kernel time.  ``FLARE_SAMPLER_FRONT_KERNEL=1`` / ``0`` sets it (read at each
#: trace, for side-by-side runs).  The same arithmetic in the same order, bit for bit the eager reference's (IEEE
#: divisions, libdevice's log).  On since run 170 (with :data:`GUMBEL_KERNEL`, measured there).
SAMPLER_FRONT_KERNEL = True


def sampler_front_reference(logits: torch.Tensor, counts: torch.Tensor | None, prompt_mask: torch.Tensor | None,
                            repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor,
                            temperature: torch.Tensor, min_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(greedy [B] int64, scaled [B, V] float32)``: the first maximum of :func:`front_logits`' penalized logits,
    and its scaled ones."""
    x, y = front_logits(logits, counts, prompt_mask, repetition, frequency, presence, temperature, min_p)
    return argmax_last(x), y


def _check_front(what: str, logits: torch.Tensor, counts: torch.Tensor | None, prompt_mask: torch.Tensor | None,
                 repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor, temperature: torch.Tensor,
                 min_p: torch.Tensor) -> None:
    """The front's arguments (:func:`sampler_front_op`; raises naming ``what`` and the bad argument)."""
    if logits.dim() != 2 or logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{what}: logits must be a [B, V] floating tensor, got {tuple(logits.shape)} {logits.dtype}")
    b, v = logits.shape
    if (counts is None) != (prompt_mask is None):
        raise ValueError(f"{what}: counts and prompt_mask come together (the penalty state) or not at all")
    for name, t, dtype in (("counts", counts, torch.int32), ("prompt_mask", prompt_mask, torch.bool)):
        if t is not None and (tuple(t.shape) != (b, v) or t.dtype != dtype or t.stride(-1) != 1):
            raise ValueError(f"{what}: {name} must be a [{b}, {v}] {dtype} tensor with contiguous rows, got "
                             f"{tuple(t.shape)} {t.dtype}")
    for name, t in (("repetition", repetition), ("frequency", frequency), ("presence", presence),
                    ("temperature", temperature), ("min_p", min_p)):
        if tuple(t.shape) != (b,) or t.dtype != torch.float32:
            raise ValueError(f"{what}: {name} must be a [{b}] float32 tensor, got {tuple(t.shape)} {t.dtype}")


def _front_fake(logits, counts, prompt_mask, repetition, frequency, presence, temperature, min_p):
    b, v = logits.shape
    return logits.new_empty((b,), dtype=torch.int64), logits.new_empty((b, v), dtype=torch.float32)


@opaque_op("sampler_front", mutates_args=(), fake=_front_fake)
def sampler_front_op(logits: torch.Tensor, counts: Optional[torch.Tensor], prompt_mask: Optional[torch.Tensor],
                     repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor,
                     temperature: torch.Tensor, min_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [B, V]`` (bf16 or float32), the penalty state ``counts [B, V]`` int32 and ``prompt_mask [B, V]`` bool
    (both or neither), ``repetition, frequency, presence, temperature, min_p [B]`` float32 -> new ``(greedy [B]
    int64, scaled [B, V] float32)``: :func:`sampler_front_reference`.  CUDA: two Triton launches
    (``kernels.sampler_front``); elsewhere the reference."""
    _check_front("sampler_front", logits, counts, prompt_mask, repetition, frequency, presence, temperature, min_p)
    if logits.is_cuda:
        from ignition.components.kernels.sampler_front import sampler_front_triton  # imports triton: CUDA only

        rows = (t.contiguous() for t in (repetition, frequency, presence, temperature, min_p))
        return sampler_front_triton(logits, counts, prompt_mask, *rows, GREEDY_EPS)
    return sampler_front_reference(logits, counts, prompt_mask, repetition, frequency, presence, temperature, min_p)


def sampler_front(logits: torch.Tensor, params: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's front, ``(greedy, scaled)``: ``flare::sampler_front`` on CUDA with :data:`SAMPLER_FRONT_KERNEL`
    (``FLARE_SAMPLER_FRONT_KERNEL``), else :func:`sampler_front_reference` traced inline."""
    if logits.is_cuda and switch("FLARE_SAMPLER_FRONT_KERNEL", SAMPLER_FRONT_KERNEL):
        return sampler_front_op(*_front_args(logits, params))
    return sampler_front_reference(*_front_args(logits, params))


#: Whether the CUDA sampler's draw also picks each row's token and advances its state (``flare::draw_finish_``: the
#: last program of each row of :data:`GUMBEL_KERNEL`'s launch -- the greedy token for a greedy row, the pad for an
#: inactive one, an active row's count and step) when the sampler samples and advances in one region
#: (:func:`sample_advance`, the catalog's steps): in run 186's Qwen3-8B step at batch 1 (an H100) Inductor traced that
#: choice and update as four launches after the draw, 5.3 us of kernel time and 6.9 us of the critical path.  The same
#: tokens, counts and steps (``test_draw_finish_on_this_gpu`` passes on an H100, eager and compiled).
#: ``FLARE_DRAW_FINISH=1`` / ``0`` sets it (read at each trace, for side-by-side runs).  On: Qwen3-8B side by side in
#: one process on an H100 (``results/20261206T031133Z-sm90-run189``, 1024-token context), off 1.0010x slower at batch 1
#: and 1.0024x at batch 4 (paired blocks 0/10 faster; within noise by the min-max rule).
DRAW_FINISH = True


#: Whether :func:`sample_advance` given the step's static tokens draws into them (``flare::draw_finish_into_``)
#: instead of returning a new tensor its caller copies there (``FLARE_DRAW_INTO=1`` / ``0``; read at each trace, for
#: side-by-side runs): in run 194's Qwen3-8B batch-1 trace that copy was a launch of its own after the draw (1.3 us).
#: The same tokens.
DRAW_INTO = True


def _draw_finish_fake(scaled, cut, seed, step, greedy, temperature, active, counts, pad_id):
    return seed.new_empty((scaled.shape[0],))


@opaque_op("draw_finish_", mutates_args=("step", "counts"), fake=_draw_finish_fake)
def draw_finish_op(scaled: torch.Tensor, cut: torch.Tensor, seed: torch.Tensor, step: torch.Tensor,
                   greedy: torch.Tensor, temperature: torch.Tensor, active: torch.Tensor, counts: torch.Tensor,
                   pad_id: int) -> torch.Tensor:
    """:func:`gumbel_argmax_op`'s draw, then the sampler's end: a new ``[B]`` int64 of tokens -- ``greedy [B]`` int64
    where ``temperature [B]`` is below :data:`GREEDY_EPS`, the draw elsewhere, ``pad_id`` where ``active [B]`` (bool)
    is off -- and, for the active rows, the token counted in ``counts [B, V]`` (int32) and ``step`` advanced by one
    (:func:`advance`).  CUDA: the draw's launch (``kernels.gumbel``, ``FINISH``; it writes ``counts`` and ``step`` in
    place, so their rows must be contiguous -- raises naming them otherwise); elsewhere the reference."""
    return _draw_finish("draw_finish_", None, scaled, cut, seed, step, greedy, temperature, active, counts, pad_id)


@opaque_op("draw_finish_into_", mutates_args=("out", "step", "counts"))
def draw_finish_into_op(out: torch.Tensor, scaled: torch.Tensor, cut: torch.Tensor, seed: torch.Tensor,
                        step: torch.Tensor, greedy: torch.Tensor, temperature: torch.Tensor, active: torch.Tensor,
                        counts: torch.Tensor, pad_id: int) -> None:
    """:func:`draw_finish_op` with its tokens written into ``out`` (a ``[B]`` int64; contiguous on CUDA -- raises
    naming it otherwise) instead of a new tensor: the step's static tokens, where a compiled region would otherwise
    copy the op's result there in a launch of its own (run 194's Qwen3-8B batch-1 trace: 1.3 us after the draw)."""
    _draw_finish("draw_finish_into_", out, scaled, cut, seed, step, greedy, temperature, active, counts, pad_id)


def _draw_finish(what: str, out: torch.Tensor | None, scaled, cut, seed, step, greedy, temperature, active, counts,
                 pad_id: int) -> torch.Tensor:
    """:func:`draw_finish_op` (``out`` None: a new tensor) and :func:`draw_finish_into_op`, named ``what``."""
    _check_draw(what, scaled, cut, seed, step)
    b, v = scaled.shape
    expected = {"greedy": (greedy, (b,), torch.int64), "temperature": (temperature, (b,), torch.float32),
                "active": (active, (b,), torch.bool), "counts": (counts, (b, v), torch.int32)}
    if out is not None:
        expected["out"] = (out, (b,), torch.int64)
    for name, (t, shape, dtype) in expected.items():
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"{what}: {name} must be a {list(shape)} {dtype} tensor, got {tuple(t.shape)} "
                             f"{t.dtype}")
    if not scaled.is_cuda:
        tokens = _pick(greedy, gumbel_argmax_reference(scaled, cut, seed, step), temperature, active, pad_id)
        _advance(counts, step, tokens, active)
        return tokens if out is None else out.copy_(tokens)
    if counts.stride(-1) != 1 or not step.is_contiguous() or (out is not None and not out.is_contiguous()):
        raise ValueError(f"{what}: counts needs contiguous rows, step and out must be contiguous, got strides "
                         f"{counts.stride()}, {step.stride()} and {None if out is None else out.stride()}")
    from ignition.components.kernels.gumbel import gumbel_argmax_triton  # imports triton: CUDA only

    finish = (greedy.contiguous(), temperature.contiguous(), active.contiguous(), counts, GREEDY_EPS, pad_id)
    return gumbel_argmax_triton(scaled, cut.contiguous(), seed.contiguous(), step, finish=finish, out=out)


#: Whether :func:`sample_advance` on the compacted cut's route (``cut_of``) runs the whole sampler as one op,
#: ``flare::sample_advance_into_``, whose front ends the rows nothing after it changes (``kernels/sampler_done.py``:
#: greedy rows, and sampled rows without top-k, top-p or min-p -- their Gumbel-max draw formed by the front beside its
#: greedy token) and whose later launches skip them -- returning before their PDL wait when every row is done, as in a
#: batch of plain temperature sampling: run 194's Qwen3-8B batch-1 step (the replay's rows: temperature 1, no filter)
#: spent 27 us of its critical path in the sampler, ~20 of them after the front (the min-p mask over the whole row,
#: the cut's five launches with nothing to cut, the draw's full pass).  The same tokens, counts and steps: the same
#: kernels' arithmetic (the draw's noise and first maximum, the finish).  ``FLARE_SAMPLER_DONE_IN_FRONT=1`` / ``0`` sets
#: it (read at each trace, for side-by-side runs).  On: GPU tests pass (captured, capacities 1-64, mixed and all-done
#: rows); Qwen3-8B side by side in one process with the null on an H100 (``results/20261206T170100Z-sm90-run199``,
#: 1024-token context), off 1.0036x slower at batch 1 and 1.0044x at batch 4 (18.9 / 25.2 us a step; paired blocks
#: 0/10 faster against A and A2; within noise by the min-max rule).  Not yet on an H200.
DONE_IN_FRONT = True


#: Whether :data:`DONE_IN_FRONT`'s op, captured into a CUDA graph, lets the launches after its min-p mask start before
#: that mask's PDL wait when every row is done (``FLARE_SAMPLER_EARLY_SKIP=1`` / ``0``; read at each launch): they
#: return before their own waits, so the chain of skipping launches (run 200, an H100: six after the min-p mask, ~1.2 us
#: each, 8.2 of the sampler's 16.3 us of critical path) runs while the front does, and the min-p mask returns with
#: them, before its own wait (a done row masks nothing).  What it asks: the graph completes only when every kernel of
#: it has -- the front completes after the last launch of the step, which no longer waits for it.  Only under capture
#: (a graph launch completes as a whole); eager launches keep every launch's wait.  On: its GPU test (``done-early``,
#: capacities 1, 4, 64) passes on an H100, and Qwen3-8B side by side in one process there
#: (``results/20261206T191700Z-sm90-run201``, 1024-token context) off is 1.0011x slower at batch 1 and 1.0021x at
#: batch 4 (~5.8 / 12 us a step; paired blocks 0/10 faster; within noise by the min-max rule).  Not yet on an H200.
#: ``scripts/h200_run.sh`` switches it off for a call's later stages when that test fails.
EARLY_SKIP = True


@opaque_op("sample_advance_into_", mutates_args=("out", "step", "counts"))
def sample_advance_into_op(out: torch.Tensor, logits: torch.Tensor, counts: torch.Tensor, prompt_mask: torch.Tensor,
                           repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor,
                           temperature: torch.Tensor, min_p: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                           seed: torch.Tensor, step: torch.Tensor, active: torch.Tensor, pad_id: int) -> None:
    """The sampler and its state update in one op: ``logits [B, V]`` and the penalty state ``counts [B, V]`` int32,
    ``prompt_mask [B, V]`` bool, the rows' ``repetition, frequency, presence, temperature, min_p, top_p [B]`` float32,
    ``top_k [B]`` int32, ``seed, step [B]`` int64 and ``active [B]`` bool -> the tokens into ``out [B]`` int64
    (``pad_id`` for the inactive rows), each active row's token counted in ``counts`` and its ``step`` advanced:
    :func:`sample` then :func:`advance`, with the cut of ``flare::sampling_cut_compact``.  CUDA: the front (ending the
    done rows, :data:`DONE_IN_FRONT`), the min-p mask, the compacted cut and the draw's finish, the later launches
    skipping the done rows; ``out``, ``counts`` and ``step`` contiguous (raises naming them otherwise).  Elsewhere the
    reference (the sorting cut)."""
    what = "sample_advance_into_"
    _check_front(what, logits, counts, prompt_mask, repetition, frequency, presence, temperature, min_p)
    b, v = logits.shape
    for name, t, dtype in (("top_k", top_k, torch.int32), ("top_p", top_p, torch.float32),
                           ("seed", seed, torch.int64), ("step", step, torch.int64), ("active", active, torch.bool),
                           ("out", out, torch.int64)):
        if tuple(t.shape) != (b,) or t.dtype != dtype:
            raise ValueError(f"{what}: {name} must be a [{b}] {dtype} tensor, got {tuple(t.shape)} {t.dtype}")
    if not logits.is_cuda:
        x, y = front_logits(logits, counts, prompt_mask, repetition, frequency, presence, temperature, min_p)
        cut = sampling_cut_reference(y, top_k, top_p, temperature, skip_below=GREEDY_EPS)
        tokens = _pick(argmax_last(x), gumbel_argmax_reference(y, cut, seed, step), temperature, active, pad_id)
        _advance(counts, step, tokens, active)
        out.copy_(tokens)
        return
    if not (out.is_contiguous() and step.is_contiguous() and counts.is_contiguous()):
        raise ValueError(f"{what}: out, step and counts must be contiguous, got strides {out.stride()}, "
                         f"{step.stride()} and {counts.stride()}")
    sample_advance_into_triton(out, logits, counts, prompt_mask, repetition, frequency, presence, temperature, min_p,
                               top_k, top_p, seed, step, active, pad_id)


def sample_advance_into_triton(out: torch.Tensor, logits: torch.Tensor, counts: torch.Tensor,
                               prompt_mask: torch.Tensor, repetition: torch.Tensor, frequency: torch.Tensor,
                               presence: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor,
                               top_k: torch.Tensor, top_p: torch.Tensor, seed: torch.Tensor, step: torch.Tensor,
                               active: torch.Tensor, pad_id: int) -> None:
    """:func:`sample_advance_into_op`'s launches on the GPU (or the interpreter), its arguments as the op's (checked
    by it; ``out``, ``counts`` and ``step`` written in place, the row tensors made contiguous here): the front ending
    the done rows (``kernels.sampler_front``, ``draw``), the min-p mask, the compacted cut and the draw's finish
    skipping them (``kernels.sampling_cut``, ``kernels.gumbel``)."""
    from ignition.components.kernels.gumbel import gumbel_argmax_triton  # imports triton
    from ignition.components.kernels.sampler_front import sampler_front_triton
    from ignition.components.kernels.sampling_cut import sampling_cut_compact_triton

    repetition, frequency, presence, temperature, min_p, top_k, top_p, seed, active = (
        t.contiguous() for t in (repetition, frequency, presence, temperature, min_p, top_k, top_p, seed, active))
    early = (logits.is_cuda and switch("FLARE_SAMPLER_EARLY_SKIP", EARLY_SKIP)
             and torch.cuda.is_current_stream_capturing())
    greedy, scaled = sampler_front_triton(logits, counts, prompt_mask, repetition, frequency, presence, temperature,
                                          min_p, GREEDY_EPS, draw=(seed, step, top_k, top_p, active, out, pad_id),
                                          early=early)
    cut = sampling_cut_compact_triton(scaled, top_k, top_p, temperature, skip_below=GREEDY_EPS, min_p=min_p)
    gumbel_argmax_triton(scaled, cut, seed, step, finish=(greedy, temperature, active, counts, GREEDY_EPS, pad_id),
                         out=out, skip_done=(top_k, top_p, min_p))


def _pick(greedy: torch.Tensor, drawn: torch.Tensor, temperature: torch.Tensor, active: torch.Tensor,
          pad_id: int) -> torch.Tensor:
    """Each row's token: ``greedy`` below :data:`GREEDY_EPS`, else ``drawn``; ``pad_id`` where not ``active``."""
    return torch.where(active, torch.where(temperature < GREEDY_EPS, greedy, drawn), pad_id)


def sample_advance(logits: torch.Tensor, params: SamplingTensors, *, active: torch.Tensor | None = None,
                   pad_id: int = -1, out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`sample` then :func:`advance` with the same ``active``: the tokens, the row state advanced.  On CUDA with
    :data:`GUMBEL_KERNEL` and :data:`DRAW_FINISH` (and the penalty state) the draw's launch ends both
    (``flare::draw_finish_``; with ``out``, a contiguous ``[B]`` int64, ``flare::draw_finish_into_``: the tokens
    written there and ``out`` returned -- the caller copies any other result into it)."""
    act = params.active if active is None else active
    if (logits.is_cuda and params.output_counts is not None and switch("FLARE_GUMBEL_KERNEL", GUMBEL_KERNEL)
            and switch("FLARE_DRAW_FINISH", DRAW_FINISH)):
        into = out is not None and out.is_contiguous() and switch("FLARE_DRAW_INTO", DRAW_INTO)
        if (into and _compact_cut_route(logits, params) and switch("FLARE_SAMPLER_FRONT_KERNEL", SAMPLER_FRONT_KERNEL)
                and switch("FLARE_SAMPLER_DONE_IN_FRONT", DONE_IN_FRONT)):
            sample_advance_into_op(out, *_front_args(logits, params), params.top_k, params.top_p, params.seed,
                                   params.step, act, pad_id)
            return out
        greedy, scaled, cut = _front_and_cut(logits, params)
        args = (scaled, cut, params.seed, params.step, greedy, params.temperature, act, params.output_counts, pad_id)
        if into:
            draw_finish_into_op(out, *args)
            return out
        return draw_finish_op(*args)
    tokens = sample(logits, params, active=act, pad_id=pad_id)
    advance(params, tokens, active=act)
    return tokens


def sample(logits: torch.Tensor, params: SamplingTensors, *, active: torch.Tensor | None = None,
           pad_id: int = -1) -> torch.Tensor:
    """Tokens ``int64[B]``; pure (reads ``params``, writes nothing).  Inactive rows (``active``, default
    ``params.active``) get ``pad_id``; pass a valid token id where the graph feeds tokens back."""
    greedy, scaled, cut = _front_and_cut(logits, params)
    drawn = gumbel_argmax(scaled, cut, params.seed, params.step)
    return _pick(greedy, drawn, params.temperature, params.active if active is None else active, pad_id)


def _front_and_cut(logits: torch.Tensor, params: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(greedy, scaled, cut)``: :func:`sampler_front` and each sampled row's cut (:func:`cut_of`; greedy rows
    skipped) -- what the draw reads."""
    greedy, scaled = sampler_front(logits, params)
    return greedy, scaled, cut_of(scaled, params, skip_greedy=True)


def advance(params: SamplingTensors, tokens: torch.Tensor, *, active: torch.Tensor | None = None) -> None:
    """In-graph state update after :func:`sample`: active rows count ``tokens`` and step once;
    inactive rows are untouched.  Pure tensor mutations, capturable."""
    _advance(params.output_counts, params.step, tokens, params.active if active is None else active)


def _advance(counts: torch.Tensor | None, step: torch.Tensor, tokens: torch.Tensor, active: torch.Tensor) -> None:
    """:func:`advance` on tensors: ``counts [B, V]`` (None: no penalty state) and ``step [B]`` in place."""
    if counts is not None:
        counts.scatter_add_(1, tokens.clamp(0, counts.shape[1] - 1)[:, None].to(torch.int64),
                            active.to(torch.int32)[:, None])
    step.add_(active.to(torch.int64))


def make_sampler(params: SamplingTensors, *, advance_state: bool = True,
                 pad_id: int = -1) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A ``(logits, active) -> tokens`` step hook (the prepared forward's sampler signature) that samples
    with ``params`` under the step's own active mask and, by default, advances the row state in-graph."""
    def sampler(logits: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        if advance_state:
            return sample_advance(logits, params, active=active, pad_id=pad_id)
        return sample(logits, params, active=active, pad_id=pad_id)
    return sampler
