"""The decode-time projection on CUDA cores (``flare::fused_linear`` at one to a few rows): the GEMV kernel and its
prologue / epilogue helpers.  Configurations and the launcher are :mod:`.linear`'s."""

from __future__ import annotations

import triton
import triton.language as tl

from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ignition.components.kernels.launch import _pdl_enter, _prefetch_l1, _prefetch_l2, _probe_smid, _probe_stamp


# ------------------------------------------------------------------------------------------------------------
# Decode-time projection: y = x @ W^T for a handful of rows (GEMV, memory-bound on the weight stream), with an
# optional RMSNorm prologue, SiLU-gated epilogue (packed [gate; up] weight) and residual add (``flare::fused_linear``,
# ``ignition/components/fused_linear.py``, states the rounding points).
#
# Grid (cdiv(N_out, BN), cdiv(M, MP)): program (j, r) owns output columns j*BN .. j*BN+BN-1 for the MP rows of
# row block r.  It streams its [BN, BK] weight tile(s) over K once, multiplies every tile by all MP rows of x
# ([MP, BN, BK] broadcast) and accumulates elementwise into an fp32 tile of that shape; ONE tl.sum over BK at
# the end.  The fp32 summation order is therefore a function of (BK, the tile layout) only -- fixed by the
# config, which is a pure function of the shapes (``gemv_config``): no autotuning, no atomics, no split-K, so
# the same shapes give the same bits in every process.  With the norm prologue every program recomputes the
# row statistics from x (MP * K bf16, L2-resident) before its main loop.  K is a constexpr: one compile per
# layer shape, a static trip count (and Triton 3.6's interpreter cannot take a tensor bound in range()).


@triton.jit
def _gemv_x_tile(x_rows, NW, kk, xm, rstd, K: tl.constexpr, HAS_NORM: tl.constexpr, GATED_IN: tl.constexpr,
                 EVEN_K: tl.constexpr, CG: tl.constexpr = False):
    """The decode GEMV's input tile at columns ``kk``, ``[MP, BK]`` in x's dtype: x, or the gated input
    ``bf16(bf16(silu(gate)) * up)``, through the RMSNorm prologue (``rstd [MP]``) when ``HAS_NORM``; ``CG``: the
    input through L2 only (the MLP handoff's consumer: tiles other SMs store while it runs)."""
    cache: tl.constexpr = ".cg" if CG else ""
    if GATED_IN:  # x is the packed [gate; up] activation input: bf16(bf16(silu(gate)) * up), as Qwen3MLP
        gx = tl.load(x_rows + kk[None, :], mask=xm, other=0.0, cache_modifier=cache).to(tl.float32)
        ux = tl.load(x_rows + K + kk[None, :], mask=xm, other=0.0, cache_modifier=cache)
        ax = (gx / (1.0 + tl.exp(-gx))).to(ux.dtype)
        xv = (ax.to(tl.float32) * ux.to(tl.float32)).to(ux.dtype)
    else:
        xv = tl.load(x_rows + kk[None, :], mask=xm, other=0.0, cache_modifier=cache)  # [MP, BK] bf16
    if HAS_NORM:
        if EVEN_K:
            nw = tl.load(NW + kk)
        else:
            nw = tl.load(NW + kk, mask=kk < K, other=0.0)
        xv = _gemv_normed(xv, nw, rstd)
    return xv


@triton.jit
def _gemv_x_plain(x_rows, kk, m_mask, K: tl.constexpr):
    """A plain input tile at columns ``kk`` (masked past K), ``[MP, BK]`` -- the streamed loop's next one
    (``X_AHEAD``)."""
    return tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & (kk < K)[None, :], other=0.0)


@triton.jit
def _gemv_normed(xv, nw, rstd):
    """Qwen3RMSNorm of an input tile ``xv [MP, BK]`` with its weights ``nw [BK]`` (:func:`_gemv_normed_tile`)."""
    return _gemv_normed_tile(xv, nw[None, :], rstd)


