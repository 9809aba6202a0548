"""The sampler's front in two launches (``flare::sampler_front``, :mod:`ignition.components.sampling`): penalties,
temperature, the greedy token and the min-p mask of ``sampling.filter_cut``.

Launch 1, grid (rows, chunks of ``CHUNK`` values): each program reads its chunk of the logits (and of the penalty
state), forms the penalized values ``x`` and the scaled ``y = x / t`` exactly as ``apply_penalties`` and
``apply_temperature`` do, stores ``y``, and its chunk's first maximum of ``x`` and maximum of ``y``; then a ticket of its
row (a CTA barrier, one acq_rel add at GPU scope), and the program drawing the row's last ticket reads every chunk's
(through L2): the greedy token (the first maximum, NaN the largest as argmax's) and the min-p floor (the row maximum of
``y`` plus ``log(min_p)``; none where a NaN made torch's ``amax`` NaN).  Launch 2, the same grid: the values below
their row's floor become -inf (``apply_min_p``'s ``masked_fill``; a row of min-p 0 skipped).  Where Inductor traces
the same expressions as about seven launches (the penalties, the split ``amax``, the mask, the first stage of the
greedy argmax).  With ``draw`` (``flare::sample_advance_into_``) launch 1 also forms each chunk's Gumbel-max partial and
ends the rows nothing after it changes (``sampler_done``): their tokens, counts and steps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from ignition.components.kernels.gumbel import _finish_row, _mix32, _row_keys
from ignition.components.kernels.launch import SAMPLER_PDL, _pdl_enter, pdl_if, zeroed_counts
from ignition.components.kernels.row_reduce import _chunk_first_max, _row_first_max, _row_ticket
from ignition.components.kernels.sampler_done import _all_rows_done, _row_done

#: Values per program, and its warps: offline sm90 (``scripts/sm90_kernel_check.py``; the IEEE divisions take the
#: registers) 92 registers, 2 programs per SM -- 4096 values at 8 warps took 172 registers, 1 per SM; at 16 warps 92,
#: 1 per SM.  Qwen3's vocabulary: 75 programs per row.
FRONT_CHUNK = 2048
FRONT_WARPS = 8
#: Chunks per row at most (the final program reads them all at once).
FRONT_MAX_CHUNKS = 256

_COUNTS: dict[tuple[str, int], torch.Tensor] = {}


@triton.jit
def _front_kernel(X, CNT, PM, REP, FREQ, PRES, TEMP, Y, PY, PX, PI, TICK, GREEDY, YMAX, V, stride_x, stride_c,
                  stride_p, stride_y, GREEDY_EPS: tl.constexpr, HAS_PEN: tl.constexpr, CHUNK: tl.constexpr,
                  CHUNKS: tl.constexpr, CP: tl.constexpr, USE_PDL: tl.constexpr = False, SEED=None, STEP=None,
                  TOPK=None, TOPP=None, MINP=None, ACTIVE=None, OUT=None, PZ=None, PZI=None, pad=0,
                  DRAW: tl.constexpr = False):
    # DRAW (``flare::sample_advance_into_``; the penalty state's counts in CNT): each program also forms its chunk's
    # Gumbel-max partial (``gumbel._gumbel_argmax_kernel``'s noise and first maximum over the uncut row), and the
    # program drawing the row's last ticket ends a done row (``sampler_done``) -- its token, count and step, as the
    # draw's finish does -- where the launches after it skip that row.  Its reads other than the logits come before
    # the wait (with the noise and its logs): the penalty state, the rows' parameters, seeds and steps are the
    # sampler's own -- written by the host or by earlier steps, never by a kernel of this step before the front
    # (``kernels.launch``'s rules) -- so only the logits' round trip is left after it, as the head ends.
    b = tl.program_id(0)
    c = tl.program_id(1)
    b64 = b.to(tl.int64)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    keep = offs < V
    if DRAW:
        counts, prompt, rep, freq, pres, t = _front_row(CNT, PM, REP, FREQ, PRES, TEMP, b, b64, offs, keep, stride_c,
                                                        stride_p)
        step, noise, done, active = _draw_row(SEED, STEP, TEMP, TOPK, TOPP, MINP, ACTIVE, b, b64, offs, V,
                                              GREEDY_EPS)
    _pdl_enter(USE_PDL)  # kernels.launch.SAMPLER_PDL
    x = tl.load(X + b64 * stride_x + offs, mask=keep, other=0.0).to(tl.float32)
    if not DRAW:
        if HAS_PEN:
            counts, prompt, rep, freq, pres, t = _front_row(CNT, PM, REP, FREQ, PRES, TEMP, b, b64, offs, keep,
                                                            stride_c, stride_p)
        else:
            t = tl.load(TEMP + b)
    if HAS_PEN:  # apply_penalties: repetition (prompt or output tokens), then frequency and presence
        seen = counts > 0
        rep = tl.where(seen | prompt, rep, 1.0)
        x = tl.where(x > 0, tl.math.div_rn(x, rep), x * rep)  # IEEE division, as torch's (Triton's "/" is not)
        x = x - freq * counts.to(tl.float32) - pres * seen.to(tl.float32)
    y = tl.math.div_rn(x, tl.where(t < GREEDY_EPS, 1.0, t))  # apply_temperature: greedy rows divide by 1
    tl.store(Y + b64 * stride_y + offs, y, mask=keep)
    top, first = _chunk_first_max(x, offs, keep, V)
    tl.store(PX + b64 * CHUNKS + c, top)
    tl.store(PI + b64 * CHUNKS + c, first)
    tl.store(PY + b64 * CHUNKS + c, _nan_max(y, keep))
    if DRAW:  # the chunk's draw (before the ticket: the last program moves the step)
        ztop, zfirst = _chunk_first_max(y - noise, offs, keep, V)
        tl.store(PZ + b64 * CHUNKS + c, ztop)
        tl.store(PZI + b64 * CHUNKS + c, zfirst)
    if _row_ticket(TICK, b):  # the scaled maxima loaded first: in flight with the greedy's partials (offline sm90
        cs = tl.arange(0, CP)  # PTX: they were loaded after the greedy token's store, a second round trip in series)
        tops = tl.load(PY + b64 * CHUNKS + cs, mask=cs < CHUNKS, cache_modifier=".cg")
        greedy = _row_first_max(PX, PI, b64, CHUNKS, CP, V)
        if DRAW:
            drawn = _row_first_max(PZ, PZI, b64, CHUNKS, CP, V)  # its partials in flight with the greedy's
        tl.store(GREEDY + b, greedy)
        tl.store(YMAX + b, _nan_max(tops, cs < CHUNKS))
        if DRAW:
            if done:
                _finish_row(OUT, CNT, STEP, b64, step, greedy, t < GREEDY_EPS, active, drawn, V, stride_c, pad)


@triton.jit
def _front_row(CNT, PM, REP, FREQ, PRES, TEMP, b, b64, offs, keep, stride_c, stride_p):
    """The penalty state of program (``b``, its chunk ``offs``) and the row's penalties and temperature: ``(counts,
    prompt, repetition, frequency, presence, temperature)``."""
    counts = tl.load(CNT + b64 * stride_c + offs, mask=keep, other=0)
    prompt = tl.load(PM + b64 * stride_p + offs, mask=keep, other=0) != 0
    return counts, prompt, tl.load(REP + b), tl.load(FREQ + b), tl.load(PRES + b), tl.load(TEMP + b)


@triton.jit
def _draw_row(SEED, STEP, TEMP, TOPK, TOPP, MINP, ACTIVE, b, b64, offs, V, eps):
    """The draw's values of program (``b``, its chunk ``offs``): ``(step, log(-log u), done, active)`` -- the row's
    step, the logs of its noise (``gumbel._gumbel_argmax_kernel``'s, the same bits), whether the front ends it
    (``sampler_done``) and whether it is active."""
    step = tl.load(STEP + b64)
    key, key2 = _row_keys(SEED, step, b64)
    h = _mix32(_mix32(offs.to(tl.uint32) ^ key) ^ key2)
    u = ((h >> 8) | 1).to(tl.float32) * (2.0 ** -24)
    return step, tl.log(-tl.log(u)), _row_done(TEMP, TOPK, TOPP, MINP, b, V, eps), tl.load(ACTIVE + b64) != 0


@triton.jit
def _nan_max(y, keep):
    """The largest of ``y`` where ``keep`` -- NaN when one of them is NaN, as torch's ``amax`` (Triton's ``max`` leaves
    it unspecified)."""
    top = tl.max(tl.where(keep & (y == y), y, float("-inf")), axis=0)
    return tl.where(tl.max(tl.where(keep & (y != y), 1, 0), axis=0) > 0, float("nan"), top)


@triton.jit(do_not_specialize=["early"])
def _min_p_kernel(Y, YMAX, MINP, V, stride_y, CHUNK: tl.constexpr, USE_PDL: tl.constexpr = False, TEMP=None,
                  TOPK=None, TOPP=None, B=1, eps=0.0, early=0, BP: tl.constexpr = 1, DONE: tl.constexpr = False):
    """apply_min_p: the values below ``amax + log(min_p)`` -inf, in place (a NaN maximum masks nothing).  A row of
    min-p 0 (or NaN) masks nothing -- ``log(0)`` is -inf -- and is skipped: its min-p is read before the wait (the
    front, before this launch, does not write it: ``kernels.launch``'s rules), its values not at all.

    ``DONE`` with ``early`` nonzero (``flare::sample_advance_into_`` captured with ``FLARE_SAMPLER_EARLY_SKIP``): when
    every row is done after the front (``sampler_done``) the launch lets its dependents launch and returns, before its
    wait (a done row has min-p 0: nothing to mask) -- the launches after it return before theirs too, so they run while
    the front does instead of after it, and the front is the step's last launch to complete (``sampling.EARLY_SKIP``
    says what that asks of a captured graph)."""
    b = tl.program_id(0)
    mp = tl.load(MINP + b, cache_modifier=".cg")
    if USE_PDL:
        if DONE:
            if early != 0:
                if _all_rows_done(TEMP, TOPK, TOPP, MINP, B, V, eps, BP):
                    gdc_launch_dependents()
                    return
    _pdl_enter(USE_PDL)
    if mp > 0:
        offs = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
        keep = offs < V
        row = Y + b.to(tl.int64) * stride_y + offs
        y = tl.load(row, mask=keep, other=0.0)
        floor = tl.load(YMAX + b) + tl.log(mp)
        tl.store(row, tl.where(y < floor, float("-inf"), y), mask=keep)


def sampler_front_triton(logits: torch.Tensor, counts: torch.Tensor | None, prompt_mask: torch.Tensor | None,
                         repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor,
                         temperature: torch.Tensor, min_p: torch.Tensor, greedy_eps: float, *,
                         chunk: int = FRONT_CHUNK, draw: tuple | None = None,
                         early: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``flare::sampler_front`` on the GPU (or the interpreter) -> ``(greedy [B] int64, scaled [B, V] float32)``
    (arguments checked by the op).  ``draw``: ``(seed, step [B] int64, top_k [B] int32, top_p [B] float32, active [B]
    bool, out [B] int64, pad)`` -- the done rows (``sampler_done``) end here: their tokens into ``out``, counted in
    ``counts`` (needed: the penalty state) and their ``step`` advanced, in place (``flare::sample_advance_into_``);
    ``early`` (with ``draw``; captured only): when every row is done the min-p launch lets the next launch start and
    returns, both before its wait (:func:`_min_p_kernel`)."""
    b, v = logits.shape
    dev = logits.device
    scaled = torch.empty((b, v), dtype=torch.float32, device=dev)
    greedy = torch.empty(b, dtype=torch.int64, device=dev)
    if b == 0:
        return greedy, scaled
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    chunks = triton.cdiv(v, chunk)
    if chunks > FRONT_MAX_CHUNKS:
        raise ValueError(f"sampler_front: {v} values make {chunks} chunks of {chunk}, more than {FRONT_MAX_CHUNKS}")
    f32 = dict(dtype=torch.float32, device=dev)
    py, px, ymax = torch.empty((b, chunks), **f32), torch.empty((b, chunks), **f32), torch.empty(b, **f32)
    pi = torch.empty((b, chunks), dtype=torch.int32, device=dev)
    pen = counts is not None
    pdl = pdl_if(dev, "FLARE_SAMPLER_PDL", SAMPLER_PDL)
    cnt, pm = (counts, prompt_mask) if pen else (logits, logits)  # unused without penalties
    if draw is not None and not pen:
        raise ValueError("sampler_front_triton: draw needs the penalty state's counts (the done rows count there)")
    seed, step, top_k, top_p, active, out, pad = draw or (greedy, greedy, greedy, ymax, greedy, greedy, 0)
    pz, pzi = (torch.empty_like(px), torch.empty_like(pi)) if draw is not None else (px, pi)
    _front_kernel[(b, chunks)](logits, cnt, pm, repetition, frequency, presence, temperature, scaled, py, px, pi,
                               zeroed_counts(_COUNTS, dev, b), greedy, ymax, v, logits.stride(0),
                               cnt.stride(0), pm.stride(0), scaled.stride(0), GREEDY_EPS=greedy_eps, HAS_PEN=pen,
                               CHUNK=chunk, CHUNKS=chunks, CP=triton.next_power_of_2(chunks), num_warps=FRONT_WARPS,
                               SEED=seed, STEP=step, TOPK=top_k, TOPP=top_p, MINP=min_p, ACTIVE=active, OUT=out,
                               PZ=pz, PZI=pzi, pad=pad, DRAW=draw is not None, **pdl)
    done = dict(TEMP=temperature, TOPK=top_k, TOPP=top_p, B=b, eps=greedy_eps, early=int(early),
                BP=triton.next_power_of_2(b), DONE=True) if draw is not None else {}
    _min_p_kernel[(b, chunks)](scaled, ymax, min_p, v, scaled.stride(0), CHUNK=chunk, num_warps=FRONT_WARPS, **done,
                               **pdl)
    return greedy, scaled
