"""``flare::fused_linear``'s launcher (:func:`fused_linear_triton`) and the configurations of its kernels
(:mod:`.gemv`, :mod:`.gemm_rows`): measured tables, heuristics, side-by-side switches."""

from __future__ import annotations

import functools
import os
import types

import torch
import triton
import triton.language as tl

from ignition.components.fused_linear import (DOT_ROWS, HANDOFF_CONSUMER, HANDOFF_PRODUCER, uses_dot_kernel,
                                              uses_dot_one_row)
from ignition.components.kernels.gemm_rows import _fused_gemm_rows_kernel, _published_norm_kernel
from ignition.components.kernels.gemv import _fused_gemv_kernel
from ignition.components.kernels.launch import (_interpreting, _pdl, _probe_args, device_key, pdl_early_enabled,
                                                pdl_enabled, zeroed_counts)
from ignition.components.switches import mebibytes, switch, whole


#: SMs of the target (H200); the heuristic aims for at least two programs per SM where N allows.
GEMV_TARGET_SMS = 132
#: fp32 accumulator elements per program the heuristic allows (MP * BN * BK, doubled when gated): 64 per thread
#: at 8 warps -- beyond that the accumulator spills.
GEMV_ACC_BUDGET = 16384
#: rows of x per program (larger M: more row blocks on the grid's second axis).
GEMV_MAX_ROWS = 16
#: weight tiles per program prefetched into L2 before the PDL wait (overlapping the previous kernel's tail) ...
GEMV_PREFETCH_TILES = 2
#: ... or all of them when the whole weight fits this many bytes: every Qwen3-0.6B projection (<= 12 MiB; with the
#: EARLY reduce 1.1217 -> 1.1090 ms, ``results/20261201T045516Z-sm90-run15``), no Qwen3-8B one.  Prefetching the
#: 8B o_proj (32 MiB) whole during the attention cost more than it saved (B=1 4.748 ms without, 4.771 with,
#: ``results/20261201T050909Z-sm90-run18``), its qkv (48 MiB) during the down projection more still (4.905,
#: ``results/20261201T050720Z-sm90-run17``).  ``FLARE_GEMV_PREFETCH_MB`` overrides it (0: first tiles only).
#: Tried and removed: the decode attention's programs prefetching the o_proj weight (all of it, its last 25-75 %, or
#: with the MLP's) into L2 during their latency-bound span, by ``prefetch.global.L2`` per line or by the TMA unit
#: (``cp.async.bulk.prefetch.L2``), before or after their wait -- every variant slower: Qwen3-8B 1.015-1.037x for
#: o_proj, 1.34x with the MLP; Qwen3-0.6B 0.993-1.07x (the prefetching programs stall, ~3 us for 32 MiB, and the
#: projections do not get faster; ``results/20261201T163000Z-sm90-attnprobe-runs48-53``, runs 50-52).
GEMV_PREFETCH_FULL_BYTES = 16 << 20


#: Whether the one-row GEMV whose whole K is preloaded (no streamed tiles) accumulates in the weight tiles' own 2-D
#: shape (:func:`_gemv_acc`; ``FLARE_GEMV_FLAT=1`` / ``0`` sets it, read at each launch for side-by-side runs).
#: Offline sm90 (``scripts/sm90_kernel_check.py``): Qwen3-8B's qkv 31 -> 7 CTA barriers, o_proj 44 -> 4 and 255 -> 168
#: registers (3 programs per SM instead of 2), the head 31 -> 7.  The final sum over K then groups the lanes as the
#: weight loads do, another fp32 order than the 3-D accumulator's (both within the reference's bound; each path
#: deterministic).  Side by side in one process with the null on the H200, 1024-token context, batch 1
#: (``results/20261202T075700Z-sm90-run118``, ``...074600Z-sm90-run117``): Qwen3-8B 0.9846x (10 of 10 blocks faster
#: against A and A2; qkv 13.95 -> 12.51 us and o_proj 11.46 -> 7.97 per layer in the critical path, the attention
#: before it 9.41 -> 10.75), Qwen3-0.6B (every projection preloaded whole) 0.9288x, faster by the min-max rule.
GEMV_FLAT = True

#: Pipeline stages of the one-row GEMV's streamed tiles (the tiles after the preloaded ones: Qwen3-8B's down), which
#: then take the 2-D accumulator too and are copied asynchronously that many tiles ahead (``tl.range``'s software
#: pipeliner; ``FLARE_GEMV_STREAM_STAGES=N`` sets it); 0: the plain loop over the 3-D accumulator.  The 2-D accumulator
#: without the pipeliner lost: Qwen3-8B's down took 43.2 us per layer in the step's critical path against 29.7
#: (``results/20261202T074600Z-sm90-run117``; the preloaded projections gained there).  With it, 3 stages, the step
#: 0.9953x against A but slower than :data:`GEMV_FLAT` alone (0.9846x in the same call; down 29.47 -> 28.51 us), and
#: 3 stages at 8x512 1.0034x (``results/20261202T075700Z-sm90-run118``).  Again on an H100 side by side in one process
#: (``results/20261205T163658Z-sm90-run178``, batch 1): 8x1024 with 3 stages (96 registers, 5 programs per SM) 1.0104x,
#: 4x1024 with 3 (8 per SM, one wave of 1024) 1.0131x, 8x512 with 4 1.0244x slower (paired blocks 0/10): down itself
#: -0.64 to +3.04 us per layer, but o_proj +1.4 to +1.7 and the next qkv +0.5 to +1.4.
GEMV_STREAM_STAGES = 0

#: Whether the GEMV's streamed loop (the tiles after the preloaded ones: Qwen3-8B's one-row down) loads each input
#: tile one iteration ahead (``FLARE_GEMV_X_AHEAD=1`` / ``0``; read at each launch, for side-by-side runs; a plain
#: input only -- no norm prologue, no gated input, no handoff).  Offline sm90 SASS of the one-row down (8x1024 w4, 127
#: registers, 4 programs per SM): each iteration loads its input tile (``LDG.E.128``), and the tile's layout change
#: (``STSM``, then ``BAR.SYNC``) waits for it before the tile's eight weight loads (``LDG.E.EF.128``) are issued -- an
#: L2 round trip in series with every weight tile's HBM round trip, the program with no weight bytes in flight
#: meanwhile.  Down reaches 87% of the floor's bandwidth on both cards (run 173, H200: 27.07 us per layer against
#: 23.63; run 176, H100: 37.67 against 32.83) where the whole-K gate/up reaches 100%.  The same tiles, values and order:
#: the same bits.  Also looked at offline and left: the weight tile loaded as the 3-D
#: accumulator's own ``[1, BN, BK]`` (no layout change through shared memory, 100 registers) -- ptxas then issues
#: three of the eight weight loads, waits on the first for the products, and issues the rest one by one between them,
#: as it does with the 2-D accumulator (run 117's 43 us down).  On since run 182: Qwen3-8B side by side in one
#: process on an H100, batch 1, against the same A (``results/20261205T182809Z-sm90-run182``): with the one-row
#: gate/up at 1x1024 and the qkv at 2x1024 (:data:`GEMV_MEASURED`) 0.9898x, the two configs without it 0.9929x (10/10
#: paired blocks each); batch 4 1.0002x (no one-row launch there).  Alone beside the earlier configs within noise
#: (1.0001x, run 179).  Offline sm90 SASS of the down: the same float instructions with and without, scheduled apart;
#: its GPU bit test (``test_streamed_gemv_input_ahead_on_this_gpu_changes_no_bit``) has not run yet (run 185 was cut
#: before it).
#: On the H200 too: off 1.0068x slower at batch 1 beside the H200's own configs (run 194, paired blocks 0/10).
GEMV_X_AHEAD = True