@triton.jit
def _gemv_normed_tile(xv, nw, rstd):
    """Qwen3RMSNorm of an input tile ``xv [MP, BK]`` with its weights ``nw`` (``[1, BK]`` or ``[MP, BK]``, rows
    alike): bf16(x * rstd), then bf16(weight * that) with the product in fp32."""
    xh = (xv.to(tl.float32) * rstd[:, None]).to(xv.dtype)
    return (nw.to(tl.float32) * xh.to(tl.float32)).to(xv.dtype)


@triton.jit
def _gemv_whole_row(x_rows, NW, offs_k, m_mask, eps, K: tl.constexpr, BK: tl.constexpr, TILES: tl.constexpr):
    """The normed input tiles of a row whose ``TILES`` tiles of ``BK`` are its whole K (the norm prologue with every
    weight tile preloaded): x and the norm weights loaded once, together, and ``rstd`` summed from those tiles in
    :func:`_gemv_rstd`'s order -- the same values with one round trip instead of two.  Returns four tiles (the unused
    ones are the first again)."""
    xm = m_mask[:, None]
    x0 = tl.load(x_rows + offs_k[None, :], mask=xm, other=0.0)
    n0 = tl.load(NW + offs_k)
    x1, x2, x3, n1, n2, n3 = x0, x0, x0, n0, n0, n0
    if TILES >= 2:
        x1 = tl.load(x_rows + (BK + offs_k)[None, :], mask=xm, other=0.0)
        n1 = tl.load(NW + BK + offs_k)
    if TILES >= 3:
        x2 = tl.load(x_rows + (2 * BK + offs_k)[None, :], mask=xm, other=0.0)
        n2 = tl.load(NW + 2 * BK + offs_k)
    if TILES >= 4:
        x3 = tl.load(x_rows + (3 * BK + offs_k)[None, :], mask=xm, other=0.0)
        n3 = tl.load(NW + 3 * BK + offs_k)
    ss = tl.zeros(x0.shape, dtype=tl.float32)
    ss += x0.to(tl.float32) * x0.to(tl.float32)
    if TILES >= 2:
        ss += x1.to(tl.float32) * x1.to(tl.float32)
    if TILES >= 3:
        ss += x2.to(tl.float32) * x2.to(tl.float32)
    if TILES >= 4:
        ss += x3.to(tl.float32) * x3.to(tl.float32)
    rstd = _gemv_rstd_of(ss, eps, K)
    return (_gemv_normed(x0, n0, rstd), _gemv_normed(x1, n1, rstd), _gemv_normed(x2, n2, rstd),
            _gemv_normed(x3, n3, rstd))


@triton.jit
def _gemv_program(X, W, M, N_OUT, stride_x, stride_w, MP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Program (n block, row block)'s offsets, masks and row pointers: ``(offs_m, offs_n, offs_k, m_mask, n_mask,
    x_rows [MP, 1], w_rows [BN, 1])``."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * MP + tl.arange(0, MP)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    m_mask = offs_m < M
    n_mask = offs_n < N_OUT
    x_rows = X + offs_m.to(tl.int64)[:, None] * stride_x  # [MP, 1]
    w_rows = W + offs_n.to(tl.int64)[:, None] * stride_w  # [BN, 1]
    return offs_m, offs_n, offs_k, m_mask, n_mask, x_rows, w_rows


@triton.jit
def _gemv_masks(kk, m_mask, n_mask, K: tl.constexpr, EVEN_K: tl.constexpr):
    """``(x mask [MP, BK], weight mask [BN, BK])`` of the K tile at columns ``kk``."""
    if EVEN_K:
        xm = m_mask[:, None]
        wm = n_mask[:, None]
    else:
        xm = m_mask[:, None] & (kk < K)[None, :]
        wm = n_mask[:, None] & (kk < K)[None, :]
    return xm, wm


