"""Row reductions over many programs in one launch: each program reduces its chunk of a row, stores its partial, and
draws a ticket of its row (a CTA barrier, then one acq_rel add at GPU scope: CUTLASS's semaphore pattern, so the row's
other programs' stores are visible to the program drawing the last ticket), which reads every partial (through L2),
finishes the row and puts the count back to zero for the next launch (``launch.zeroed_counts``).  No program waits
for another: any order of the programs, the interpreter's too, gives the same result.  The sampler's kernels
(``gumbel.py``, ``sampler_front.py``) reduce with them."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _chunk_first_max(x, offs, keep, V):
    """``(largest, its first index)`` of a chunk's values ``x`` at indices ``offs`` (``keep``: inside the row) -- a NaN
    the largest, as ``torch.argmax`` takes it; a chunk of -inf: its first index."""
    xn = tl.where(keep, tl.where(x != x, float("inf"), x), float("-inf"))
    top = tl.max(xn, axis=0)
    return top, tl.min(tl.where(keep & (xn == top), offs, V), axis=0)


@triton.jit
def _row_ticket(TICK, b):
    """After the program's partial stores: whether it drew the last ticket of row ``b`` among ``tl.num_programs(1)``
    (that program then owns the row's end; the count is back at zero)."""
    tl.debug_barrier()  # every thread's stores before the release
    last = tl.atomic_add(TICK + b, 1, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1
    if last:
        tl.store(TICK + b, 0)
    return last


@triton.jit
def _row_first_max(PV, PI, b64, CHUNKS: tl.constexpr, CP: tl.constexpr, V):
    """The row's first maximum from its chunks' ``(largest, first index)`` partials ``PV, PI [B, CHUNKS]``: the first
    chunk holding the largest (chunks in order), its index -- 0 for a row of -inf everywhere, as argmax."""
    cs = tl.arange(0, CP)
    cm = cs < CHUNKS
    tops = tl.load(PV + b64 * CHUNKS + cs, mask=cm, other=float("-inf"), cache_modifier=".cg")
    firsts = tl.load(PI + b64 * CHUNKS + cs, mask=cm, other=V, cache_modifier=".cg")
    token = tl.min(tl.where(cm & (tops == tl.max(tops, axis=0)), firsts, V), axis=0)
    return tl.where(token < V, token, 0).to(tl.int64)