#: Whether a one-row GEMV with the norm prologue prefetches its norm weights' lines into L1 before its PDL wait
#: (``FLARE_GEMV_NORM_L1=1`` / ``0``; read at each launch, for side-by-side runs; the interpreter ignores it).
#: Offline sm90 SASS of Qwen3-8B's qkv, gate/up and head (whole K preloaded, 127 registers): after the wait the input
#: row's four tiles load together, but the norm weights' loads reuse their registers, so they are issued only once
#: the row has arrived and its squares are summed -- a second L2 round trip in series; from L1 it would be tens of
#: cycles (the streamed weights take the evict-first priority, so the prefetched lines should stay).  No registers:
#: ``prefetch.global.L1`` writes none.  The same values: the same bits.  Off: beside run 182's configs and
#: :data:`GEMV_X_AHEAD` it made Qwen3-8B's batch 1 **1.2562x** slower side by side on an H100
#: (``results/20261205T182926Z-sm90-run183``, 0/10 paired blocks faster).
GEMV_NORM_L1 = False


#: Whether the one-row GEMV's preloaded weight tiles take the evict-first L2 priority, as its streamed tiles do
#: (``FLARE_GEMV_PRELOAD_EVICT_FIRST=1`` / ``0``; read at each launch).  A weight is read once per step; with the
#: normal priority the whole-K preloads (Qwen3-8B: qkv 48 MiB during the down, o_proj 32 MiB during the attention,
#: the head's 1.2 GB) can evict what the step reads back soon -- the K/V lines the decode attention prefetched before
#: its wait (run 53's stamps: K and V arriving 1.6-2.8 us after their page ids), the activations.  On since run 121
#: (``results/20261202T094300Z-sm90-run121``, side by side in one process with the null, 1024-token context): Qwen3-8B
#: batch 1 0.9803x (B faster by the min-max rule; paired blocks 10/10 against A and A2; the attention's critical path
#: unchanged, the projections' down), batch 4 (tensor-core launches, no preload) within noise; Qwen3-0.6B batch 1
#: 0.9954x (paired 10/10 against A and A2), batch 4 within noise (``results/20261202T094900Z-sm90-run122``).
GEMV_PRELOAD_EVICT_FIRST = True


#: Tried and removed: each program of a one-row GEMV with its whole K preloaded also prefetching into L2, before its
#: wait, the whole rows of the program 256 further on (``FLARE_GEMV_L2_AHEAD``, Qwen3-8B's o_proj only: its early
#: programs, 261 of 512 in run 123's probe, are resident during the latency-bound attention, the late ones stream
#: their rows after it) -- Qwen3-8B batch 1 1.0131x slower side by side in one process with the null (paired blocks
#: 0/10 faster; ``results/20261202T100100Z-sm90-run124``), as the attention's own prefetch of that weight before (runs
#: 50-52, :data:`GEMV_PREFETCH_FULL_BYTES`).  The prefetch was issued before the preloads: after them, 176 registers,
#: 2 programs per SM instead of 3.

#: Tried and removed: each iteration of the one-row GEMV's streamed loop taking 2 to 4 whole tiles, all their weight
#: loads issued before their input tiles (``FLARE_GEMV_UNROLL=N``; the same tiles in the same order, bitwise the same in
#: the interpreter) -- Qwen3-8B's down (gated input) in the step side by side in one process
#: (``results/20261204T102500Z-sm90-run135``): 8x512 w4 with 2 tiles (100 registers) 1.0336x slower, down 27.94 -> 31.74
#: us per layer in the critical path; 4x1024 w4 with 4 (128 registers, 1024 programs) 1.0527x, 34.11 us; 8x1024 w4
#: with 2 (168 registers, 3 programs per SM) 1.0567x, 35.23 us.  Nor its wider tiles alone: 4x2048 w4 1.0265x slower
#: (``results/20261204T103500Z-sm90-run136``).
#: Tried and removed: Qwen3-8B's one-row down (gated input) split over K (``FLARE_GEMV_SPLIT``): program (n, s) preloads
#: its whole slice of 1..4 tiles before its wait, as the qkv does, and the last of a column block's programs to take a
#: ticket (an acq_rel atomic after a GPU-scope fence) sums the fp32 partials in split order -- deterministic, correct
#: on the GPU (50 launches and 50 graph replays bitwise alike) -- but side by side in one process with the null
#: (``results/20261204T150400Z-sm90-run146``, batch 1): 3 splits 4x1024 w4 (126 registers) 1.0469x slower, 6 splits
#: 8x512 w4 1.0432x, 6 splits 8x1024 w4 1.0855x (paired blocks 0/10); in the critical path down 28.00 -> 32.32 us and
#: gate/up 45.73 -> 48.10 (its 3072 programs fill the SMs: the next qkv's early launch lead fell from 27.1 to 4.9 us).
#: Tried and removed: each iteration of a one-row GEMV's streamed loop (Qwen3-8B's down, 3.58 TB/s in run 126's
#: critical path) prefetching into L2 the tile N ahead (``FLARE_GEMV_STREAM_PREFETCH=N``), so that lines keep coming
#: without registers -- Qwen3-8B batch 1 side by side in one process with the null
#: (``results/20261204T033000Z-sm90-run127``): 1, 2 and 4 tiles ahead 1.026x, 1.022x, 1.057x slower.


#: Tried and removed: Qwen3-8B's one-row down (gated input) through a TMA kernel -- the weight by a tensor descriptor
#: into shared memory, a ``tl.range`` loop software-pipelined 4 to 8 stages deep, the gated input in the same pipeline
#: (``FLARE_GEMV_TMA``).  Alone (cold weights) 32x256 w4 with 8 stages took 26.22 us against the register kernel's
#: 27.92 (3.84 TB/s; 4 and 6 stages, or 16-row boxes, no faster than it), but in the step side by side in one process
#: with the null (``results/20261204T201700Z-sm90-run160``) batch 1 was 1.0473x slower (paired blocks 0/10; per layer
#: 105.06 -> 111.90 us: down 28.00 -> 29.31, qkv +2.69, o_proj +3.01, the attention +1.25) -- its 136 KiB of shared
#: memory per SM crowd out the next qkv's early programs, and Triton 3.6's TMA lowering drops the evict-first hint
#: (offline PTX), so the streamed weight enters L2 at normal priority.


def gemv_flat(mp: int, k: int, bk: int, preload: int) -> tuple[bool, int]:
    """``(FLAT, STREAM_STAGES)`` of a one-row GEMV launch (``mp`` padded rows, ``preload`` of K's ``bk``-column tiles
    preloaded): the 2-D accumulator where the whole K is preloaded (:data:`GEMV_FLAT`) or the streamed tiles are
    pipelined (:data:`GEMV_STREAM_STAGES`); never for more rows."""
    if mp != 1:
        return False, 0
    if preload * bk >= k:
        return switch("FLARE_GEMV_FLAT", GEMV_FLAT), 0
    stages = whole("FLARE_GEMV_STREAM_STAGES", GEMV_STREAM_STAGES, low=0)
    return stages > 0, stages


def gemv_x_ahead(k: int, bk: int, preload: int, plain_input: bool) -> bool:
    """Whether a GEMV launch's streamed loop takes each input tile one iteration ahead (:data:`GEMV_X_AHEAD`,
    ``FLARE_GEMV_X_AHEAD``): only where tiles are streamed (``preload`` of K's ``bk``-column tiles fall short of K)
    and the input is ``plain_input`` (no norm prologue, no gated input, no handoff)."""
    return preload * bk < k and plain_input and switch("FLARE_GEMV_X_AHEAD", GEMV_X_AHEAD)


