"""The sampler's top-k / top-p cut without sorting the vocabulary (``flare::sampling_cut``).

The general sampler (``SamplingTensors.max_top_k`` unset) keeps, per row, the values ``>= cut`` of the
temperature-scaled, min-p-masked logits ``y [B, V]``, where ``cut = max(K, P)``:

- ``K``: the ``top_k``-th largest value (with multiplicity) when ``1 <= top_k < V``, else ``-inf``;
- ``P``: when ``top_p < 1``, the smallest value whose probability mass *strictly above* it (probabilities over
  the values ``>= K``) is ``< top_p`` -- the last value of the smallest descending prefix reaching ``top_p``;
  else ``-inf``.

:func:`sampling_cut_reference` states it by sorting (the sampler's full-sort path, :mod:`sampling`).  With
``FLARE_SAMPLER_PREFIX=N`` (default off: ``GENERAL_PREFIX`` says why) the CUDA sampler takes the top ``N`` values of
each row (``flare::topk_values``, two launches) and cuts rows
with ``1 <= top_k <= N`` there exactly as the bounded variant does; this op cuts the other rows --
``top_k`` off or larger than the prefix -- and skips the rest (``skip``: their cut is ``-inf``, the caller's
prefix cut replaces it).  Its Triton kernel (one program per row) never sorts: ``K`` and ``P`` are the largest
32-bit order-preserving keys ``t`` whose count (``K``: ``#{key >= t} >= top_k``) or mass (``P``:
``sum exp(y - max) over key >= max(t, key(K))`` ``>= top_p * Z``) reaches the target, built bit by bit from the
top; each pass reads only the values sharing the bits chosen so far, compacted into a workspace row once they
are at most half of what the pass before read.  Counts are exact, so ``K`` is the reference's bit for bit; the
masses are fp32 sums in the kernel's own fixed order (deterministic, every run and batch the same), so ``P`` can
differ from the sorted reference's only where the mass above a value is within rounding of ``top_p``.
"""

from __future__ import annotations

from typing import Optional

import torch

from ignition.components.custom_ops import opaque_op
from ignition.components.switches import switch, whole

__all__ = ["sampling_cut", "sampling_cut_compact", "sampling_cut_reference", "sorted_cut", "sorted_cut_op",
           "sorted_cut_reference", "top_k_threshold", "top_p_threshold", "general_prefix", "sort_free",
           "GENERAL_PREFIX", "MEASURED_PREFIX", "SORTED_CUT_KERNEL", "SORT_FREE"]

#: Values per row the CUDA general sampler ranks with ``flare::topk_values`` before cutting (``FLARE_SAMPLER_PREFIX=N``
#: sets it): rows with ``1 <= top_k <= N`` are cut there, the others by :func:`sampling_cut`'s kernel.  Default 0: the
#: full sort of every row.  Measured on the H200 (``scripts/bench_sampler.py``, runs 43-46, one 151,936-value row):
#: with 64 the sampler takes 50 us instead of 92 at batch 1 and 74 instead of 163 at batch 4 when every row's top_k is
#: within the 64 (Qwen3-0.6B's decode step 1.049x / 1.065x faster, Qwen3-8B's 4.6489 / 4.9986 ms against 4.7326 /
#: 5.1042 in run 37) -- but the kernel's searches take 340 us (top_k 1000) to 450 us (top_k off, top_p 0.95) per row
#: where the sort takes 92: a step with such a row would be 3.5-5x slower in its sampler.  Batches whose rows all fit
#: a bound get the same speed without that risk from the bounded graph variant (``--topk-variant``), which the serving
#: engine selects per batch; so the general graph keeps the sort until the kernel's searches beat it.
GENERAL_PREFIX = 0

#: The prefix ``scripts/bench_sampler.py`` and the GPU tests run the route with.
MEASURED_PREFIX = 64

