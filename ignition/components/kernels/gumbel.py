"""The sampler's Gumbel-max draw in one launch (``flare::gumbel_argmax``, :mod:`ignition.components.sampling`).

Grid (rows, chunks of ``CHUNK`` values): each program cuts its chunk (the values below the row's cut -inf, as the
sampler's ``masked_fill``), forms its noise -- the counter-based hash of (row seed, row step, vocabulary index) of
``sampling.uniform_noise``, in uint32 lanes, the same bits -- and its first maximum of ``filtered - log(-log u)``;
then draws a ticket of its row (a CTA barrier, one acq_rel add at GPU scope: CUTLASS's semaphore pattern), and the
program drawing the row's last ticket reads every chunk's maximum (through L2), keeps the first largest, writes the
token and puts the count back to zero for the next launch.  Where Inductor traces the same expression as three
launches and part of a fourth (the row keys; the cut, noise and logs; the two stages of ``argmax_last``).

With ``FINISH`` (``flare::draw_finish_``) that last program also ends the sampler: the row's token is its greedy one
for a greedy row, the drawn one else, ``pad`` for an inactive row, and an active row counts its token and steps once
(``sampling.advance``) -- where Inductor traced the choice and the state update as four launches after the draw.  The
row's other programs read its step (their noise keys) before their tickets, so the step moves only after every read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignition.components.kernels.launch import SAMPLER_PDL, _pdl_enter, pdl_if, zeroed_counts
from ignition.components.kernels.row_reduce import _chunk_first_max, _row_first_max, _row_ticket
from ignition.components.kernels.sampler_done import _all_rows_done, _row_done

#: Values per program, and its warps (offline sm90, ``scripts/sm90_kernel_check.py``: 80 registers at 8 warps, 139 at
#: 4 -- 16 values per thread instead of 32 -- 3 programs per SM either way).
GUMBEL_CHUNK = 4096
GUMBEL_WARPS = 8

_COUNTS: dict[tuple[str, int], torch.Tensor] = {}


@triton.jit
def _mix32(x):
    """lowbias32 (``sampling._mix32``) on uint32 lanes: the products wrap modulo 2**32 as the reference's do."""
    x = x ^ (x >> 16)
    x = x * tl.full((), 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full((), 0x846CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _row_keys(SEED, step, b):
    """Row ``b``'s two noise keys (``sampling.uniform_noise``) from its ``step`` (loaded), then its seed's high and
    low words."""
    seed = tl.load(SEED + b)
    lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    key = _mix32(_mix32(_mix32((step & 0xFFFFFFFF).to(tl.uint32) ^ tl.full((), 0x9E3779B9, tl.uint32)) ^ hi) ^ lo)
    return key, _mix32(key ^ tl.full((), 0x85EBCA6B, tl.uint32))


@triton.jit
def _finish_row(OUT, COUNTS, STEP, b64, step, greedy, is_greedy, active, drawn, V, stride_c, pad):
    """Row ``b64``'s token (``greedy`` where ``is_greedy``, else ``drawn``; ``pad`` when not ``active``) into
    ``OUT``; an active row counts its token in ``COUNTS`` and steps once in ``STEP`` (``sampling.sample`` and
    ``advance``).  Every program loads the row's values with its chunk, before its ticket, and the count goes up by
    a relaxed atomic add whose result nothing waits for: after the ticket the program's one round trip is the
    partials' (offline sm90 PTX: three more in series before -- the row's values, the count's slot, the step)."""
    token = tl.where(is_greedy, greedy, drawn)
    tl.store(OUT + b64, tl.where(active, token, pad))
    if active:
        tl.atomic_add(COUNTS + b64 * stride_c + tl.minimum(tl.maximum(token, 0), V - 1), 1, sem="relaxed")
        tl.store(STEP + b64, step + 1)


@triton.jit
def _gumbel_argmax_kernel(Y, CUT, SEED, STEP, PV, PI, CNT, OUT, V, stride_y, GREEDY, TEMP, ACTIVE, COUNTS, stride_c,
                          eps, pad, CHUNK: tl.constexpr, CHUNKS: tl.constexpr, CP: tl.constexpr,
                          FINISH: tl.constexpr = False, USE_PDL: tl.constexpr = False, TOPK=None, TOPP=None,
                          MINP=None, B=1, BP: tl.constexpr = 1, SKIP_DONE: tl.constexpr = False):
    b = tl.program_id(0)
    row_done = tl.full((), 0, tl.int1)
    if SKIP_DONE:  # (FINISH) the front ended the done rows (sampler_done); none left: return before the wait
        if _all_rows_done(TEMP, TOPK, TOPP, MINP, B, V, eps, BP):
            return
        row_done = _row_done(TEMP, TOPK, TOPP, MINP, b, V, eps)
    _pdl_enter(USE_PDL)  # kernels.launch.SAMPLER_PDL
    if not row_done:
        _gumbel_row_chunk(Y, CUT, SEED, STEP, PV, PI, CNT, OUT, V, stride_y, GREEDY, TEMP, ACTIVE, COUNTS, stride_c,
                          eps, pad, b, CHUNK, CHUNKS, CP, FINISH)


@triton.jit
def _gumbel_row_chunk(Y, CUT, SEED, STEP, PV, PI, CNT, OUT, V, stride_y, GREEDY, TEMP, ACTIVE, COUNTS, stride_c, eps,
                      pad, b, CHUNK: tl.constexpr, CHUNKS: tl.constexpr, CP: tl.constexpr, FINISH: tl.constexpr):
    """Program (``b``, its chunk) of :func:`_gumbel_argmax_kernel`: the chunk's partial, the row's ticket, and for
    the last program the row's token (and with ``FINISH`` its end)."""
    c = tl.program_id(1)
    b64 = b.to(tl.int64)
    step = tl.load(STEP + b64)
    key, key2 = _row_keys(SEED, step, b64)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    keep = offs < V
    y = tl.load(Y + b64 * stride_y + offs, mask=keep, other=float("-inf"))
    y = tl.where(y < tl.load(CUT + b), float("-inf"), y)  # a NaN stays, as masked_fill(y < cut) leaves it
    h = _mix32(_mix32(offs.to(tl.uint32) ^ key) ^ key2)
    u = ((h >> 8) | 1).to(tl.float32) * (2.0 ** -24)
    top, first = _chunk_first_max(y - tl.log(-tl.log(u)), offs, keep, V)
    tl.store(PV + b64 * CHUNKS + c, top)
    tl.store(PI + b64 * CHUNKS + c, first)
    if FINISH:  # the last program's row values, read by every program before its ticket (see _finish_row)
        greedy = tl.load(GREEDY + b64)
        is_greedy = tl.load(TEMP + b64) < eps  # a NaN temperature draws, as before
        active = tl.load(ACTIVE + b64) != 0
    if _row_ticket(CNT, b):
        drawn = _row_first_max(PV, PI, b64, CHUNKS, CP, V)
        if FINISH:
            _finish_row(OUT, COUNTS, STEP, b64, step, greedy, is_greedy, active, drawn, V, stride_c, pad)
        else:
            tl.store(OUT + b, drawn)


def gumbel_argmax_triton(scaled: torch.Tensor, cut: torch.Tensor, seed: torch.Tensor, step: torch.Tensor, *,
                         chunk: int = GUMBEL_CHUNK, finish: tuple | None = None,
                         out: torch.Tensor | None = None, skip_done: tuple | None = None) -> torch.Tensor:
    """``flare::gumbel_argmax`` on the GPU (or the interpreter): ``scaled [B, V]`` float32, ``cut [B]`` float32,
    ``seed, step [B]`` int64 -> ``[B]`` int64 (shapes checked by the op).  ``finish``: ``(greedy [B] int64,
    temperature [B] float32, active [B] bool, counts [B, V] int32 (rows contiguous), greedy_eps, pad)`` --
    ``flare::draw_finish_``: the tokens are the sampler's, and ``counts`` and ``step`` advance in place.  ``out``: a
    contiguous ``[B]`` int64 the tokens go to (default a new one).  ``skip_done``: ``(top_k [B] int32, top_p [B]
    float32, min_p [B] float32)`` with ``finish`` -- the rows done after the front (``sampler_done``, which ended them)
    are skipped, their tokens, counts and steps left as they are (``flare::sample_advance_into_``)."""
    b, v = scaled.shape
    out = torch.empty(b, dtype=torch.int64, device=scaled.device) if out is None else out
    if b == 0:
        return out
    if scaled.stride(-1) != 1:
        scaled = scaled.contiguous()
    chunks = triton.cdiv(v, chunk)
    pv = torch.empty((b, chunks), dtype=torch.float32, device=scaled.device)
    pi = torch.empty((b, chunks), dtype=torch.int32, device=scaled.device)
    counts = zeroed_counts(_COUNTS, scaled.device, b)
    greedy, temperature, active, state, eps, pad = finish or (out, cut, out, out, 0.0, 0)
    if skip_done is not None and finish is None:
        raise ValueError("gumbel_argmax_triton: skip_done needs finish (the done rows' temperatures)")
    top_k, top_p, min_p = skip_done or (out, cut, cut)
    _gumbel_argmax_kernel[(b, chunks)](scaled, cut, seed, step, pv, pi, counts, out, v, scaled.stride(0), greedy,
                                       temperature, active, state, state.stride(0), eps, pad, CHUNK=chunk,
                                       CHUNKS=chunks, CP=triton.next_power_of_2(chunks), FINISH=finish is not None,
                                       num_warps=GUMBEL_WARPS, TOPK=top_k, TOPP=top_p, MINP=min_p, B=b,
                                       BP=triton.next_power_of_2(b), SKIP_DONE=skip_done is not None,
                                       **pdl_if(scaled.device, "FLARE_SAMPLER_PDL", SAMPLER_PDL))
    return out