#: Measured launch configs, ``(M, N, K, gated) -> (BN, BK, num_warps, num_stages[, preload])`` (the optional fifth:
#: the launch's preloaded tiles, as ``FLARE_GEMV_CONFIG``'s; none yet): the fastest of the H200 sweep
#: ``results/20261130T203339Z-sm90-run1/gemv.json`` (``scripts/bench_gemv.py``) where it beat the heuristic by
#: more than 3 %; entries marked [6] from the re-sweep with programmatic dependent launch
#: (``results/20261201T000448Z-sm90-run6/gemv.json``), [13] and [14] from ``results/20261201T044049Z-sm90-run13/gemv.json`` and
#: ``results/20261201T044844Z-sm90-run14/gemv.json`` (with PDL).  A table, not runtime autotuning: equal shapes always run the same summation order.
#: Card models may differ: :data:`GEMV_MEASURED_BY_CARD` replaces entries where one model's side by side chose
#: otherwise (:func:`gemv_card`).
GEMV_MEASURED: dict[tuple[int, int, int, bool], tuple[int, ...]] = {
    (1, 6144, 4096, False): (2, 1024, 4, 2),  # Qwen3-8B qkv: 2 rows per program (3072 programs) since run 180: side
    #   by side in one process on an H100 against 4x1024 (``results/20261205T182137Z-sm90-run180``) batch 1 0.9962x
    #   (10/10 paired blocks), with the gate/up's 1x1024 0.9929x where that alone gave 0.9954x (run 181).  Before:
    #   4x1024 w4, its whole K preloaded before the wait (4 tiles, 127 registers, 4 programs per SM;
    #   ``gemv_preload_tiles``), the row statistics from those tiles.  In the step side by
    #   side in one process against run 6's 8x512 w4 (13.78 us alone, no preload): batch 1 0.9848x
    #   (``results/20261202T033000Z-sm90-run104``), 0.9865x with the null A2/A 1.0023 (run 105, B's median below both
    #   A's minima); 8x1024 w4 (208 registers, 2 per SM) 1.0002x, 2x1024 w4 0.9948x, 4x1024 w8 0.9949x
    (4, 6144, 4096, False): (16, 512, 8, 2),  # Qwen3-8B qkv: 36.31 us (heuristic 42.47)
    (1, 4096, 4096, False): (4, 1024, 4, 2),  # Qwen3-8B o_proj: 4 rows per program (1024 programs, 96 registers,
    #   5 per SM offline), its whole K preloaded (``GEMV_PRELOAD_TILES``).  In the step side by side in one process
    #   against 8x1024 w4 (``results/20261205T181344Z-sm90-run179``, an H100): batch 1 0.9940x (paired blocks 10/10
    #   faster against A and the null A2; the critical path per layer 138.71 -> 137.75 us: o_proj 8.74 -> 11.25, but
    #   the gate/up behind it launches 7.04 us ahead instead of 2.56 and takes 62.91 instead of 65.38); 8x1024 w8
    #   1.0025x slower.  On the H200 too: 8x1024 w4 1.0020x slower at batch 1 (run 194, paired blocks 0/10).
    #   Before: 8x1024 w4, 8.44 us alone [6]; in the layer graph 8x512, 4x1024 (preload 4 or 2), 16x256
    #   1.007-1.051x slower (run 62, ``results/20261201T173000Z-sm90-gemvprobe-runs60-65``, before the gated MLP).
    #   Offline sm90 SASS of 8x1024 w4 (``cuobjdump``): after its wait the 4 input tiles and the residual load one
    #   after another, each once the one before has arrived -- five L2 round trips in series (168 registers, 128 of
    #   them the preloaded weight tiles); 4x1024 w4 (96 registers, 5 per SM, 1024 programs) and 8x1024 w8 (106, 2
    #   per SM) issue the four together.  Tried offline and dropped: an L1 prefetch of the row right after the wait
    #   (174 registers: 2 programs per SM).
    (8, 4096, 4096, False): (4, 256, 4, 2),  # Qwen3-8B o_proj: 26.27 us (heuristic 31.23)
    (1, 24576, 4096, True): (1, 1024, 4, 2),  # Qwen3-8B gate_up gated (SiLU epilogue; ``GATED_FUSED_MAX_ELEMENTS``):
    #   1 gate + 1 up row per program (12288 programs), whole K preloaded, since run 180: side by side in one process
    #   on an H100 against 2 + 2 rows (run 180) batch 1 0.9954x (10/10 paired blocks); 1x1024 w8 0.9940x with the
    #   qkv's 2x1024 where w4 gave 0.9928x (run 181).  Before: 2 gate + 2 up rows (127 registers offline), candidate
    #   since run 169.  Before that:
    #   16x256 w8, 66.31 us alone (heuristic 94.30)
    (1, 24576, 4096, False): (4, 1024, 4, 2),  # Qwen3-8B gate_up packed, norm prologue (``PACKED_GATE_UP_FUSED``):
    #   its whole K preloaded like the qkv's; in the step side by side against cuBLAS + the norm kernel 0.9798x, B
    #   faster by the min-max rule (``results/20261202T035300Z-sm90-run107``; 2x1024 w4 1.029x slower; run 108: 46.75
    #   us per layer, 4.31 TB/s).  Before: 16x256
    #   w4, 50.11 us alone against cuBLAS 49.22 (heuristic 32x512 w8 69.48) [13], slower in the step (runs 14, 75)
    (1, 4096, 1024, False): (8, 1024, 4, 2),  # Qwen3-0.6B qkv: 3.61 us (heuristic 8x1024 w8 4.93) [14]
    (1, 151936, 4096, False): (4, 1024, 4, 2),  # Qwen3-8B head with the final norm (``fused_linear.HEAD_FUSED``):
    #   the qkv's config at the same K, its whole K preloaded and the row statistics from those tiles (the heuristic
    #   32x512 w8 preloads nothing and reads x twice); in the step 278.7 us from the last down's end, 8x1024 w8
    #   288.7, cuBLAS behind the norm kernel 305.9 (``results/20261202T054700Z-sm90-run113``)
    (1, 151936, 1024, False): (8, 1024, 4, 2),  # Qwen3-0.6B head with the final norm: the 0.6B qkv's config; 78.8 us
    #   in the step's critical path (run 115, ``results/20261202T060800Z-sm90-run115``); 4x1024 w4 1.0166x side by side
    (1, 1024, 2048, False): (8, 1024, 4, 2),  # Qwen3-0.6B o_proj: 2.69 us (heuristic 4x1024 w8 2.99) [14]
    (1, 6144, 1024, True): (8, 512, 4, 2),  # Qwen3-0.6B gate_up: 5.18 us (heuristic 8x1024 w8 6.22) [14]
    (1, 1024, 3072, False): (4, 1024, 4, 2),  # Qwen3-0.6B down: 3.55 us (heuristic 4x1024 w8 4.13) [14]
    (1, 4096, 12288, False): (8, 1024, 4, 2, 0),  # Qwen3-8B down: 24.95 us, with the gated input 27.35 (32x1024 w8
    #   spilled at 255 registers: 29.87 / 31.52) [6]; no tile preloaded (the plain input behind the gated gate/up
    #   would preload 4: 255 registers, run 134; 0: 127, 4 per SM offline; the handoff consumer takes none).  Its
    #   one-wave alternatives behind the gated gate/up, side by side in one process on the H200 (run 171, the step
    #   at batch 1; its attention the unfused path in A and B alike): 8x1024 preload 1 1.0114x, 8x512 preload 2
    #   1.0333x, 8x512 preload 0 1.0509x -- each slower (0/10 paired blocks faster), batch 4 within noise.  4x1024 w4
    #   (1024 programs): 1.0404x slower at batch 1 on an H100 (``results/20261206T142950Z-sm90-run198``, 0/10 paired
    #   blocks faster against A and the null A2)
    (4, 4096, 12288, False): (4, 512, 8, 2),  # Qwen3-8B down: 49.20 us (heuristic 53.47)
    (8, 4096, 12288, False): (4, 256, 4, 2),  # Qwen3-8B down: 85.62 us (heuristic 106.00)
}


#: Per card model (``torch.cuda.get_device_name``, :func:`gemv_card`): the entries of :data:`GEMV_MEASURED` that this
#: model's own side by side chose otherwise -- the same bits within a model, not across (another launch config sums in
#: another order).  The H200: Qwen3-8B's one-row qkv and gated gate/up at their configs before run 180 (those of
#: :data:`GEMV_MEASURED` were chosen side by side on H100s, runs 180-181).  Side by side in one process with the null
#: on an H200 at 32fbabe (``results/20261206T083400Z-sm90-run193``, batch 1, A = :data:`GEMV_MEASURED`): the qkv at
#: 4x1024 0.9964x, the gate/up at 2x1024 0.9869x, both 0.9835x (3.9822 -> 3.9168 ms; paired blocks 10/10 faster
#: against A and the null A2 each); batch 4 (no one-row launch) within noise.  With them the replay of record
#: (``results/20261206T100400Z-sm90-run194``, an H200): batch 1 3.9239 ms, 1.108x its floor (run 192 at a1a26f8:
#: 1.126x); against run 173 0.9747x, faster by the min-max rule.  In the same run's side by side on top of them: the
#: gated gate/up at 2x1024 w8 1.0430x slower.
GEMV_MEASURED_BY_CARD: dict[str, dict[tuple[int, int, int, bool], tuple[int, ...]]] = {
    "NVIDIA H200": {
        (1, 6144, 4096, False): (4, 1024, 4, 2),  # Qwen3-8B qkv: 4 rows per program, whole K preloaded
        (1, 24576, 4096, True): (2, 1024, 4, 2),  # Qwen3-8B gate_up gated: 2 gate + 2 up rows per program
    },
}