#: Whether the CUDA sampler cuts its sorted values with ``flare::sorted_cut`` (one Triton program per row) instead of
#: the traced softmax / cumsum / count (about a dozen launches).  Measured on the H200 (``scripts/bench_sampler.py``,
#: one 151,936-value row per batch row, run 80): the general sampler 17-21 us faster at batch 1 and 4 for greedy rows,
#: top_k 20 / top_p 0.95, top_k 1000 and top_k off without top-p (e.g. 91.9 -> 75.3 us, 161.4 -> 141.9 us) -- but 16-18
#: us slower for rows with top_k off and top_p 0.95 (its sequential scan of 1024-value blocks; with 4096 and the next
#: block in flight 96.0 against 93.9 us at batch 1, 157.3 against 161.2 at batch 4, run 81); Qwen3-0.6B's decode step
#: 0.977x (B=1) and 0.981x (B=4) side by side (``results/20261201T203600Z-sm90-run80``), the sampler region of the
#: step 110 -> 90 us (``results/20261201T204400Z-sm90-gpu-replay-0.6B``).
SORTED_CUT_KERNEL = True


def general_prefix() -> int:
    """:data:`GENERAL_PREFIX`, or ``FLARE_SAMPLER_PREFIX`` when set (read at each trace, for side-by-side runs)."""
    return whole("FLARE_SAMPLER_PREFIX", GENERAL_PREFIX, low=0)


def top_k_threshold(top_k: torch.Tensor, sorted_desc: torch.Tensor) -> torch.Tensor:
    """``[B]``: the ``top_k``-th of each row's ``n`` largest values ``sorted_desc [B, n]`` (descending); rows with
    ``top_k`` off (``<= 0``) or above ``n`` get the ``n``-th."""
    n = sorted_desc.shape[-1]
    k = torch.where((top_k <= 0) | (top_k > n), n, top_k).to(torch.int64)
    return sorted_desc.gather(1, (k - 1)[:, None])[:, 0]


def top_p_threshold(top_p: torch.Tensor, sorted_desc: torch.Tensor) -> torch.Tensor:
    """``[B]``: the last value of the smallest descending prefix of ``sorted_desc [B, n]`` whose probability mass
    reaches ``top_p`` (a value stays when the mass strictly above it is ``< top_p``; ``top_p >= 1`` keeps all).
    ``sorted_desc`` must carry every earlier mask (``-inf``) and hold every value that has mass."""
    probs = torch.softmax(sorted_desc, dim=-1)
    above = torch.nn.functional.pad(_cumsum_last(probs)[:, :-1], (1, 0))  # mass strictly above
    keep = (above < top_p[:, None]) | (top_p[:, None] >= 1.0)
    n_keep = keep.sum(dim=-1, keepdim=True).clamp_min(1)
    return sorted_desc.gather(1, n_keep - 1)[:, 0]


def sorted_cut(top_k: torch.Tensor, top_p: torch.Tensor, sorted_desc: torch.Tensor) -> torch.Tensor:
    """``[B]``: the cut (keep the values ``>=`` it) of rows whose kept values all lie in ``sorted_desc [B, n]`` (their
    ``n`` largest, descending; every row ``1 <= top_k <= n`` unless ``n`` is the whole row): the ``top_k``-th value or
    the top-p threshold over the values above it, whichever is larger.  With ``top_k`` off and ``top_p >= 1`` it is
    the ``n``-th value, which cuts nothing from a whole row.

    On CUDA the one-launch op ``flare::sorted_cut`` (:data:`SORTED_CUT_KERNEL`; ``FLARE_SORTED_CUT_KERNEL=0``, read
    at each trace: :func:`sorted_cut_reference` traced inline instead); elsewhere the reference."""
    if sorted_desc.is_cuda and switch("FLARE_SORTED_CUT_KERNEL", SORTED_CUT_KERNEL):
        return sorted_cut_op(top_k, top_p, sorted_desc)
    return sorted_cut_reference(top_k, top_p, sorted_desc)


