"""The rows the sampler's front finishes itself (``flare::sample_advance_into_``, :mod:`ignition.components.sampling`).

A row is *done* after the front when nothing after it changes its token: greedy (``temperature < GREEDY_EPS``: its
token is the front's argmax) or sampled without a filter -- top-k off or not below the vocabulary, top-p 1, min-p 0 --
whose Gumbel-max draw over the whole scaled row the front forms beside its greedy one (no cut, and a min-p of 0 masks
nothing: ``x < x_max + log(0)`` holds for no value).  The launches after the front then skip such rows, and when every
row of the batch is done they return before their PDL wait: a launch that waits for nothing and reads nothing a kernel
of the step wrote (the rows' parameters come from the host, or from before the front) completes at once, so the
sampler's critical path ends with the front's.  The first launch after the front (the min-p mask) waits, so the
launches after it start only once the front completed -- every kernel of the step before the last of them is complete
when that one completes, as without the skips -- except captured with ``FLARE_SAMPLER_EARLY_SKIP``
(``sampling.EARLY_SKIP``), where it too returns before its wait when every row is done and the graph's completion
is what waits for the front.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _done_row(t, k, p, mp, V, eps):
    """Whether a row of temperature ``t``, top-k ``k``, top-p ``p`` and min-p ``mp`` is done after the front (module
    docstring); a NaN temperature draws, as the sampler's choice has it."""
    return (t < eps) | (((k < 1) | (k >= V)) & (p >= 1.0) & (mp <= 0.0))


@triton.jit
def _row_done(TEMP, TOPK, TOPP, MINP, b, V, eps):
    """:func:`_done_row` of row ``b``, its parameters loaded through L2 (``.cg``: read before a launch's PDL wait)."""
    return _done_row(tl.load(TEMP + b, cache_modifier=".cg"), tl.load(TOPK + b, cache_modifier=".cg"),
                     tl.load(TOPP + b, cache_modifier=".cg"), tl.load(MINP + b, cache_modifier=".cg"), V, eps)


@triton.jit
def _all_rows_done(TEMP, TOPK, TOPP, MINP, B, V, eps, BP: tl.constexpr):
    """Whether every one of the ``B`` rows is done (``BP``: a power of two ``>= B``); the parameters loaded through
    L2 (``.cg``: read before the launch's PDL wait)."""
    r = tl.arange(0, BP)
    m = r < B
    t = tl.load(TEMP + r, mask=m, other=0.0, cache_modifier=".cg")
    k = tl.load(TOPK + r, mask=m, other=0, cache_modifier=".cg")
    p = tl.load(TOPP + r, mask=m, other=1.0, cache_modifier=".cg")
    mp = tl.load(MINP + r, mask=m, other=0.0, cache_modifier=".cg")
    return tl.min(_done_row(t, k, p, mp, V, eps).to(tl.int32), axis=0) == 1