@triton.jit
def _gemv_prefetch(W, offs_n, N_OUT, stride_w, K: tl.constexpr, BK: tl.constexpr, PF_LINES: tl.constexpr,
                   FIRST: tl.constexpr, TILES: tl.constexpr, GATED: tl.constexpr):
    """L2 prefetch of weight tiles ``FIRST .. FIRST + TILES - 1`` of this program's rows (and their up halves when
    gated), one per 128-byte line (``PF_LINES`` per tile row), clamped to K."""
    n_c = tl.minimum(offs_n, N_OUT - 1).to(tl.int64)[:, None] * stride_w
    lines = tl.arange(0, PF_LINES) * (BK // PF_LINES)
    for i in tl.static_range(TILES):
        kl = tl.minimum((FIRST + i) * BK + lines, K - 1)[None, :]
        _prefetch_l2(W + n_c + kl)
        if GATED:
            _prefetch_l2(W + N_OUT * stride_w + n_c + kl)


@triton.jit
def _gemv_rstd_of(ss, eps, K: tl.constexpr):
    """``rstd [MP]`` from the elementwise fp32 sums of x^2 ``ss [MP, BK]`` (one sum at the end)."""
    return tl.math.rsqrt(tl.sum(ss, axis=1) / K + eps)


@triton.jit
def _gemv_rstd(x_rows, m_mask, offs_k, eps, K: tl.constexpr, MP: tl.constexpr, BK: tl.constexpr,
               HAS_NORM: tl.constexpr, STAGES: tl.constexpr = 0):
    """``rstd [MP]`` of the RMSNorm prologue: elementwise fp32 accumulation of x^2 over K chunks, one sum at the end
    (ones, unused, without the norm).  ``STAGES``: the chunk loop software-pipelined over that many stages (its loads
    asynchronous and in flight together -- without, the loop waits out one L2 round trip per chunk: offline sm90
    TTGIR, ``scripts/sm90_kernel_check.py``); 0: the plain loop (the same PTX as a ``range`` loop).  The same chunks
    in the same order, the same bits."""
    if HAS_NORM:
        ss = tl.zeros([MP, BK], dtype=tl.float32)
        for k0 in tl.range(0, K, BK, num_stages=STAGES):
            kk = k0 + offs_k
            xm = m_mask[:, None] & (kk < K)[None, :]
            xs = tl.load(x_rows + kk[None, :], mask=xm, other=0.0).to(tl.float32)
            ss += xs * xs
        rstd = _gemv_rstd_of(ss, eps, K)
    else:
        rstd = tl.full([MP], 1.0, dtype=tl.float32)
    return rstd


@triton.jit
def _gemv_epilogue(y, u, r, Y, offs_m, offs_n, m_mask, n_mask, stride_y, GATED: tl.constexpr,
                   HAS_RES: tl.constexpr, ROUND_TY: tl.constexpr = None, ACTIVE=None, HAS_ACTIVE: tl.constexpr = False):
    """From the fp32 sums ``y`` (and ``u``, the up half, when gated) ``[MP, BN]``: round; gated,
    ``bf16(bf16(silu(y)) * u)`` in fp32; ``+ residual`` (``r``, :func:`_gemv_residual`) rounded once; store.
    ``ROUND_TY``: the type rounded to when ``Y`` is wider (the head's fp32 logits: the bf16 result widened, exactly);
    ``HAS_ACTIVE``: the rows whose ``ACTIVE`` flag is off store zeros (the step's inactive rows)."""
    if ROUND_TY is None:
        out_ty = Y.dtype.element_ty
    else:
        out_ty = ROUND_TY
    y = y.to(out_ty)  # [MP, BN]: the projection, rounded
    if GATED:
        u = u.to(out_ty)
        g = y.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(out_ty)  # silu of the rounded gate, in fp32, rounded
        y = (act.to(tl.float32) * u.to(tl.float32)).to(out_ty)
    mask = m_mask[:, None] & n_mask[None, :]
    if HAS_RES:
        y = (r.to(tl.float32) + y.to(tl.float32)).to(out_ty)
    if HAS_ACTIVE:
        on = tl.load(ACTIVE + offs_m, mask=m_mask, other=0).to(tl.int32) != 0
        y = tl.where(on[:, None], y.to(Y.dtype.element_ty), 0.0)
    tl.store(Y + offs_m.to(tl.int64)[:, None] * stride_y + offs_n[None, :], y, mask=mask)
    return y


@triton.jit
def _gemv_weight_tile(w_rows, u_rows, i: tl.constexpr, offs_k, n_mask, BK: tl.constexpr, GATED: tl.constexpr,
                      EVICT_FIRST: tl.constexpr = False):
    """Weight tile ``i`` of the program's rows ``[BN, BK]`` (whole tiles: EVEN_K), and its up half when gated (else
    the same tile again, unused); ``EVICT_FIRST``: with the evict-first L2 priority, as the streamed tiles."""
    policy: tl.constexpr = "evict_first" if EVICT_FIRST else ""
    w = tl.load(w_rows + (i * BK + offs_k)[None, :], mask=n_mask[:, None], other=0.0, eviction_policy=policy)
    if GATED:
        u = tl.load(u_rows + (i * BK + offs_k)[None, :], mask=n_mask[:, None], other=0.0, eviction_policy=policy)
    else:
        u = w
    return w, u


@triton.jit
def _gemv_x_f32(xv, FLAT: tl.constexpr = False):
    """An input tile ``[MP, BK]`` (:func:`_gemv_x_tile`) as fp32 ``[MP, 1, BK]``, broadcast against a weight tile
    (its layout change: a CTA barrier -- the streamed loop converts before issuing the tile's weight loads); ``FLAT``
    (one row): ``[1, BK]`` as it is (:func:`_gemv_acc`)."""
    xf = xv.to(tl.float32)
    if not FLAT:
        xf = xf[:, None, :]
    return xf


@triton.jit
def _gemv_acc(MP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FLAT: tl.constexpr):
    """The elementwise fp32 accumulator: ``[MP, BN, BK]``, or ``[BN, BK]`` when ``FLAT`` (one row: the weight tiles'
    own shape, so the compiler keeps the weight loads' layout -- the 3-D one made every weight tile a layout change
    through shared memory, four CTA barriers per tile, and the x tile another; offline sm90 TTGIR)."""
    if FLAT:
        acc = tl.zeros([BN, BK], dtype=tl.float32)
    else:
        acc = tl.zeros([MP, BN, BK], dtype=tl.float32)
    return acc


@triton.jit
def _gemv_acc_sum(acc, FLAT: tl.constexpr):
    """The accumulator's sums over K, ``[MP, BN]``."""
    if FLAT:
        y = tl.sum(acc, axis=1)[None, :]
    else:
        y = tl.sum(acc, axis=2)
    return y


@triton.jit
def _gemv_tile_product(acc, acc_u, w, u, xf, GATED: tl.constexpr, FLAT: tl.constexpr = False):
    """``acc`` (and ``acc_u`` with the up half ``u`` when gated) plus a weight tile ``w [BN, BK]`` times its fp32
    input tile ``xf`` (:func:`_gemv_x_f32`), elementwise: every tile's step, preloaded or streamed."""
    acc += xf * _gemv_w_f32(w, FLAT)
    if GATED:
        acc_u += xf * _gemv_w_f32(u, FLAT)
    return acc, acc_u


@triton.jit
def _gemv_w_f32(w, FLAT: tl.constexpr):
    """A weight tile ``[BN, BK]`` as fp32, ``[1, BN, BK]`` against the 3-D accumulator (as it is when ``FLAT``)."""
    wf = w.to(tl.float32)
    if not FLAT:
        wf = wf[None, :, :]
    return wf


@triton.jit
def _gemv_x_whole_tile(x_rows, NW, i: tl.constexpr, offs_k, m_mask, rstd, K: tl.constexpr, BK: tl.constexpr,
                       HAS_NORM: tl.constexpr, GATED_IN: tl.constexpr):
    """The input tile of whole weight tile ``i`` (a preloaded one: EVEN_K)."""
    return _gemv_x_tile(x_rows, NW, i * BK + offs_k, m_mask[:, None], rstd, K, HAS_NORM, GATED_IN, True)


@triton.jit
def _gemv_residual(R, offs_m, offs_n, m_mask, n_mask, stride_r, HAS_RES: tl.constexpr):
    """The residual tile ``[MP, BN]`` the epilogue adds (HAS_RES; else a zero scalar, unused)."""
    if HAS_RES:
        r = tl.load(R + offs_m.to(tl.int64)[:, None] * stride_r + offs_n[None, :],
                    mask=m_mask[:, None] & n_mask[None, :], other=0.0)
    else:
        r = 0.0
    return r


# ------------------------------------------------------------------------------------------------------------
# The one-row MLP handoff (``kernels.linear.GEMV_HANDOFF``): the gate/up launch (the producer) counts, per
# ``FLAG_COLS``-column tile of the activation, the programs that stored their columns in ``FLAGS[tile]`` -- packed
# (ungated: gate and up halves alike; down, the consumer, takes the gated input) or gated (each program both halves of
# its columns and their SiLU product; down takes that activation as a plain input); down waits for each tile's count
# instead of the PDL wait, so its programs multiply the tiles gate/up has finished while gate/up's last programs still
# run.  Packed, a tile completes only once the grid's second half (the up rows) reaches it; gated, the tiles complete
# in the grid's order.  ``FLAGS[tiles]`` is the consumer's
# ticket: its last program puts every count back to zero for the next launch.  Publication is CUTLASS's semaphore
# pattern: the producer's threads meet at a CTA barrier after their stores, then one release add at GPU scope; the
# consumer reads the counts with acquire loads at GPU scope (``FENCE``: compiled -- the interpreter runs programs one
# after another, so a consumer finds every count complete) and its activation loads go through L2.


@triton.jit
def _handoff_signal(FLAGS, col0, HALF, FLAG_COLS: tl.constexpr):
    """The producer program whose output columns start at ``col0`` (of the packed ``[gate; up]``, ``HALF`` each; or
    of the gated activation, ``HALF`` its width): after its stores, one release add to its tile's count."""
    tl.debug_barrier()
    tl.atomic_add(FLAGS + (col0 % HALF) // FLAG_COLS, 1, sem="release", scope="gpu")


@triton.jit
def _handoff_ready(FLAGS, TILES: tl.constexpr, TARGET: tl.constexpr, FLAG_P2: tl.constexpr, FENCE: tl.constexpr):
    """How many leading tiles of the activation are complete (their counts reached ``TARGET``): one acquire load of
    every count (``FLAG_P2``: a power of two above ``TILES``; the buffer holds that many)."""
    idx = tl.arange(0, FLAG_P2)
    if FENCE:
        counts = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [FLAGS + idx],
                                           dtype=tl.int32, is_pure=False, pack=1)
    else:
        counts = tl.load(FLAGS + idx, mask=idx < TILES, other=0)
    return tl.min(tl.where((counts >= TARGET) & (idx < TILES), TILES, idx), axis=0)


@triton.jit
def _handoff_await(FLAGS, tile, ready, TILES: tl.constexpr, TARGET: tl.constexpr, FLAG_P2: tl.constexpr,
                   FENCE: tl.constexpr):
    """``ready`` (leading complete tiles known) once ``tile`` is among them: polls the counts until it is (each poll
    then a CTA barrier, so that every thread's later loads follow some thread's acquire); a count that never completes
    traps (a CUDA error, not a hang) after ~2**22 polls."""
    polls = 0
    while ready <= tile and (FENCE or polls < 1):  # the interpreter: the producer ran before, one poll
        ready = _handoff_ready(FLAGS, TILES, TARGET, FLAG_P2, FENCE)
        tl.debug_barrier()
        polls += 1
        if FENCE:
            if polls > (1 << 22):
                tl.inline_asm_elementwise("trap; mov.u32 $0, 0;", "=r,r", [polls], dtype=tl.int32, is_pure=False,
                                          pack=1)
    tl.device_assert(ready > tile, "handoff: an activation tile never completed")
    return ready


@triton.jit
def _handoff_release(FLAGS, TILES: tl.constexpr, FLAG_P2: tl.constexpr, PROGRAMS, FENCE: tl.constexpr):
    """The consumer program's ticket after its last poll; the last program puts the counts and the ticket back to 0,
    then fences at GPU scope (``FENCE``), before the launch's PDL trigger: the next MLP's consumer, which launches only
    after every program here triggered, must find zeros, not this MLP's complete counts."""
    tl.debug_barrier()
    ticket = tl.atomic_add(FLAGS + TILES, 1, sem="acq_rel", scope="gpu")
    if ticket == PROGRAMS - 1:
        idx = tl.arange(0, FLAG_P2)
        tl.store(FLAGS + idx, tl.zeros_like(idx), mask=idx <= TILES)
        if FENCE:
            tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r,r", [ticket], dtype=tl.int32,
                                      is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _fused_gemv_kernel(X, W, NW, R, Y, M, N_OUT, stride_x, stride_w, stride_r, stride_y, eps,
                       K: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr, GATED: tl.constexpr,
                       EVEN_K: tl.constexpr, GATED_IN: tl.constexpr, USE_PDL: tl.constexpr,
                       PREFETCH: tl.constexpr, PF_LINES: tl.constexpr, PRELOAD: tl.constexpr = 0,
                       X_FIRST: tl.constexpr = True, EARLY: tl.constexpr = False,
                       PROBE=None, HAS_PROBE: tl.constexpr = False, FLAT: tl.constexpr = False,
                       STREAM_STAGES: tl.constexpr = 0, PRELOAD_EVICT: tl.constexpr = False,
                       FLAGS=None, HANDOFF: tl.constexpr = 0, FLAG_COLS: tl.constexpr = 1, FLAG_TILES: tl.constexpr = 1,
                       FLAG_TARGET: tl.constexpr = 1, FLAG_P2: tl.constexpr = 2, FENCE: tl.constexpr = False,
                       X_AHEAD: tl.constexpr = False, NORM_L1: tl.constexpr = False, ROUND_TY: tl.constexpr = None,
                       ACTIVE=None, HAS_ACTIVE: tl.constexpr = False):
    # HANDOFF (one row; the MLP handoff above): 1, the producer -- the packed or gated gate/up, signalling its tile's
    # count after its store; 2, the consumer -- down, polling the counts (FLAG_TARGET programs per tile of FLAG_COLS =
    # BK columns) before each tile's input instead of waiting for the whole of gate/up, the PDL wait only before its
    # epilogue (it preloads no tiles: their inputs would be read before any poll).
    tl.static_assert(HANDOFF != 2 or PRELOAD == 0, "the handoff's consumer preloads no tiles")
    tl.static_assert(not X_AHEAD or (not HAS_NORM and not GATED_IN and HANDOFF == 0), "X_AHEAD: a plain input only")
    tl.static_assert(not NORM_L1 or HAS_NORM, "NORM_L1: a norm prologue")  # K: a power of two of 64-element lines
    prog = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)  # the timing probe's row (diagnostics only)
    _probe_stamp(PROBE, prog, 0, prog, HAS_PROBE)
    _probe_smid(PROBE, prog, HAS_PROBE)
    offs_m, offs_n, offs_k, m_mask, n_mask, x_rows, w_rows = _gemv_program(X, W, M, N_OUT, stride_x, stride_w, MP,
                                                                            BN, BK)
    if GATED:
        u_rows = W + (offs_n + N_OUT).to(tl.int64)[:, None] * stride_w  # the up half: rows N_OUT + n
    else:
        u_rows = w_rows  # unused

    # PRELOAD (EVEN_K; up to 4): the program's first PRELOAD weight tiles (and their up halves when gated) are loaded
    # into registers before the wait -- weights are never written in a step, so this is legal whatever the
    # predecessor -- and multiplied in order after it, with the loop's own x tiles (``_gemv_x_tile``): the same
    # tiles, the same elementwise accumulation order as without (the same bits with the 3-D accumulator; a whole-K
    # preload takes the 2-D one by default, ``GEMV_FLAT``, whose final sum over K groups the lanes otherwise).
    wp, up = (), ()  # the preloaded tiles and their up halves, in K order (tuples: static_range unrolls)
    for i in tl.static_range(PRELOAD):
        w_i, u_i = _gemv_weight_tile(w_rows, u_rows, i, offs_k, n_mask, BK, GATED, PRELOAD_EVICT)
        wp, up = wp + (w_i,), up + (u_i,)
    if USE_PDL:  # before the wait: L2 prefetch of this program's next weight tiles
        _gemv_prefetch(W, offs_n, N_OUT, stride_w, K, BK, PF_LINES, PRELOAD, PREFETCH, GATED)
        if NORM_L1:  # the norm weights' lines into L1 (:data:`linear.GEMV_NORM_L1`): read after the wait
            _prefetch_l1(NW + tl.arange(0, K // 64) * 64)
    if HAS_PROBE and PRELOAD >= 1:  # stamp 1: the preloaded tiles arrived (the first and the last of them)
        arrived = tl.sum(tl.sum(wp[0].to(tl.float32) + wp[PRELOAD - 1].to(tl.float32), axis=1), axis=0)
        _probe_stamp(PROBE, prog, 1, arrived.to(tl.int32, bitcast=True), HAS_PROBE)
    else:
        _probe_stamp(PROBE, prog, 1, prog, HAS_PROBE)
    ready = tl.full([], 0, tl.int32)  # HANDOFF 2: the activation's leading tiles known complete
    if HANDOFF != 2:  # the handoff's consumer triggers after its ticket (``_handoff_release``), waits after its loop
        _pdl_enter(USE_PDL, EARLY)
    _probe_stamp(PROBE, prog, 2, prog, HAS_PROBE)
    # The preloaded tiles' inputs and the residual are loaded together, before any of them is used: one round trip
    # after the wait instead of one per tile (each tile's layout change is a CTA barrier that global loads do not
    # cross) -- the same values, the same accumulation order; with the norm prologue and the whole K preloaded, the
    # row statistics come from those tiles too (``_gemv_whole_row``).
    # ``X_FIRST`` False (``FLARE_GEMV_X_FIRST=0``, side-by-side runs): each input tile loaded just before its tile's
    # product, the residual after the loop, as before -- in the steps 1.034x (Qwen3-0.6B) and 1.008x (Qwen3-8B) at
    # batch 1 (runs 66 and 67, ``results/20261201T173333Z-sm90-gpu-replay-0.6B``, ``...173900Z...-8B``).
    early: tl.constexpr = X_FIRST and PRELOAD >= 1
    whole: tl.constexpr = early and HAS_NORM and not GATED_IN and PRELOAD * BK == K
    xp = ()  # the preloaded tiles' input tiles when loaded together (early), in K order
    if whole:
        xp = _gemv_whole_row(x_rows, NW, offs_k, m_mask, eps, K, BK, PRELOAD)
        rstd = tl.full([MP], 1.0, dtype=tl.float32)  # unused: the tiles are normed
    else:
        rstd = _gemv_rstd(x_rows, m_mask, offs_k, eps, K, MP, BK, HAS_NORM)
    if early and not whole:
        for i in tl.static_range(PRELOAD):
            xp = xp + (_gemv_x_whole_tile(x_rows, NW, i, offs_k, m_mask, rstd, K, BK, HAS_NORM, GATED_IN),)
    if early:
        res = _gemv_residual(R, offs_m, offs_n, m_mask, n_mask, stride_r, HAS_RES)

    acc = _gemv_acc(MP, BN, BK, FLAT)
    if GATED:
        acc_u = _gemv_acc(MP, BN, BK, FLAT)
    else:
        acc_u = acc  # unused
    for i in tl.static_range(PRELOAD):  # the preloaded tiles, in order; each input tile here unless loaded early
        if X_FIRST:
            x_i = xp[i]
        else:
            x_i = _gemv_x_whole_tile(x_rows, NW, i, offs_k, m_mask, rstd, K, BK, HAS_NORM, GATED_IN)
        acc, acc_u = _gemv_tile_product(acc, acc_u, wp[i], up[i], _gemv_x_f32(x_i, FLAT), GATED, FLAT)
    # The streamed tiles (tried and removed: ``FLARE_GEMV_PIPELINE=1``, each iteration issuing the NEXT tile's weight
    # loads before its input tile -- more registers, so fewer programs resident: Qwen3-8B's one-row layer graph 1.086x
    # slower side by side, qkv and down each in a late wave, ``results/20261201T183600Z-sm90-run71``; nor with
    # ``FLARE_GEMV_GROUP=8``, the products of 8 consecutive columns summed before accumulating -- an eighth of the
    # accumulator, offline 56-108 registers, but the in-register regrouping made qkv 16 -> 32 us and down 29 -> 49 us:
    # the layer graph 1.43x (Qwen3-8B) and 1.70x (Qwen3-0.6B) slower, 1.35x with the pipelined stream,
    # ``results/20261201T202700Z-sm90-run79``).
    # X_AHEAD (a plain input, no handoff; :data:`linear.GEMV_X_AHEAD`): each iteration loads the NEXT tile's input
    # (masked past K) and takes the one the previous iteration loaded -- the input tile's layout change (a CTA
    # barrier, before the weight loads) then waits on a load issued a whole tile earlier, not on an L2 round trip of
    # its own, so the weight loads of consecutive tiles follow each other without it.  The same tiles, values and
    # order: the same bits.
    if X_AHEAD:
        x_next = _gemv_x_plain(x_rows, PRELOAD * BK + offs_k, m_mask, K)
    for k0 in tl.range(PRELOAD * BK, K, BK, num_stages=STREAM_STAGES):
        kk = k0 + offs_k
        xm, wm = _gemv_masks(kk, m_mask, n_mask, K, EVEN_K)
        if HANDOFF == 2:  # the tile's input once gate/up finished it
            ready = _handoff_await(FLAGS, k0 // BK, ready, FLAG_TILES, FLAG_TARGET, FLAG_P2, FENCE)
        if X_AHEAD:
            xv = x_next
            x_next = _gemv_x_plain(x_rows, kk + BK, m_mask, K)
            xf = _gemv_x_f32(xv, FLAT)
        else:
            xf = _gemv_x_f32(_gemv_x_tile(x_rows, NW, kk, xm, rstd, K, HAS_NORM, GATED_IN, EVEN_K, HANDOFF == 2),
                             FLAT)
        w = tl.load(w_rows + kk[None, :], mask=wm, other=0.0, eviction_policy="evict_first")  # [BN, BK]
        u = w
        if GATED:
            u = tl.load(u_rows + kk[None, :], mask=wm, other=0.0, eviction_policy="evict_first")
        acc, acc_u = _gemv_tile_product(acc, acc_u, w, u, xf, GATED, FLAT)

    _probe_stamp(PROBE, prog, 3, tl.sum(tl.sum(_gemv_acc_sum(acc, FLAT), axis=1), axis=0).to(tl.int32, bitcast=True),
                 HAS_PROBE)
    if HANDOFF == 2:  # every input tile read: the ticket, the trigger, then the PDL wait (gate/up complete)
        # before any write.  The trigger only now, never at the start as ``EARLY`` would: launched from the start, the
        # next layer's o_proj, gate/up and this consumer's successor could all start while this launch still holds its
        # counts complete -- that successor would take them for its own gate/up's tiles.  After the last program's
        # reset, the successor launches onto zeros.  (Suspected from run 169's failed chain test; with this, run 170's
        # eager chains gave the plain bits but its captured chains still did not: ``linear.GEMV_HANDOFF``.)
        _handoff_release(FLAGS, FLAG_TILES, FLAG_P2, tl.num_programs(0) * tl.num_programs(1), FENCE)
        if USE_PDL:
            gdc_launch_dependents()
            gdc_wait()
    if not early:  # no preloaded tiles: the residual after the loop (held across it, it spilled in 8B down)
        res = _gemv_residual(R, offs_m, offs_n, m_mask, n_mask, stride_r, HAS_RES)
    if GATED:
        _gemv_epilogue(_gemv_acc_sum(acc, FLAT), _gemv_acc_sum(acc_u, FLAT), res, Y, offs_m, offs_n, m_mask, n_mask,
                       stride_y, GATED, HAS_RES, ROUND_TY, ACTIVE, HAS_ACTIVE)
    else:
        _gemv_epilogue(_gemv_acc_sum(acc, FLAT), None, res, Y, offs_m, offs_n, m_mask, n_mask, stride_y, GATED,
                       HAS_RES, ROUND_TY, ACTIVE, HAS_ACTIVE)
    if HANDOFF == 1:
        _handoff_signal(FLAGS, tl.program_id(0) * BN, N_OUT if GATED else N_OUT // 2, FLAG_COLS)
    _probe_stamp(PROBE, prog, 4, prog, HAS_PROBE)