def sorted_cut_reference(top_k: torch.Tensor, top_p: torch.Tensor, sorted_desc: torch.Tensor) -> torch.Tensor:
    """:func:`sorted_cut` as torch operations: the k-th value, a masked softmax, its cumsum, a count, a gather."""
    kth = top_k_threshold(top_k, sorted_desc)
    return torch.maximum(kth, top_p_threshold(top_p, sorted_desc.masked_fill(sorted_desc < kth[:, None],
                                                                              float("-inf"))))


def _cumsum_last(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """Inclusive cumsum over the last dim as two short scans (within blocks of ``block``, then over
    block totals).  Inductor in torch 2.11 fails to generate code for one 150k-long scan on CUDA
    (SplitScan); short scans compile everywhere."""
    b, v = x.shape
    n = -(-v // block)
    blocks = torch.nn.functional.pad(x, (0, n * block - v)).view(b, n, block)
    inner = torch.cumsum(blocks, dim=-1)
    offsets = torch.cumsum(inner[:, :, -1], dim=-1) - inner[:, :, -1]  # exclusive over blocks
    return (inner + offsets[:, :, None]).view(b, n * block)[:, :v]


def _check(y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, skip: torch.Tensor,
           skip_below: float | None = None) -> None:
    if y.dim() != 2 or y.dtype != torch.float32:
        raise ValueError(f"sampling_cut: y must be a [B, V] float32 tensor, got {tuple(y.shape)} {y.dtype}")
    b = y.shape[0]
    for name, t, dtype in (("top_k", top_k, torch.int32), ("top_p", top_p, torch.float32),
                           ("skip", skip, torch.bool if skip_below is None else torch.float32)):
        if tuple(t.shape) != (b,) or t.dtype != dtype:
            raise ValueError(f"sampling_cut: {name} must be a [{b}] {dtype} tensor, got {tuple(t.shape)} {t.dtype}")


def sampling_cut_reference(y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, skip: torch.Tensor,
                           skip_below: float | None = None) -> torch.Tensor:
    """The cut by sorting each row (module docstring): ``max(K, P)``, ``-inf`` for skipped rows (the op's CPU
    path; ``skip_below``: ``skip`` is float32 and a row is skipped where it is below that)."""
    _check(y, top_k, top_p, skip, skip_below)
    skip = skip if skip_below is None else skip < skip_below
    cut = sorted_cut_reference(top_k, top_p, torch.sort(y, dim=-1, descending=True).values)
    cuts = ((top_k >= 1) & (top_k < y.shape[1])) | (top_p < 1.0)
    return torch.where(cuts & ~skip, cut, float("-inf"))


def _fake(y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, skip: torch.Tensor,
          skip_below: float | None = None) -> torch.Tensor:
    return y.new_empty((y.shape[0],))


@opaque_op("sampling_cut", mutates_args=(), fake=_fake)
def sampling_cut(y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
    """``y [B, V]`` float32, ``top_k [B]`` int32, ``top_p [B]`` float32, ``skip [B]`` bool -> a new ``[B]``
    float32: each row keeps the values ``>= cut`` (module docstring); skipped rows ``-inf``.  CUDA: the sort-free
    Triton kernel; elsewhere the sorting reference."""
    return _cut_on_device("sampling_cut_triton", y, top_k, top_p, skip)


def _cut_on_device(kernel: str, y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, skip: torch.Tensor,
                   skip_below: float | None = None) -> torch.Tensor:
    """The cut ops' body: on CUDA the arguments checked and ``kernels.sampling_cut.<kernel>``; elsewhere the sorting
    reference (which checks them itself)."""
    if y.is_cuda:
        from ignition.components.kernels import sampling_cut as cut_kernels  # imports triton: CUDA only

        _check(y, top_k, top_p, skip, skip_below)
        more = {} if skip_below is None else {"skip_below": skip_below}
        return getattr(cut_kernels, kernel)(y, top_k, top_p, skip, **more)
    return sampling_cut_reference(y, top_k, top_p, skip, skip_below)


#: Whether the general sampler on CUDA cuts every row with :func:`sampling_cut_compact` (no sort;
#: ``FLARE_SAMPLER_SORT_FREE=0`` restores the full sort, read at each trace).  On: 1.7-3.6x faster than the full sort
#: on the peaked mixes of ``scripts/bench_sampler.py``, on a flat row (``hot-p95``) 1.18x faster at batch 4 and 1.09x
#: slower at batch 1, the same tokens (run 98); Qwen3-0.6B decode 0.942x / 0.936x at batch 1 / 4 (run 95).
SORT_FREE = True


def sort_free() -> bool:
    """:data:`SORT_FREE`, or ``FLARE_SAMPLER_SORT_FREE`` when set (read at each trace, for side-by-side runs)."""
    return switch("FLARE_SAMPLER_SORT_FREE", SORT_FREE)


@opaque_op("sampling_cut_compact", mutates_args=(), fake=_fake)
def sampling_cut_compact(y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, skip: torch.Tensor,
                         skip_below: Optional[float] = None) -> torch.Tensor:
    """:func:`sampling_cut` over many programs per row: chunk statistics, bin counts below the row max, the window
    of values that can hold the cut compacted and sorted (``kernels.sampling_cut.sampling_cut_compact_triton``, five
    launches; the one-program searches for a row whose window exceeds the buffer).  The same cut as
    :func:`sampling_cut` (counts exact, masses in its own fixed order); elsewhere the sorting reference.
    ``skip_below``: ``skip`` is a float32 ``[B]`` -- the sampler's temperatures -- and the rows where it is below that
    are skipped, tested by the kernels themselves (the greedy rows: no launch of its own forming their mask)."""
    return _cut_on_device("sampling_cut_compact_triton", y, top_k, top_p, skip, skip_below)


def _check_sorted(top_k: torch.Tensor, top_p: torch.Tensor, sorted_desc: torch.Tensor) -> None:
    if sorted_desc.dim() != 2 or sorted_desc.dtype != torch.float32 or sorted_desc.shape[1] == 0:
        raise ValueError(f"sorted_cut: sorted_desc must be a [B, n >= 1] float32 tensor, got "
                         f"{tuple(sorted_desc.shape)} {sorted_desc.dtype}")
    b = sorted_desc.shape[0]
    for name, t, dtype in (("top_k", top_k, torch.int32), ("top_p", top_p, torch.float32)):
        if tuple(t.shape) != (b,) or t.dtype != dtype:
            raise ValueError(f"sorted_cut: {name} must be a [{b}] {dtype} tensor, got {tuple(t.shape)} {t.dtype}")


def _fake_sorted(top_k: torch.Tensor, top_p: torch.Tensor, sorted_desc: torch.Tensor) -> torch.Tensor:
    return sorted_desc.new_empty((sorted_desc.shape[0],))


@opaque_op("sorted_cut", mutates_args=(), fake=_fake_sorted)
def sorted_cut_op(top_k: torch.Tensor, top_p: torch.Tensor, sorted_desc: torch.Tensor) -> torch.Tensor:
    """``top_k [B]`` int32, ``top_p [B]`` float32, ``sorted_desc [B, n]`` float32 (descending) -> a new ``[B]``
    float32: :func:`sorted_cut`.  CUDA: one Triton program per row (``kernels.sampling_cut.sorted_cut_triton``; its
    masses round in their own order: a cut may differ from the reference's only where the mass above a value is
    within rounding of ``top_p``); elsewhere :func:`sorted_cut_reference`."""
    _check_sorted(top_k, top_p, sorted_desc)
    if sorted_desc.is_cuda:
        from ignition.components.kernels.sampling_cut import sorted_cut_triton  # imports triton: CUDA only

        return sorted_cut_triton(top_k, top_p, sorted_desc)
    return sorted_cut_reference(top_k, top_p, sorted_desc)