def gemv_card() -> str:
    """The card model whose :data:`GEMV_MEASURED_BY_CARD` entries apply: ``FLARE_GEMV_CARD`` when set (side-by-side
    runs, the CPU tests; a name with no entry, e.g. ``none``, takes :data:`GEMV_MEASURED` alone), else the current
    CUDA device's name (asked once per device), else ``""`` (no CUDA)."""
    named = os.environ.get("FLARE_GEMV_CARD", "").strip()
    if named or not torch.cuda.is_available():
        return named
    return _cuda_card_name(torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_card_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


@functools.lru_cache(maxsize=None)
def _measured_on(card: str) -> types.MappingProxyType:
    return types.MappingProxyType({**GEMV_MEASURED, **GEMV_MEASURED_BY_CARD.get(card, {})})


def gemv_measured(card: str | None = None) -> types.MappingProxyType:
    """The measured launch configs on ``card`` (default :func:`gemv_card`), read-only: :data:`GEMV_MEASURED` with that
    model's :data:`GEMV_MEASURED_BY_CARD` entries in place (merged once per model, not at each launch)."""
    return _measured_on(gemv_card() if card is None else card)


def gemv_prefetch_tiles(weight: torch.Tensor, bk: int) -> int:
    """Weight tiles (of ``bk`` columns) each GEMV program prefetches into L2 before its PDL wait: all of them when
    the weight fits :data:`GEMV_PREFETCH_FULL_BYTES` (or ``FLARE_GEMV_PREFETCH_MB``), else
    :data:`GEMV_PREFETCH_TILES`."""
    tiles = triton.cdiv(weight.shape[1], bk)
    budget = mebibytes("FLARE_GEMV_PREFETCH_MB", GEMV_PREFETCH_FULL_BYTES)
    if weight.numel() * weight.element_size() <= budget:
        return tiles
    return min(GEMV_PREFETCH_TILES, tiles)


#: Weight tiles each one-row plain GEMV program (no norm or gate prologue, no gated output: o_proj, and down after a
#: gated fused gate/up) loads into registers before its PDL wait, while its predecessor finishes
#: (``FLARE_GEMV_PRELOAD`` overrides it; at most 4).  The GEMVs with a prologue or a gated output (qkv, gate/up, the
#: down with the gated input) preload only when the preloaded tiles are their whole K (``FLARE_GEMV_PRELOAD_PROLOGUE``
#: 1 / 0 forces it on / off), side by side on the H200: Qwen3-8B batch 1 (qkv 4 of 8 tiles, down 4 of 12) 5.2294 ms
#: with, 4.6547 without (``results/20261201T103624Z-sm90-run24``: the partial preload holds its tiles in registers
#: across the rstd pass or the gated-input loop -- down went from 29 to 43 us); Qwen3-0.6B batch 1 (qkv 1 tile, gate/up
#: 2 -- whole K) 1.0232 ms with, 1.0378 without in run 23, but within noise in run 26 (see
#: :data:`FUSED_DECODE_MAX_SPLITS`): kept, bitwise the same either way.  The plain GEMVs side by side on the H200,
#: batch 1, 1024-token context (``results/20261201T070650Z-sm90-run21``): Qwen3-0.6B 1.1216 ms without, 1.0617 with 2
#: tiles, **1.0354** with 4
#: (o_proj's and down's whole rows: K = 2 and 3 tiles); Qwen3-8B (o_proj only: its down takes the gated input) 4.7312,
#: 4.7520, 4.7227 -- within noise.  Tried and removed: first-wave programs of the one-row output projection
#: prefetching later programs' whole rows into L2 before the wait -- Qwen3-8B batch 1 within noise (1.006x,
#: ``results/20261201T114716Z-sm90-run28``); and after the wait -- 1.018-1.020x slower in the one-row layer graph
#: (run 65, ``results/20261201T173000Z-sm90-gemvprobe-runs60-65``: at Qwen3-8B 241 of o_proj's 512 programs are
#: resident before the reduce ends, 2 per SM at 255 registers; the 271 late ones stream 6 us after the first wave).
GEMV_PRELOAD_TILES = 4


def gemv_preload_tiles(m: int, k: int, bk: int, plain: bool, named: int | None = None) -> int:
    """Weight tiles the GEMV loads into registers before its PDL wait (:data:`GEMV_PRELOAD_TILES`): one row, a
    plain input (no norm, no gated input or output -- those too when the tiles cover K, or as
    ``FLARE_GEMV_PRELOAD_PROLOGUE`` says), whole tiles only; never more than the tiles of K.  ``named``: the launch's
    own count (a ``FLARE_GEMV_CONFIG`` item's fifth field, :func:`gemv_config`), whatever its prologue -- still one
    row, whole tiles, at most K's."""
    if named is not None:
        if not 0 <= named <= 4:
            raise ValueError(f"preload {named}: 0 to 4 tiles (the kernel unrolls up to 4)")
        return 0 if m != 1 or k % bk else min(named, k // bk)
    tiles = whole("FLARE_GEMV_PRELOAD", GEMV_PRELOAD_TILES, what=" of tiles")
    if tiles > 4:
        raise ValueError(f"FLARE_GEMV_PRELOAD={tiles}: at most 4 tiles (the kernel unrolls up to 4)")
    if m != 1 or k % bk or not (plain or switch("FLARE_GEMV_PRELOAD_PROLOGUE", k // bk <= tiles)):
        return 0
    return min(tiles, k // bk)


#: Measured tensor-core launch configs, ``(N, K, gated) -> (BN, BK, num_warps, num_stages)`` (its row tile is 16 for
#: every row count): the fastest of ``results/20261201T102332Z-sm90-run23/gemv.json`` at 4 and 8 rows (both the same),
#: for the plain-input launches :func:`fused_linear.uses_dot_kernel` takes.  Qwen3-8B's batch-4 launches side by side
#: in the step with deeper pipelines (``FLARE_GEMV_CONFIG``; ``results/20261204T070950Z-sm90-run131``): qkv 8 stages
#: 1.0045x, down 8 stages 1.0069x, o_proj and down 6 stages 0.9994x, qkv 64x256 w4 s4 1.0009x -- within noise --, all
#: three deeper 1.0162x slower.  Tried and removed: the norm kernel in front of the batch-4 qkv letting it launch before
#: the norm's wait (so its programs prefetch their weight into L2 while the down projection streams at ~3.3 TB/s),
#: alone 1.0086x slower, with 16 / 32 tiles prefetched per program 1.066x / 1.109x, 8 tiles without it 1.030x
#: (``results/20261204T070300Z-sm90-run130``) -- as every L2 weight prefetch on this machine.
#: Qwen3-8B's o_proj and down take 512-column tiles (run 23's sweep stopped at 256, its times falling from 64 to 256):
#: side by side in one process with the null at 4 rows (``results/20261204T104300Z-sm90-run137``): down 32x512 w4 s4
#: 0.9851x (B faster by the min-max rule, paired blocks 10/10 against A and A2; down 30.27 -> 27.97 us per layer in
#: the critical path), with o_proj too 0.9834x (o_proj 11.20 -> 10.46 us, the reduce before it 2.11 -> 2.59); o_proj
#: on top of down alone 0.9986x (paired 10/10 against A and A2, within noise by min-max; ``...104700Z-sm90-run138``).
#: Slower at 4 rows (``...103500Z-sm90-run136``, ``...104750Z-sm90-run139``): down 16x512 1.026x, 32x512 w8 1.025x,
#: o_proj 16x512 1.014x, qkv 32x256 1.004x, 16x256 1.034x, 16x512 1.084x.  8 rows not measured (run 23: 4 and 8 alike).
GEMM_ROWS_MEASURED: dict[tuple[int, int, bool], tuple[int, int, int, int]] = {
    (4096, 4096, False): (32, 512, 4, 4),  # Qwen3-8B o_proj (run 137); 32x256 w4 s4 12.12 us alone at 4 rows (run 23)
    (4096, 12288, False): (32, 512, 4, 4),  # Qwen3-8B down (run 137); 32x256 w4 s4 30.02 alone (cuBLAS 28.63; run 23)
    # the plain qkv (its norm run apart), full grid (``results/20261201T121435Z-sm90-run31``, 4 rows; 8 rows alike):
    (6144, 4096, False): (64, 128, 4, 5),  # Qwen3-8B: 15.44 us (the heuristic 16x128 w4 s4: 17.36; cuBLAS 14.62)
    (4096, 1024, False): (32, 128, 4, 5),  # Qwen3-0.6B: 3.70 us (heuristic 4.61; cuBLAS 4.72)
}


#: Whether the tensor-core kernel loads its residual tile right after its wait, before the main loop, instead of after
#: it (``FLARE_GEMM_ROWS_RES_FIRST=1`` / ``0``; read at each launch): after the loop its L2/HBM round trip comes
#: between the last product and the store (offline sm90 PTX: the epilogue's first instruction waits on it) -- once per
#: o_proj and down launch at batch 4.  The same values, the same bits.  On since run 154: Qwen3-8B side by side in one
#: process with the null (``results/20261204T174600Z-sm90-run154``, 1024-token context): batch 4 0.9934x (paired blocks
#: 10/10 faster against A and A2; within noise by the min-max rule; per layer 114.91 -> 114.14 us in the critical
#: path, o_proj 10.46 -> 9.95, down 25.34 -> 24.93), batch 1 (no such launch) 0.9991x.
GEMM_ROWS_RES_FIRST = True

#: Pipeline stages of the tensor-core kernel's row-statistics loop (the norm prologue; ``_gemv_rstd``'s ``STAGES``).
GEMM_ROWS_NORM_STAGES = 3


#: Weight tiles each program of a tensor-core launch taking a published norm (``fused_linear.GEMM_ROWS_PRENORM``:
#: Qwen3-8B's gate/up at batch 4) prefetches before its wait.  It launches while the projection before it streams --
#: no norm launch between -- so its prefetch competes with that stream: run 155's publishing o_proj took 12.58 us per
#: layer against 9.95 without publishing while the gate/up's 384 programs prefetched 2 tiles each (~12 MiB).  Side by
#: side in one process with the null (``results/20261204T184500Z-sm90-run156``, Qwen3-8B batch 4, 1024-token
#: context): 1 tile 0.9960x (paired blocks 10/10 faster against A and A2; per layer 115.14 -> 114.56 us, o_proj
#: 12.67 -> 11.58, gate/up 48.26 -> 48.83), none 0.9980x (o_proj 10.81, gate/up 49.66).
GEMM_ROWS_PRENORM_PREFETCH_TILES = 1


def gemm_rows_prefetch_tiles(published: bool = False) -> int:
    """Weight tiles each tensor-core program prefetches into L2 before its PDL wait: :data:`GEMV_PREFETCH_TILES`
    (``FLARE_GEMM_ROWS_PREFETCH=N`` sets it, read at each launch: side-by-side runs); the launch clamps it to its K's
    tiles.  ``published``: a launch taking a published norm, :data:`GEMM_ROWS_PRENORM_PREFETCH_TILES`
    (``FLARE_GEMM_ROWS_PRENORM_PREFETCH=N``)."""
    tiles = whole("FLARE_GEMM_ROWS_PREFETCH", GEMV_PREFETCH_TILES, low=0)
    if published:
        return whole("FLARE_GEMM_ROWS_PRENORM_PREFETCH", min(tiles, GEMM_ROWS_PRENORM_PREFETCH_TILES), low=0)
    return tiles


def gemm_rows_config(M: int, N: int, K: int, gated: bool = False) -> dict:
    """The tensor-core kernel's launch config, a pure function of the shapes: the :data:`GEMM_ROWS_MEASURED` entry,
    else ``BN`` 32 (16 when that leaves fewer than two programs per SM), ``BK`` 128 (K's power of two when smaller,
    at least 16), 4 warps, 4 stages -- a starting point for ``scripts/bench_gemv.py --dot``.
    ``FLARE_GEMM_ROWS_TABLE=0`` ignores the table, ``FLARE_GEMV_CONFIG`` replaces it per shape
    (:func:`gemv_config_override`, keyed by the row count too; side-by-side runs; both read at each launch)."""
    measured = gemv_config_override(M, N, K, gated) or (
        GEMM_ROWS_MEASURED.get((N, K, bool(gated))) if switch("FLARE_GEMM_ROWS_TABLE", True) else None)
    if measured is not None and len(measured) != 4:
        raise ValueError(f"FLARE_GEMV_CONFIG {M}x{N}x{K}{'g' if gated else ''}: the tensor-core launch preloads no "
                         f"tiles; give it BN/BK/warps/stages")
    if measured is not None:
        return dict(zip(("BN", "BK", "num_warps", "num_stages"), measured))
    n_out = N // 2 if gated else N
    bn = 32 if triton.cdiv(n_out, 32) >= 2 * GEMV_TARGET_SMS else 16
    return {"BN": bn, "BK": max(16, min(128, triton.next_power_of_2(K))), "num_warps": 4, "num_stages": 4}


def published_norm_triton(h: torch.Tensor, norm_weight: torch.Tensor, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(xw, stats)`` of ``h [rows, N]`` (rows contiguous) for the norm weights ``[N]`` over ``parts`` column blocks of
    ``cdiv(N, parts)`` -- the pair a ``publish_norm`` launch returns (:func:`fused_linear_triton`), in one launch."""
    rows, n = h.shape
    if norm_weight.shape != (n,) or h.stride(-1) != 1 or parts < 1:
        raise ValueError(f"published_norm_triton: h {tuple(h.shape)}, norm_weight {tuple(norm_weight.shape)}, "
                         f"parts {parts}")
    xw = torch.empty_like(h)
    stats = torch.empty((rows, parts), dtype=torch.float32, device=h.device)
    if rows:
        width = triton.cdiv(n, parts)
        mp = min(triton.next_power_of_2(rows), GEMV_MAX_ROWS)
        _published_norm_kernel[(parts, triton.cdiv(rows, mp))](
            h, norm_weight.contiguous(), xw, stats, rows, n, h.stride(0), xw.stride(0), PARTS=parts, WIDTH=width,
            MP=mp, BW=triton.next_power_of_2(width), num_warps=1)
    return xw, stats


def gemm_rows_parts(m: int, n: int, k: int) -> int:
    """The column blocks (programs along N) of an ungated tensor-core launch of ``m`` rows through a ``[n, k]`` weight:
    the statistics a ``publish_norm`` launch returns per row (:func:`fused_linear_triton`)."""
    return triton.cdiv(n, int(gemm_rows_config(max(m, DOT_ROWS.start), n, k)["BN"]))


assert DOT_ROWS.stop - 1 == GEMV_MAX_ROWS  # the tensor-core kernel's one row block holds every row it takes


#: One-row GEMVs the caller marks ``early`` (the output projection, the MLP's: their successors read only weights
#: before their wait) let the next kernel launch before their own wait, so its weight tiles load while they and the
#: attention before them run.  Side by side in the one-row layer graphs on the H200 (run 68,
#: ``results/20261201T175000Z-sm90-gemvprobe-run68``): Qwen3-0.6B o_proj, gate/up and down early 0.9694x
#: (disjoint ranges; o_proj alone 0.9792x), Qwen3-8B o_proj 0.9993x (its successor is the norm before cuBLAS); in
#: the Qwen3-0.6B step (run 69, ``results/20261201T175200Z-sm90-gpu-replay-0.6B``) B=1 0.9540 ms, off 1.0195x.
#: ``FLARE_GEMV_EARLY=0`` turns it off; at one row only (:data:`PDL_EARLY_ROWS`, ``FLARE_PDL_EARLY``).
GEMV_EARLY = True


#: Tried and removed: the one-row output projection by a Gluon kernel copying its weight rows (4 per program) into
#: shared memory before its PDL wait, then reading them back against x after it -- Qwen3-8B side by side in one
#: process with the null (``results/20261205T014952Z-sm90-run165``, 1024-token context): batch 1 1.0829x slower (B
#: slower by the min-max rule, paired blocks 0/10 against A and A2), batch 4 (not applied) 1.0023x.


#: Whether the one-row MLP takes the handoff (``gemv.py``): the gate/up launch counts its finished activation tiles
#: and down multiplies each tile once complete, instead of waiting for the whole of gate/up at its PDL wait -- down's
#: programs launch during gate/up's last wave (run 168: 2.46 us before its end) and find most tiles done.  Both MLP
#: forms: the packed gate/up (the default at one row) into down's gated input, and the gated gate/up (SiLU in its
#: epilogue; ``FLARE_GATED_FUSED_MAX_ELEMENTS`` above the packed weight) into a plain down.  The same tiles in the same
#: order: the same bits.  ``FLARE_GEMV_HANDOFF=1`` / ``0`` sets it (read when a step is traced;
#: ``fused_linear.gated_mlp_block`` asks :func:`gemv_handoff_fits`).  Off: on an H100 (runs 169 and 170,
#: ``results/20261205T133434Z-sm90-run170``) the GPU chain test's handoff chains captured in a CUDA graph differ from
#: the plain chain at both Qwen3 shapes (the 20 eager chains equal in run 170; run 169's failing line unknown), and the
#: Qwen3-8B step with it 1.5% slower at batch 1 (B ``FLARE_GEMV_HANDOFF=0`` 0.9846x, 10/10 paired blocks).  The GPU
#: test ``test_mlp_handoff_chain_on_this_gpu_changes_no_bit`` is a strict xfail until the cause is found and fixed.
GEMV_HANDOFF = False
#: int32 slots of the handoff's counts (the activation's tiles, then the consumer's ticket).
HANDOFF_SLOTS = 64


_HANDOFF_FLAGS: dict[tuple[str, int], torch.Tensor] = {}
_HANDOFF_PENDING: dict[tuple[str, int], tuple[torch.Tensor, bool]] = {}


def gemv_handoff_fits(hidden: int, inter: int, gated: bool = False) -> bool:
    """Whether a one-row MLP of these sizes can take the handoff: its gate/up launch (``[2 * inter, hidden]``, the
    norm prologue; packed, or ``gated``) and its down launch (``[hidden, inter]``; the gated input, or plain after a
    gated gate/up) are one-row GEMVs whose configs (:func:`gemv_config`, pure functions of the shapes) line up --
    gate/up's column blocks inside down's K tiles, whole tiles, fewer than :data:`HANDOFF_SLOTS` -- and down
    preloads no tiles."""
    producer, consumer = gemv_config(1, 2 * inter, hidden, gated), gemv_config(1, hidden, inter)
    bn, bk = int(producer["BN"]), int(consumer["BK"])
    preload = gemv_preload_tiles(1, inter, bk, gated, consumer.get("preload"))
    return inter % bk == 0 and bk % bn == 0 and inter // bk < HANDOFF_SLOTS and preload == 0


def _handoff_args(x: torch.Tensor, weight: torch.Tensor, gated: bool, gated_input: bool, norm: bool,
                  config: dict | None, role: int) -> dict:
    """The ``HANDOFF`` launch arguments of a producer (``role`` :data:`HANDOFF_PRODUCER`: gate/up, packed or gated) or
    a consumer (:data:`HANDOFF_CONSUMER`: down, the gated input after a packed producer, a plain input after a gated
    one) launch; raises naming what does not fit.  The producer takes the device's counts (zeros; every consumer leaves
    them so) and leaves them to the next consumer launch, which raises without one or when its input is not that
    producer's form."""
    m, k = x.shape[0], weight.shape[1]
    producer = role == HANDOFF_PRODUCER
    if (role not in (HANDOFF_PRODUCER, HANDOFF_CONSUMER) or m != 1 or config is not None
            or (producer and (gated_input or weight.shape[0] % 2)) or (not producer and (gated or norm))):
        raise ValueError(f"fused_linear_triton: handoff {role} (1 producer: gate/up; 2 consumer: down) is for the "
                         f"one-row GEMV's MLP launches at their table configs (got {m} rows, gated={gated}, "
                         f"gated_input={gated_input}, norm={norm}, config={config})")
    hidden, inter = (k, weight.shape[0] // 2) if producer else (weight.shape[0], k)
    key = device_key(x.device)
    if producer:
        if not gemv_handoff_fits(hidden, inter, gated):
            raise ValueError(f"fused_linear_triton: handoff does not fit hidden={hidden}, intermediate={inter}, "
                             f"gated={gated} (gemv_handoff_fits)")
        flags = zeroed_counts(_HANDOFF_FLAGS, x.device, HANDOFF_SLOTS)
        if _HANDOFF_PENDING.get(key) is not None:  # a producer whose consumer never launched: its counts stand
            _HANDOFF_PENDING[key][0].zero_()
        _HANDOFF_PENDING[key] = (flags, gated)
        return {"FLAGS": flags, **gemv_handoff_constexprs(hidden, inter, consumer=False, gated=gated)}
    pending = _HANDOFF_PENDING.pop(key, None)
    if pending is None:
        raise ValueError("fused_linear_triton: a handoff consumer (down) without its producer launch before it")
    flags, gated_producer = pending
    if gated_input == gated_producer:
        flags.zero_()
        raise ValueError(f"fused_linear_triton: a handoff consumer with {'the gated' if gated_input else 'a plain'} "
                         f"input after a {'gated' if gated_producer else 'packed'} gate/up launch (the packed one "
                         f"goes into the gated input, the gated one into a plain input)")
    return {"FLAGS": flags, **gemv_handoff_constexprs(hidden, inter, consumer=True, gated=gated_producer),
            "FENCE": not _interpreting()}


def gemv_handoff_constexprs(hidden: int, inter: int, *, consumer: bool, gated: bool = False) -> dict:
    """The ``HANDOFF`` constexprs of a one-row MLP's producer (gate/up, packed or ``gated``) or consumer (down)
    launch, from the two launch configs (:func:`gemv_config`): the activation's tile width (down's BK), its tiles, and
    the producer programs that complete one (both halves when packed); the launch adds ``FLAGS`` and ``FENCE``."""
    bn, bk = int(gemv_config(1, 2 * inter, hidden, gated)["BN"]), int(gemv_config(1, hidden, inter)["BK"])
    if not consumer:
        return {"HANDOFF": HANDOFF_PRODUCER, "FLAG_COLS": bk}
    tiles = inter // bk
    return {"HANDOFF": HANDOFF_CONSUMER, "FLAG_COLS": bk, "FLAG_TILES": tiles,
            "FLAG_TARGET": (1 if gated else 2) * bk // bn, "FLAG_P2": triton.next_power_of_2(tiles + 1)}


def gemv_early_enabled(device: torch.device, rows: int) -> bool:
    """Whether a one-row GEMV marked ``early`` launches its dependents before its wait on ``device``: PDL on, ``rows``
    within :func:`pdl_early_enabled`, and :data:`GEMV_EARLY` (``FLARE_GEMV_EARLY``; read at each launch)."""
    return pdl_enabled(device) and pdl_early_enabled(rows) and switch("FLARE_GEMV_EARLY", GEMV_EARLY)


def gemv_config_override(M: int, N: int, K: int, gated: bool) -> tuple[int, ...] | None:
    """``FLARE_GEMV_CONFIG="MxNxK[g]=BN/BK/warps/stages[/preload];..."`` (side-by-side runs; read at each launch): the
    launch config of those shapes (``g``: gated) instead of the table's or the heuristic's, in whichever kernel launches
    them (:func:`gemv_config`, :func:`gemm_rows_config`); the optional fifth field, the one-row GEMV's preloaded weight
    tiles for that shape alone (:func:`gemv_preload_tiles`; 0 to 4).  Raises naming a malformed item."""
    spec = os.environ.get("FLARE_GEMV_CONFIG", "").strip()
    found, seen = None, set()
    for item in filter(None, (i.strip() for i in spec.split(";"))):
        key, _, value = item.partition("=")
        try:
            shape = tuple(int(v) for v in key.rstrip("g").split("x"))
            cfg = tuple(int(v) for v in value.split("/"))
        except ValueError:
            shape, cfg = (), ()
        bad_preload = len(cfg) == 5 and not 0 <= cfg[4] <= 4
        if len(shape) != 3 or len(cfg) not in (4, 5) or min(cfg[:4]) < 1 or bad_preload:
            raise ValueError(f"FLARE_GEMV_CONFIG item {item!r}: expected MxNxK[g]=BN/BK/warps/stages[/preload] "
                             f"(positive BN, BK, warps, stages; preload 0..4)")
        if key in seen:  # run 182 named the qkv twice: the first one ran, silently
            raise ValueError(f"FLARE_GEMV_CONFIG item {item!r}: shape {key} named twice")
        seen.add(key)
        if key == f"{M}x{N}x{K}{'g' if gated else ''}":
            found = cfg
    return found


def gemv_config(M: int, N: int, K: int, gated: bool = False) -> dict:
    """The launch config of ``_fused_gemv_kernel``: a pure function of the shapes (``N`` is the weight's row
    count, ``2 * I`` when gated), so equal shapes always run the same fp32 summation order.  Measured shapes
    take their entry of :func:`gemv_measured` (this card model's); others the heuristic below.  A
    ``FLARE_GEMV_CONFIG`` item with a fifth field adds ``preload``: that launch's preloaded tiles
    (:func:`gemv_preload_tiles`).

    ``BN``: the largest of 32/16/8/4 whose grid still has >= 2 programs per SM; ``BK``: up to 1024 (never more
    than K rounded up to a power of two), shrunk -- then ``BN`` -- until the accumulator fits the budget."""
    measured = gemv_config_override(M, N, K, gated) or gemv_measured().get((M, N, K, bool(gated)))
    if measured is not None:
        return dict(zip(("BN", "BK", "num_warps", "num_stages", "preload"), measured))
    n_out = N // 2 if gated else N
    mp = min(triton.next_power_of_2(max(M, 1)), GEMV_MAX_ROWS)
    tiles = 2 if gated else 1
    bn = 32
    while bn > 4 and triton.cdiv(n_out, bn) < 2 * GEMV_TARGET_SMS:
        bn //= 2
    bk = max(16, min(1024, triton.next_power_of_2(K)))
    while mp * bn * bk * tiles > GEMV_ACC_BUDGET and bk > 256:
        bk //= 2
    while mp * bn * bk * tiles > GEMV_ACC_BUDGET and bn > 4:
        bn //= 2
    while mp * bn * bk * tiles > GEMV_ACC_BUDGET and bk > 64:
        bk //= 2
    num_warps = 8 if bn * bk * tiles >= 4096 else 4
    return {"BN": bn, "BK": bk, "num_warps": num_warps, "num_stages": 2}


def _prenorm_args(x: torch.Tensor, m: int, n_out: int, gated: bool, gated_input: bool,
                  norm_weight: torch.Tensor | None, norm_stats: torch.Tensor | None,
                  publish_norm: torch.Tensor | None, dot: bool) -> dict:
    """The published-norm kernel arguments of a :func:`fused_linear_triton` launch taking ``norm_stats`` (checked
    here; the publishing ones the launch adds once it knows its programs); raises naming the bad argument."""
    if norm_stats is None and publish_norm is None:
        return {}
    if not dot:
        raise ValueError(f"fused_linear_triton: norm_stats / publish_norm are the tensor-core kernel's "
                         f"({DOT_ROWS.start}..{DOT_ROWS.stop - 1} rows); this launch ({m} rows) is the one-row "
                         f"kernel's")
    if publish_norm is not None and (gated or publish_norm.shape != (n_out,) or not publish_norm.is_contiguous()):
        raise ValueError(f"fused_linear_triton: publish_norm {tuple(publish_norm.shape)} must be the next norm's "
                         f"contiguous weights [{n_out}] of an ungated launch")
    if norm_stats is None:
        return {}
    if norm_weight is not None or gated_input:
        raise ValueError("fused_linear_triton: norm_stats (x already normed by weight) excludes norm_weight and "
                         "gated_input")
    if (norm_stats.dim() != 2 or norm_stats.shape[0] != m or norm_stats.dtype != torch.float32
            or not norm_stats.is_contiguous() or norm_stats.device != x.device):
        raise ValueError(f"fused_linear_triton: norm_stats {tuple(norm_stats.shape)} {norm_stats.dtype}: expected "
                         f"contiguous fp32 [{m}, parts] on {x.device}")
    parts = norm_stats.shape[1]
    return {"S_IN": norm_stats, "IN_PARTS": parts, "IN_PP": triton.next_power_of_2(parts)}


def fused_linear_triton(x: torch.Tensor, weight: torch.Tensor, *, norm_weight: torch.Tensor | None = None,
                        eps: float = 0.0, residual: torch.Tensor | None = None, gated: bool = False,
                        gated_input: bool = False, config: dict | None = None,
                        dot: bool | None = None, probe: torch.Tensor | None = None,
                        early: bool = False, norm_stats: torch.Tensor | None = None,
                        publish_norm: torch.Tensor | None = None, handoff: int = 0,
                        out: torch.Tensor | None = None, active: torch.Tensor | None = None):
    """``x [M, K]`` (rows contiguous), ``weight [N, K]`` (nn.Linear layout; packed ``[gate; up]`` of ``2 * I``
    rows when ``gated``) -> a new ``[M, N_out]`` (``N_out = N``, or ``I`` when gated) in x's dtype.
    ``norm_weight [K]``: RMSNorm prologue with ``eps``; ``residual [M, N_out]``: added after the projection;
    ``gated_input``: x is ``[M, 2 * K]``, the packed ``[gate; up]`` output of the previous projection, and the
    kernel's input is ``silu(gate) * up`` (not with ``norm_weight``).
    ``config``: override of :func:`gemv_config` (keys BN, BK, num_warps, num_stages; for benchmarking).
    ``dot``: the tensor-core variant (1..16 rows) or not; default the rules of :func:`fused_linear.uses_dot_kernel`
    (2..16 rows) and :func:`fused_linear.uses_dot_one_row` (one row, a long K)
    (tests and ``scripts/bench_gemv.py --dot`` force it, to cover every prologue and epilogue).
    ``early``: the caller's promise that the next kernel reads nothing but weights before its PDL wait (anything but
    the fused decode attention): the one-row kernel then lets it launch before its own wait
    (:func:`gemv_early_enabled`).
    ``handoff``: the launch's role in the one-row MLP handoff (:data:`GEMV_HANDOFF`; 0 none):
    :data:`HANDOFF_PRODUCER`, this gate/up launch (K = hidden; packed, or ``gated``) publishes its activation tiles as
    it finishes them; :data:`HANDOFF_CONSUMER`, this down launch (``gated_input`` after a packed one, a plain input
    after a gated one) takes them so; the two launches back to back on one stream, the producer first.
    ``probe``: diagnostics (``scripts/probe_decode_attention.py``; the one-row kernel only) -- an int64 buffer of
    ``[programs, 2 * PROBE_STAMPS]`` the kernel fills with clock stamps: 0 entry, 1 preloaded tiles arrived, 2 after
    the PDL wait, 3 after the main loop, 4 after the store; the SM id in slot ``PROBE_STAMPS - 1``.
    The published norm (the tensor-core kernel; ``fused_linear.GEMM_ROWS_PRENORM``): ``publish_norm [N_out]``, the
    next RMSNorm's weights -- the launch then returns ``(out, xw, stats)``: ``xw = bf16(publish_norm * out)`` and
    ``stats [M, P]``, the fp32 sums of ``out ** 2`` over its P column blocks; ``norm_stats`` (with ``eps``) -- x is
    such an ``xw`` and these its statistics: the launch scales its fp32 sums by ``rsqrt(sum(stats) / K + eps)``
    before rounding, the norm without a launch of its own (not with ``norm_weight`` or ``gated_input``).
    ``out`` (the one-row kernel, ungated, no residual; the step's head): a float32 ``[M, N]`` with contiguous rows the
    result goes to -- rounded to x's dtype, then widened (exactly) -- and is returned; ``active [M]`` (bool, with
    ``out``): the rows whose flag is off get zeros (``.float().masked_fill(~active[:, None], 0)`` in one launch)."""
    k = weight.shape[1] if weight.dim() == 2 else -1
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != (2 * k if gated_input else k):
        raise ValueError(f"fused_linear_triton: x {tuple(x.shape)} and weight {tuple(weight.shape)}"
                         f"{' (gated input: x has 2 * K columns)' if gated_input else ''}")
    if gated_input and norm_weight is not None:
        raise ValueError("fused_linear_triton: gated_input and norm_weight do not combine")
    m = x.shape[0]
    n = weight.shape[0]
    if gated and n % 2:
        raise ValueError(f"fused_linear_triton: gated needs an even number of weight rows, got {n}")
    n_out = n // 2 if gated else n
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight.stride(-1) != 1:
        raise ValueError("fused_linear_triton: weight rows must be contiguous")
    if norm_weight is not None:
        if norm_weight.shape != (k,):
            raise ValueError(f"fused_linear_triton: norm_weight {tuple(norm_weight.shape)} for K={k}")
        norm_weight = norm_weight.contiguous()
    if residual is not None:
        if residual.shape != (m, n_out):
            raise ValueError(f"fused_linear_triton: residual {tuple(residual.shape)}, expected {(m, n_out)}")
        if residual.stride(-1) != 1:
            residual = residual.contiguous()
    into = _into_args(out, active, x, m, n_out, gated, residual, dot, publish_norm, handoff, probe)
    if out is None:
        out = torch.empty((m, n_out), dtype=x.dtype, device=x.device)
    else:
        dot = False  # the one-row kernel takes it (``_into_args``)
    if m == 0 or n_out == 0:
        if publish_norm is not None:
            return out, torch.empty_like(out), out.new_zeros((m, gemm_rows_parts(m, n, k)), dtype=torch.float32)
        return out
    if k == 0:
        raise ValueError("fused_linear_triton: K must be positive")
    if dot is None:
        prologue = norm_weight is not None or gated_input
        dot = (uses_dot_kernel(m, gated=gated, prologue=prologue, norm=norm_weight is not None and not gated_input,
                               elements=weight.numel())
               or (probe is None and not handoff and uses_dot_one_row(m, k, gated=gated, prologue=prologue)))
    if dot and not 1 <= m < DOT_ROWS.stop:
        raise ValueError(f"fused_linear_triton: the tensor-core kernel takes 1..{DOT_ROWS.stop - 1} rows, got {m}")
    if dot and (probe is not None or handoff):
        raise ValueError("fused_linear_triton: probe and handoff are for the one-row kernel (dot=False)")
    prenorm = _prenorm_args(x, m, n_out, gated, gated_input, norm_weight, norm_stats, publish_norm, dot)
    if dot:
        cfg = {**gemm_rows_config(m, n, k, gated), **(config or {})}
        bn, bk = int(cfg["BN"]), int(cfg["BK"])
        if bn < 16 or bk < 16:
            raise ValueError(f"fused_linear_triton: the tensor-core kernel needs BN, BK >= 16, got {bn}, {bk}")
        parts = triton.cdiv(n_out, bn)
        published = None
        if publish_norm is not None:
            published = (torch.empty_like(out), torch.empty((m, parts), dtype=torch.float32, device=x.device))
            prenorm.update(NW_OUT=publish_norm, XW=published[0], S_OUT=published[1], stride_xw=published[0].stride(0),
                           OUT_PARTS=parts)
        _fused_gemm_rows_kernel[(parts, triton.cdiv(m, GEMV_MAX_ROWS))](
            x, weight, norm_weight if norm_weight is not None else x, residual if residual is not None else out, out,
            m, n_out, x.stride(0), weight.stride(0), residual.stride(0) if residual is not None else 0,
            out.stride(0), float(eps), K=k, MP=GEMV_MAX_ROWS, BN=bn, BK=bk, HAS_NORM=norm_weight is not None,
            HAS_RES=residual is not None, GATED=bool(gated), EVEN_K=k % bk == 0, GATED_IN=bool(gated_input),
            PREFETCH=min(gemm_rows_prefetch_tiles(norm_stats is not None), triton.cdiv(k, bk)),
            PF_LINES=max(1, bk // 64),
            DOT_F32=_interpreting(), NORM_STAGES=GEMM_ROWS_NORM_STAGES if norm_weight is not None else 0,
            RES_FIRST=residual is not None and switch("FLARE_GEMM_ROWS_RES_FIRST", GEMM_ROWS_RES_FIRST),
            num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), **_pdl(x.device), **prenorm)
        return (out, *published) if published is not None else out
    cfg = {**gemv_config(m, n, k, gated), **(config or {})}
    bn, bk = int(cfg["BN"]), int(cfg["BK"])
    mp = min(triton.next_power_of_2(m), GEMV_MAX_ROWS)
    grid = (triton.cdiv(n_out, bn), triton.cdiv(m, mp))
    preload = gemv_preload_tiles(m, k, bk, norm_weight is None and not gated and not gated_input, cfg.get("preload"))
    flat, stream_stages = gemv_flat(mp, k, bk, preload)
    handoff_args = (_handoff_args(x, weight, gated, gated_input, norm_weight is not None, config, handoff)
                    if handoff else {})
    _fused_gemv_kernel[grid](
        x, weight, norm_weight if norm_weight is not None else x, residual if residual is not None else out, out,
        m, n_out, x.stride(0), weight.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
        float(eps), K=k, MP=mp, BN=bn, BK=bk, HAS_NORM=norm_weight is not None, HAS_RES=residual is not None,
        GATED=bool(gated), EVEN_K=k % bk == 0, GATED_IN=bool(gated_input),
        PREFETCH=gemv_prefetch_tiles(weight, bk), PF_LINES=max(1, bk // 64), PRELOAD=preload,
        X_FIRST=switch("FLARE_GEMV_X_FIRST", True), EARLY=early and gemv_early_enabled(x.device, m),
        FLAT=flat, STREAM_STAGES=stream_stages,
        X_AHEAD=gemv_x_ahead(k, bk, preload, norm_weight is None and not gated_input and not handoff),
        NORM_L1=(norm_weight is not None and k % 64 == 0 and triton.next_power_of_2(k // 64) == k // 64
                 and not _interpreting() and switch("FLARE_GEMV_NORM_L1", GEMV_NORM_L1)),
        PRELOAD_EVICT=preload > 0 and switch("FLARE_GEMV_PRELOAD_EVICT_FIRST", GEMV_PRELOAD_EVICT_FIRST),
        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), **_pdl(x.device), **handoff_args,
        **_probe_args(None if probe is None else (probe,), 0, grid[0] * grid[1]), **into)
    return out


_ROUND_TY = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _into_args(out: torch.Tensor | None, active: torch.Tensor | None, x: torch.Tensor, m: int, n_out: int,
               gated: bool, residual, dot, publish_norm, handoff: int, probe) -> dict:
    """The one-row kernel's arguments for :func:`fused_linear_triton`'s ``out`` / ``active`` (none without ``out``);
    raises naming what does not fit."""
    if out is None:
        if active is not None:
            raise ValueError("fused_linear_triton: active comes with out")
        return {}
    if gated or residual is not None or dot or publish_norm is not None or handoff or probe is not None:
        raise ValueError("fused_linear_triton: out is for the one-row kernel's plain projection (ungated, no residual, "
                         "dot=False, no publish_norm, handoff or probe)")
    if tuple(out.shape) != (m, n_out) or out.dtype != torch.float32 or out.stride(-1) != 1 or x.dtype not in _ROUND_TY:
        raise ValueError(f"fused_linear_triton: out must be a float32 [{m}, {n_out}] with contiguous rows (x bf16 or "
                         f"fp16), got {tuple(out.shape)} {out.dtype} strides {out.stride()}, x {x.dtype}")
    if active is not None and (tuple(active.shape) != (m,) or active.dtype != torch.bool):
        raise ValueError(f"fused_linear_triton: active must be a [{m}] bool tensor, got {tuple(active.shape)} "
                         f"{active.dtype}")
    args = {"ROUND_TY": _ROUND_TY[x.dtype]}
    if active is not None:
        args.update(ACTIVE=active.contiguous(), HAS_ACTIVE=True)
    return args
