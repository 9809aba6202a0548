"""Top-k values of each row (``flare::topk_values``, ``ignition/components/topk.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# ------------------------------------------------------------------------------------------------------------
# Top-k values of each row (``flare::topk_values``, ``ignition/components/topk.py``): pass 1, grid (B, chunks), keeps
# the KP largest of each CHUNK-entry chunk of the row (``tl.topk``: bitonic top-k, padding -inf); pass 2, grid (B,),
# the KP largest of the row's chunks * KP candidates, of which the first k are stored.  Values only, selected and never
# computed: the result is ``torch.topk(x, k).values`` (descending).

@triton.jit
def _topk_chunk_kernel(X, WS, V, stride_x, CHUNK: tl.constexpr, KP: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(X + b * stride_x + offs, mask=offs < V, other=float("-inf"))
    top = tl.topk(x, KP)
    tl.store(WS + (b * tl.num_programs(1) + c) * KP + tl.arange(0, KP), top)


@triton.jit
def _topk_merge_kernel(WS, Out, N, K, stride_o, NP: tl.constexpr, KP: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, NP)
    x = tl.load(WS + b * N + offs, mask=offs < N, other=float("-inf"))
    top = tl.topk(x, KP)
    o = tl.arange(0, KP)
    tl.store(Out + b * stride_o + o, top, mask=o < K)


#: Entries per pass-1 program of :func:`topk_values_triton` (at most): a 151,936-entry vocabulary is 38 chunks, so
#: pass 2 ranks 38 * 64 candidates for k = 64 -- both passes about the same size.
TOPK_CHUNK = 4096


def topk_values_triton(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x [B, V]`` float32 -> ``[B, k]``: each row's ``k`` largest values, descending (``torch.topk(x, k).values``);
    two launches (see above).  Shapes are checked by the op (``topk.py``)."""
    b, v = x.shape
    out = torch.empty((b, k), dtype=x.dtype, device=x.device)
    if b == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    kp = max(2, triton.next_power_of_2(k))  # tl.topk keeps at least 2 (k = 1: the first of the top 2)
    chunk = max(kp, min(TOPK_CHUNK, triton.next_power_of_2(v)))
    n = triton.cdiv(v, chunk)
    ws = torch.empty((b, n, kp), dtype=x.dtype, device=x.device)
    _topk_chunk_kernel[(b, n)](x, ws, v, x.stride(0), CHUNK=chunk, KP=kp, num_warps=8)
    _topk_merge_kernel[(b,)](ws, out, n * kp, k, out.stride(0), NP=triton.next_power_of_2(n * kp), KP=kp,
                             num_warps=8)
    return out
