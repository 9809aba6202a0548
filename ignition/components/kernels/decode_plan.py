"""The decode attention's launch plan, shared by the two-kernel path (:mod:`.paged_decode`) and the fused one
(:mod:`.fused_decode`): the pools' checks, splits, key blocks, workspaces, the pre-wait K/V prefetch, the launch
options and their side-by-side switches, each with what it measured."""

from __future__ import annotations

import torch
import triton

from ignition.components.kernels.launch import _interpreting, pad_shared_memory
from ignition.components.switches import mebibytes, number, rows as switch_rows, switch, whole


def _check_pools(what: str, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> tuple[int, int]:
    """``(page size, KV heads)`` of one layer's pools ``[pages + 1, page, KV, D]`` for ``q [B, T, H, D]``; raises
    naming ``what`` when heads, head_dim or the pools disagree, or the page size is not a power of two."""
    h, d = q.shape[2], q.shape[3]
    _, page, kvh, dk = k_pool.shape
    if h % kvh or dk != d or v_pool.shape != k_pool.shape:
        raise ValueError(f"{what}: q {tuple(q.shape)} vs pools {tuple(k_pool.shape)}, {tuple(v_pool.shape)}")
    if page & (page - 1):
        raise ValueError(f"{what}: page size {page} must be a power of two")
    return page, kvh


#: Tried and removed: the decode kernels' pipelined key loop with more stages (``FLARE_DECODE_STAGES=N``): by default
#: each key block waits for every copy in flight (offline sm90 TTGIR ``async_wait {num = 0}``); from 5 stages later
#: blocks' copies stay in flight (``num = 4``), the same bits -- slower side by side in one process with the null
#: (``results/20261204T053500Z-sm90-run128``): Qwen3-8B 5 and 6 stages 1.091x at batch 1, 1.020x at batch 4.


#: Whether the fused decode kernel forms the row's new key's softmax partial in a program of its own
#: (``FLARE_DECODE_NEW_KEY_APART=1`` / ``0``; read at each launch, for side-by-side runs): one more program per (row,
#: KV head) writes the new key and value, reads that one key back and stores its partial; the other splits walk the
#: keys before it and write nothing.  Without, the split holding the row's last key block writes the new key first,
#: then walks its blocks: that writer's chain -- query rows, the new key's norm and rotation, the write, then its
#: blocks -- is the launch's longest (run 123's probe: the write 0.16 us median, 3.2 us at the writer), on the step's
#: critical path.  The reduce then combines one partial more; where the context without the new key fills whole
#: blocks (1024 keys and the new one) the busiest split also walks one block less.  The sums group differently: not
#: the two-kernel path's bits (within the same fp64 bound; deterministic).  Side by side in one process with the null
#: (``results/20261204T072300Z-sm90-run132``): Qwen3-8B batch 1 1.0035x, batch 4 1.0102x (both slower by the paired
#: blocks; at one row the writer was not the longest chain: the attention 9.79 -> 9.66 us, the reduce 2.27 -> 2.99),
#: Qwen3-0.6B batch 1 1.0037x, batch 4 0.9639x (paired blocks 10/10 faster, within noise by the min-max rule; the
#: attention 14.91 -> 13.57 us per layer).  Off.
DECODE_NEW_KEY_APART = False


def decode_new_key_apart() -> bool:
    """:data:`DECODE_NEW_KEY_APART` (``FLARE_DECODE_NEW_KEY_APART``, read at each launch)."""
    return switch("FLARE_DECODE_NEW_KEY_APART", DECODE_NEW_KEY_APART)


#: The most rows a fused decode launch combines its splits itself at, instead of the reduce kernel after it
#: (``FLARE_DECODE_COMBINE_ROWS=N``; read at each launch, for side-by-side runs; 0: never): each program, after storing
#: its partial, draws a ticket of its (row, KV head) -- a CTA barrier, one acq_rel add at GPU scope -- and the program
#: drawing the last one puts the count back to zero and combines that group's heads
#: (``paged_decode._decode_combine_last``): no reduce launch, so the output projection waits on the attention itself.
#: Run 168 (Qwen3-8B, one row) puts the reduce at 2.18 us per layer on the critical path, most of it the wait for the
#: attention's completion and the reduce's own completion before the output projection's wait returns.  Run 9
#: (``results/20261201T031427Z-sm90-run9``, before PDL in the step, 32 splits) measured a last-program combine 2 us
#: slower than the reduce kernel at Qwen3-8B batch 1 in an attention-only graph; that combine read the partials head by
#: head (a round trip each, a CTA barrier between); this one issues every max of the group at once, then every sum and
#: accumulator (two round trips; 17 splits at one row since).  The weights are the reduce's; the sums run in split
#: order, one after another, where the reduce kernel sums a tree: not its bits (within the same fp64 bound;
#: deterministic).  Offline sm90 (``scripts/sm90_kernel_check.py``): Qwen3-8B's one-row launch 116 -> 125 registers (2
#: programs per SM at 8 warps either way), the batch-4 launch 96 -> 106 (5 -> 4 per SM: its 544 programs would take
#: two waves).  Measured off: the Qwen3-8B step side by side on an H100 1.9% slower at batch 1 with it (1 row; B
#: ``FLARE_DECODE_COMBINE_ROWS=0`` 0.9807x, 10/10 paired blocks), batch 4 within noise
#: (``results/20261205T133434Z-sm90-run170``; GPU tests pass); again on an H100 with the null
#: (``results/20261205T153711Z-sm90-run174``): with it 1.0218x slower at batch 1 (0/10 paired blocks faster against A
#: and A2), batch 4 1.0014x; a third time on an H100 (``results/20261205T162102Z-sm90-run176``): 1.0194x slower at batch
#: 1 (0/10), the attention 8.93 -> 14.50 us per layer in the critical path where the reduce it saves took 2.66.  Why
#: (offline sm90 SASS of the one-row launch, ``cuobjdump -sass``): after its partial's stores each program's thread 0
#: runs ``MEMBAR.ALL.GPU`` (the release: it waits for those stores to reach L2), then ``ATOMG`` (a round trip), then
#: ``CCTL.IVALL`` and a CTA barrier; the last program then loads the 17 maxima together and the 51 sums, accumulators
#: and maxima together (two more round trips: the loads are batched as intended) -- four dependent round trips after
#: the stores, where the reduce kernel, resident and waiting, needs the grid dependency and one.  0.
DECODE_COMBINE_ROWS = 0


def decode_combine_in_kernel(rows: int) -> bool:
    """Whether a fused decode launch of ``rows`` rows combines its splits itself: up to :data:`DECODE_COMBINE_ROWS`
    rows (``FLARE_DECODE_COMBINE_ROWS``, read at each launch)."""
    return rows <= switch_rows("FLARE_DECODE_COMBINE_ROWS", DECODE_COMBINE_ROWS)


#: Whether the decode kernels form P V as three bf16 products of P's exact bf16 pieces (:func:`_decode_p_pieces`) with
#: V as it is in the pool, instead of one tf32x3 product of fp32 P and V widened to fp32 (``FLARE_DECODE_PV_SPLIT=1``
#: / ``0``; read at each launch, for side-by-side runs).  Both are ~fp32 exact: P's pieces hold all 24 bits (tf32x3
#: 22); every bf16 product is exact in fp32.  Offline sm90 (ptxas; the widened V and its tf32 halves were what held the
#: registers): Qwen3-8B's one-row launch (64-key blocks, 17 splits, the K/V prefetch) 255 -> 154 registers, no spills;
#: Qwen3-0.6B's wide one-row launch 202 -> 126; batch 4's 16-key launch 95 -> 84.  Another fp32 sum order than
#: tf32x3: not its bits (deterministic either way; the same bound against fp64).  On since run 141: Qwen3-8B side by
#: side in one process with the null on the H200, 1024-token context (``results/20261204T133200Z-sm90-run141``):
#: batch 1 0.9961x (paired blocks 10/10 faster against A and A2; the attention 9.79 -> 9.28 us and its reduce 2.29 ->
#: 1.86 per layer in the critical path), batch 4 0.9802x (B faster by the min-max rule; the attention 14.94 -> 12.58
#: us per layer).  ``FLARE_DECODE_MAXNREG=176`` on the tf32x3 kernel instead (the same two o_proj programs per SM
#: beside it) was 1.032x / 1.042x slower there.  Except the wide one-row launch (:func:`fused_decode_wide`, Qwen3-0.6B),
#: which keeps tf32x3 unless the switch says otherwise: Qwen3-0.6B side by side in one process with the null
#: (``results/20261204T134100Z-sm90-run142``), tf32x3 against the pieces at batch 1 0.9526x against A, 0.9860x against
#: A2 (paired blocks 10/10 faster against both; the critical path per layer 21.36 -> 20.03 us, the reduce after the
#: attention 3.42 -> 1.70), at batch 4 (the pipelined launch) 1.0615x slower -- and the wide launch's cap at 4 programs
#: per SM (its 126 registers with the pieces) 1.013x slower at batch 1 (:data:`FUSED_DECODE_WIDE_PER_SM`).
DECODE_PV_SPLIT = True


def decode_pv_split(wide: bool = False) -> bool:
    """:data:`DECODE_PV_SPLIT` (``FLARE_DECODE_PV_SPLIT=1`` / ``0`` forces it for every launch, read at each launch);
    unset, off for the ``wide`` launches (:func:`fused_decode_wide`)."""
    return switch("FLARE_DECODE_PV_SPLIT", DECODE_PV_SPLIT and not wide)


#: The fewest rows a fused decode launch takes the software-pipelined key loop at (fewer: the plain ``while`` loop --
#: same blocks, same order, same bits).  One row plain since run 165: Qwen3-8B side by side in one process with the
#: null on the H200 (``results/20261205T014952Z-sm90-run165``, 1024-token context), the plain loop everywhere against
#: the pipelined one: batch 1 0.9948x (paired blocks 10/10 faster against A and A2, within noise by the min-max rule;
#: the attention 9.25 -> 8.24 us per layer in the critical path, the layer 105.92 -> 105.15), batch 4 1.0195x slower
#: (paired blocks 0/10).  The pipelined loop's prologue issues the next block's loads before the current one's
#: arithmetic; at one row a program walks a single 64-key block of a 1024-token context (17 splits), so there is no
#: next block to overlap and the prologue only lengthens the chain.
DECODE_PIPELINE_MIN_ROWS = 2


def decode_pipelined(rows: int | None = None, wide: bool = False) -> bool:
    """Whether the decode kernels' key loop is a software-pipelined ``range`` loop (compiled) for a launch of ``rows``
    rows: from :data:`DECODE_PIPELINE_MIN_ROWS` rows (None: any row count, the three-launch path's rule), never for
    the ``wide`` one-row launch (:func:`fused_decode_wide`); ``FLARE_DECODE_PIPELINE=1`` / ``0`` forces it on / off
    for every other launch (read at each launch; side-by-side runs) -- the plain ``while`` loop the interpreter runs,
    same blocks, same order, same bits."""
    if _interpreting() or wide:
        return False
    return switch("FLARE_DECODE_PIPELINE", rows is None or rows >= DECODE_PIPELINE_MIN_ROWS)


def paged_decode_num_splits(batch: int, kv_heads: int, max_blocks: int, target_programs: int = 1024,
                            max_splits: int = 64) -> int:
    """Splits per (row, KV head), from static shapes only (capturable): ~1024 programs (about 8 per SM of a
    132-SM GPU), never more than the key blocks of the block-table width (a split covers at least one block at
    full width).
    Each program walks its pages one dependent load chain at a time, so the page loop is latency-bound: on the
    H200 (results/20261130T205344Z-sm90-run2) 256 programs took 14 us per layer at B=1 and 36 us at B=4 for
    1024-token contexts (2 and 8 pages per program); more, shorter splits keep more loads in flight."""
    return max(1, min(max_blocks, max_splits, triton.cdiv(target_programs, max(1, batch * kv_heads))))


#: Keys per block of the fused decode kernel's wide launches (:func:`fused_decode_wide`).
FUSED_DECODE_WIDE_BLOCK_N = 32

#: Whether the wide launches of :func:`fused_decode_wide` are the default (``FLARE_DECODE_WIDE=1`` / ``0`` sets it).
#: On since run 90 (``results/20261201T222600Z-sm90-run90``): in the full replay of record (``h200_run.sh``'s replay
#: stage, Qwen3-0.6B, 1024-token context) with their splits capped at one wave (:func:`fused_decode_wide_splits`)
#: the batch-1 step took 0.8137 / 0.8154 ms (seeds 0 / 1) against 0.8562 / 0.8573 without them in the same call,
#: 0.950x; the attention 8.83 -> 5.34 us per layer in the critical path, the layer 24.5 -> 22.7 us.  Before the cap
#: (runs 87, 89) the full replay showed no gain (0.8547, 0.8665 ms) while plain and side-by-side replays showed the
#: same 0.950x (runs 85-88): the wide kernel holds 201 registers per thread (sm90 ptxas; the pipelined one 95), 2
#: programs per SM, and the split count is static, from the block table's width -- the full bench's 81-page table
#: gave 41 splits, 328 programs, two waves that kept the early-launched projections from becoming resident (their
#: critical-path share grew 3.4 -> 5.5 and 2.5 -> 4.8 us); the plain bench's 65 pages gave 33 splits, one wave.
#: ``FLARE_DECODE_MAXNREG=128`` instead of the cap spills and was slower (0.9086 ms, run 90).
DECODE_WIDE = True

#: Programs per SM of the wide launch (201 registers per thread at 4 warps, offline sm90 ptxas:
#: ``scripts/sm90_kernel_check.py``): :func:`fused_decode_wide_splits` keeps its programs in one wave
#: (``FLARE_DECODE_WIDE_PER_SM=N`` sets it, read at each launch).  With P V from P's pieces the launch would hold 126
#: registers, 4 programs per SM: that cap was 1.013x slower at Qwen3-0.6B batch 1 side by side in one process
#: (``results/20261204T134100Z-sm90-run142``), and the pieces themselves slower there than tf32x3, which this launch
#: keeps (:data:`DECODE_PV_SPLIT`).
FUSED_DECODE_WIDE_PER_SM = 2

#: SMs assumed where the device has none to report (the interpreter): the H200's.
DEFAULT_SMS = 132

#: An sm90 SM's limits for resident programs: 65,536 registers, allocated per warp in units of 256 (8 per thread);
#: 228 KiB of shared memory with 1 KiB reserved per program; 64 warps; 32 programs.
SM90_REGISTERS, SM90_SHARED, SM90_WARPS, SM90_PROGRAMS = 65536, 228 << 10, 64, 32


def programs_per_sm(registers: int, warps: int, shared: int = 0) -> int:
    """Programs of a kernel resident on one sm90 SM at once, from its registers per thread (``ptxas``), warps per
    program and shared memory per program in bytes -- e.g. 255 registers at 4 warps: 2; 168: 3; 127: 4; 95 and 84: 5
    (88 after the warp's rounding)."""
    per_warp = -(-registers * 32 // 256) * 256
    return min(SM90_REGISTERS // (per_warp * warps), SM90_SHARED // (shared + 1024), SM90_WARPS // warps,
               SM90_PROGRAMS)


def fused_decode_wide_splits(batch: int, kv_heads: int, device: torch.device) -> int:
    """The wide launch's split cap: its ``batch * kv_heads * splits`` programs in one wave of
    :data:`FUSED_DECODE_WIDE_PER_SM` per SM (``device``'s SM count; :data:`DEFAULT_SMS` off CUDA) -- 33 for
    Qwen3-0.6B's 8 KV heads on the H200's 132 SMs."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else DEFAULT_SMS
    per_sm = whole("FLARE_DECODE_WIDE_PER_SM", FUSED_DECODE_WIDE_PER_SM, low=1)  # side-by-side runs
    return max(1, per_sm * sms // max(1, batch * kv_heads))


def fused_decode_wide(batch: int, groups: int) -> bool:
    """Whether a fused decode launch takes :data:`FUSED_DECODE_WIDE_BLOCK_N`-key blocks (at least a page) and the plain
    key loop instead of whole-page blocks and the software-pipelined loop: when :data:`DECODE_WIDE`
    (``FLARE_DECODE_WIDE``), at one row when the group, rounded up to a power of two, is at most 2 -- the launches
    whose split count reaches the 64 cap (:func:`fused_decode_num_splits`); their splits are then capped at one wave
    (:func:`fused_decode_wide_splits`).  An explicit ``FLARE_DECODE_BLOCK_N`` replaces it (both read at each launch,
    for side-by-side runs).  Other shapes measured on the H200, side by side in one process
    (``results/20261201T213500Z-sm90-run85``, ``...T213800Z-sm90-run86``): Qwen3-0.6B the plain loop alone 1.027x,
    32-key blocks over 32 splits 1.036x (1025 keys: 17 programs per head holding 2 blocks), 64-key blocks over 16
    splits 1.085x, batch 4 1.065x slower; Qwen3-8B (G=4, 32 splits) batch 1 1.0025x, the plain loop alone 0.9998x
    (within noise)."""
    return (batch == 1 and triton.next_power_of_2(max(1, groups)) <= 2
            and switch("FLARE_DECODE_WIDE", DECODE_WIDE) and number("FLARE_DECODE_BLOCK_N") is None)


#: Keys per block of the fused decode kernel's other one-row launches (groups above 2: Qwen3-8B's 4), so that a split
#: covers its share in one block -- one dependent round of page ids then K/V instead of one per 16-key page: at a
#: 1024-token context the 1025 keys are 17 blocks over 17 splits, where 16-key blocks were 65 over 32 splits, 3 in a
#: row for the busiest programs.  Side by side in one process with the null (``results/20261202T100100Z-sm90-run124``,
#: ``FLARE_DECODE_BLOCK_N=64``): Qwen3-8B batch 1 0.9866x (paired blocks 10/10 against A and A2; 32-key blocks
#: 0.9934x), batch 4 1.061x slower -- so at one row only.  In the replay (``results/20261202T101300Z-sm90-run126``)
#: the attention's critical path per layer went 10.82 -> 9.41 us and the reduce's 2.56 -> 2.21 (run 122).
#: ``FLARE_DECODE_ONE_ROW_BLOCKS=0`` restores whole pages; an explicit ``FLARE_DECODE_BLOCK_N`` replaces both.  Other
#: contexts not measured.
FUSED_DECODE_ONE_ROW_BLOCK_N = 64


def _large_group_blocks(groups: int, name: str) -> bool:
    """The shared part of the fused decode kernel's block rules for groups above 2 heads (rounded up to a power of
    two): the rule's switch ``name`` on (default) and no explicit ``FLARE_DECODE_BLOCK_N`` (read at each launch)."""
    return (triton.next_power_of_2(max(1, groups)) > 2 and switch(name, True)
            and number("FLARE_DECODE_BLOCK_N") is None)


def fused_decode_one_row_blocks(batch: int, groups: int) -> bool:
    """Whether a fused decode launch takes :data:`FUSED_DECODE_ONE_ROW_BLOCK_N`-key blocks: at one row, for a group
    above 2 heads (rounded up to a power of two; the smaller ones are :func:`fused_decode_wide`'s, whole pages with
    ``FLARE_DECODE_WIDE=0``), ``FLARE_DECODE_ONE_ROW_BLOCKS`` on (default) and no explicit ``FLARE_DECODE_BLOCK_N``
    (read at each launch, for side-by-side runs)."""
    return batch == 1 and _large_group_blocks(groups, "FLARE_DECODE_ONE_ROW_BLOCKS")


#: Keys per block of the fused decode kernel's launches of more rows for a group above 2 heads (Qwen3-8B's 4 at batch
#: 4: 17 splits of four 16-key pages each, the busiest split's chain of 4 dependent page rounds -> 2 rounds of 32 keys).
#: Side by side in one process with the null (``results/20261204T151200Z-sm90-run147``, ``FLARE_DECODE_BLOCK_N=32``):
#: Qwen3-8B batch 4 0.9869x (paired blocks 10/10 faster against A and A2, within noise by the min-max rule; per layer
#: 118.18 -> 116.42 us in the critical path); 64-key blocks there 1.0233x slower (``...T152000Z-sm90-run148``).
#: Off in the replay of record's side by side (``results/20261204T161200Z-sm90-run149``): 1.0117x slower at batch 4
#: (the attention 9.86 -> 11.20 us per layer).  Measured at a 1024-token context only; other contexts and batch 8 not
#: measured.  ``FLARE_DECODE_MULTI_ROW_BLOCKS=0`` restores whole pages; an explicit ``FLARE_DECODE_BLOCK_N`` replaces it.
FUSED_DECODE_MULTI_ROW_BLOCK_N = 32


def fused_decode_multi_row_blocks(batch: int, groups: int) -> bool:
    """Whether a fused decode launch takes :data:`FUSED_DECODE_MULTI_ROW_BLOCK_N`-key blocks: more than one row, a group
    above 2 heads (rounded up to a power of two), ``FLARE_DECODE_MULTI_ROW_BLOCKS`` on (default) and no explicit
    ``FLARE_DECODE_BLOCK_N`` (read at each launch, for side-by-side runs)."""
    return batch > 1 and _large_group_blocks(groups, "FLARE_DECODE_MULTI_ROW_BLOCKS")


def decode_block_n(page: int, block_n: int | None = None) -> int:
    """Keys per block of the decode kernels for pages of ``page`` keys: ``block_n`` when given (a power of two, a
    multiple of the page size and >= 16 -- a block gathers ``block_n / page`` pages, one page id per key), else
    ``FLARE_DECODE_BLOCK_N`` when set (side-by-side runs; read at each launch), else whole pages, at least 16
    (``tl.dot``'s minimum N).  Raises naming the bad value.

    Whole pages, measured on the H200 (1024-token contexts, 16-key pages, 32 splits at one row):

    - the attention alone (``scripts/bench_decode_attention.py``, ``results/20261201T065805Z-sm90-run20``): 32-key
      blocks took 8.33 us per layer for Qwen3-0.6B against 9.14 with 16-key blocks, 9.12 against 9.08 for Qwen3-8B;
      at batch 4 16-key blocks won, 64-key blocks lost everywhere;
    - but in the decode step (``results/20261201T070650Z-sm90-run21``, side by side) they did not help: Qwen3-0.6B
      batch 1 1.1216 ms against 1.1021 with 16-key blocks (within noise by the min-max rule, the median 1.8 %
      slower), Qwen3-8B 4.7312 against 4.7301;
    - Qwen3-8B batch 4 (17 splits of 4 pages, the split P V) side by side in one process with the null: 32-key blocks
      0.9869x (paired blocks 10/10 faster against A and A2, within noise by the min-max rule; per layer 118.18 -> 116.42
      us; ``results/20261204T151200Z-sm90-run147``) -- but 1.008x slower at batch 1, where they replace the 64-key
      one-row blocks --, 64-key blocks 1.0233x slower (``results/20261204T152000Z-sm90-run148``): the rule of
      :func:`fused_decode_multi_row_blocks`."""
    if block_n is None:
        env = number("FLARE_DECODE_BLOCK_N")
        if env is None:
            return max(16, page)
        block_n = int(env)
    if block_n < 16 or block_n & (block_n - 1) or block_n % page:
        raise ValueError(f"decode block_n {block_n}: must be a power of two >= 16 and a multiple of the page size "
                         f"{page}")
    return block_n


def _decode_geometry(what: str, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                     block_tables: torch.Tensor, num_splits: int | None, fused: bool = False,
                     block_n: int | None = None) -> dict:
    """The decode kernels' shape constants for ``q [B, 1, H, D]`` and one layer's pools (raises naming ``what``);
    ``num_splits`` None: :func:`fused_decode_num_splits` when ``fused``, else :func:`paged_decode_num_splits`;
    ``block_n``: keys per block (:func:`decode_block_n`)."""
    b, t, h, d = q.shape
    if t != 1:
        raise ValueError(f"{what}: one query token per row, got T={t}")
    page, kvh = _check_pools(what, q, k_pool, v_pool)
    if k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError(f"{what}: pools must be contiguous in head_dim")
    g = h // kvh
    wide = fused and block_n is None and fused_decode_wide(b, g)
    if wide:
        block_n = max(FUSED_DECODE_WIDE_BLOCK_N, page)
    elif fused and block_n is None and fused_decode_one_row_blocks(b, g):
        block_n = max(FUSED_DECODE_ONE_ROW_BLOCK_N, page)
    elif fused and block_n is None and fused_decode_multi_row_blocks(b, g):
        block_n = max(FUSED_DECODE_MULTI_ROW_BLOCK_N, page)
    block_n = decode_block_n(page, block_n)
    max_blocks = triton.cdiv(block_tables.shape[1] * page, block_n)
    splits = num_splits or (fused_decode_num_splits(b, kvh, g, max_blocks) if fused
                            else paged_decode_num_splits(b, kvh, max_blocks))
    if wide and not num_splits:  # one wave, counting the new key's own programs (:data:`DECODE_NEW_KEY_APART`)
        own = 1 if decode_new_key_apart() else 0
        splits = max(1, min(splits, fused_decode_wide_splits(b, kvh, q.device) - own))
    gp = triton.next_power_of_2(g)
    return dict(B=b, H=h, D=d, KVH=kvh, G=g, GP=gp, QR=max(16, gp), PAGE=page, BLOCK_N=block_n, SPLITS=splits,
                SP=triton.next_power_of_2(splits), WIDE=wide)


def _decode_workspace(geo: dict, device, workspace=None):
    """The fp32 split workspaces ``(m, l [B, KV, S, GP], acc [B, KV, S, GP, D])``: ``workspace`` checked, or new."""
    shape = (geo["B"], geo["KVH"], geo["SPLITS"], geo["GP"])
    if workspace is None:
        m_ws = torch.empty(shape, dtype=torch.float32, device=device)
        return m_ws, torch.empty_like(m_ws), torch.empty((*shape, geo["D"]), dtype=torch.float32, device=device)
    m_ws, l_ws, acc_ws = workspace
    if (tuple(m_ws.shape) != shape or tuple(l_ws.shape) != shape or tuple(acc_ws.shape) != (*shape, geo["D"])
            or any(w.dtype != torch.float32 or not w.is_contiguous() for w in workspace)):
        raise ValueError("paged decode attention: workspace shapes/dtypes do not match")
    return workspace


#: Keys per program the fused decode kernel prefetches into L2 before its PDL wait (at batch 1: see
#: :data:`DECODE_KV_PREFETCH_ROWS`).  The prefetch pays when the kernel launches early, during the qkv projection --
#: the fused GEMV, which Qwen3 runs at one row (``prefers_fused``); after cuBLAS (more rows) it only lengthens the
#: critical path.  H200, Qwen3-8B, 1024-token context (``results/20261201T044049Z-sm90-run13``): batch 1 4.846 ->
#: 4.779 ms; batch 4 5.524 -> 5.714 (slower: the first version looped over the blocks, there after cuBLAS).
#: Qwen3-0.6B batch 1 (``results/20261201T045516Z-sm90-run15``): 1.1106 -> 1.1217 ms alone, 1.1090 with the EARLY
#: reduce and the whole-weight GEMV prefetch.  Tried and removed: loading the first key blocks into registers before
#: the wait instead (new slot patched in after it) -- bitwise in the interpreter but not compiled for sm90, and
#: Qwen3-0.6B batch 1 within noise, batch 4 1.028x slower (``results/20261201T114209Z-sm90-run27``); again on this
#: kernel, in addition to the prefetch where it may read ahead, only the writer patching its tiles
#: (``results/20261202T021700Z-sm90-run102``): Qwen3-8B batch 1 1.011x (2 blocks) and 1.007x (1 block) slower, within
#: noise, and on sm90 the new keys' bits moved (not diagnosed; a likely cause: the patch's join giving the key halves
#: another layout, so the k_norm statistics sum in another order).
#: Per model it differs (``results/20261201T163000Z-sm90-attnprobe-runs48-53``, one-row layer graphs side by side):
#: off, Qwen3-8B 1.015x slower, Qwen3-0.6B 0.950x (its 8 MiB qkv projection ends ~3.6 us after the attention
#: starts prefetching 4 MiB of K/V, which competes with it); in Qwen3-0.6B's real decode step
#: (``results/20261201T164200Z-sm90-run54``, side by side in one process) 0.980x at batch 1 -- within noise by the
#: min-max rule then; since the early output/MLP projections 0.921x, faster by the rule: it now needs a long enough
#: projection before it (:data:`DECODE_KV_PREFETCH_MIN_BYTES`).
DECODE_KV_PREFETCH_KEYS = 64

#: Tried and removed: the one-row launch keeping its first key block's page ids, which that prefetch reads before the
#: wait, in registers for its key loop (``FLARE_DECODE_PRE_PAGES``; the block-table round trip out of the chain after
#: the wait, the same bits) -- Qwen3-8B batch 1 1.0123x slower side by side in one process with the null (paired blocks
#: 0/10; ``results/20261204T203500Z-sm90-run161``): 162 registers instead of 154, the attention's programs resident
#: earlier beside the qkv's last ones (its lead 1.73 -> 3.10 us), qkv 11.58 -> 13.02 and the attention 9.31 -> 10.18 us
#: per layer in the critical path.
#: Tried and removed: each layer's launch, after its partials, prefetching the next layer's K/V lines of its share
#: into L2 (evict-last, ~100 us ahead; ``FLARE_DECODE_KV_NEXT``, the backend handing each op the next layer's pools) --
#: Qwen3-8B batch 1 0.9988x side by side in one process with the null (``results/20261204T205600Z-sm90-run163``; paired
#: blocks 10/10 faster against A and A2, within noise by the min-max rule), the attention's critical path unchanged
#: (9.26 -> 9.28 us per layer): the block's 3.7 us from page ids to K and V (run 162's stamps,
#: ``results/20261204T204300Z-sm90-run162``) is not the lines' distance.  Those stamps also show the one-row launch's
#: 136 programs on 74 SMs (3 fit on one by registers) -- the open lead.


#: Where the fused decode kernel's writer (the program that writes the row's new key and value) loads the new value
#: and the key norm's weights (``FLARE_DECODE_V_FIRST=N``; read at each launch, for side-by-side runs): 0 as
#: ``rope_write`` does -- the value after the key's stores, the weights after the key's statistics; 1 both with the
#: key, before its statistics; 2 the key, the value and the weights with the query rows, right after the PDL wait
#: (every program issues them, masked off but in the writer).  Offline sm90 SASS of Qwen3-8B's one-row launch: at 0
#: the value's loads (``LDG.E.U16``) come after the key's stores (``STG``; the compiler does not move a load above a
#: store that may alias it) and the weights' after the statistics' CTA barriers -- three L2 round trips in series in
#: the writer's chain, already the launch's longest (run 123's probe: 3.2 us at the writer against 0.16 elsewhere),
#: before its barrier and its key block; at 1 one; at 2 none after the query rows'.  116 registers at 0, 1 and 2.
#: The same values: the same bits -- since the rotation's sums are ``add.rn`` of their own
#: (``rope_write._sum_rounded``); before, LLVM contracted one rotary product into each sum as a bf16 fma, at 0
#: ``h1 * sin2``, at 1 and 2 ``h2 * cos2`` (offline sm90 PTX; about 11% of a key's elements differ between those two
#: forms).  Measured: Qwen3-8B side by side in one process on an H100, batch 1, against the same A
#: (``results/20261205T182926Z-sm90-run183``), beside the new GEMV configs and :data:`linear.GEMV_X_AHEAD`: 2 0.9877x
#: (B faster by the min-max rule too), 1 with :data:`DECODE_PAGES_FIRST` 0.9893x, neither 0.9898x (run 182); with
#: both 0.9892x (run 184); batch 4 1.0002-1.0004x.  Beside the earlier configs 1 with the page ids first 0.9999x (run
#: 179).  The first GPU run of ``test_fused_decode_kernel_on_this_gpu`` with 2 as the default (run 185,
#: ``results/20261205T184037Z-sm90-run185``) failed all four cases (the stage was cut before pytest's report; the
#: script now interrupts pytest so the report survives) -- the contraction above explains it: the test's loop compares
#: the pools of 0, 1 and 2 bit for bit, which differed at any default (and every case has the key norm and a writer).
#: 2 again with the sums apart (offline sm90 PTX of the one-row launch: the same float instructions at 0, 1 and 2, no
#: bf16 fma): that test and ``test_rope_kernels_on_this_gpu_without_norms_rotate_as_transformers_bitwise`` pass on an
#: H100 (``results/20261205T224202Z-sm90-run186``), the GPU matrix too (run 188); side by side there 0 is 1.0018x
#: slower at batch 1 (paired blocks 0/10 faster against A and A2), batch 4 1.0000x (run 187).  On an H200, 0 within
#: noise: 1.0002x at batch 1, 0.9989x at batch 4 (``results/20261206T100400Z-sm90-run194``).
DECODE_V_FIRST = 2


def decode_v_first() -> int:
    """:data:`DECODE_V_FIRST` (``FLARE_DECODE_V_FIRST``, read at each launch; 0, 1 or 2)."""
    level = whole("FLARE_DECODE_V_FIRST", DECODE_V_FIRST, low=0)
    if level > 2:
        raise ValueError(f"FLARE_DECODE_V_FIRST={level}: expected 0 (rope_write's order), 1 (the value and weights "
                         "with the key) or 2 (with the query rows)")
    return level


#: Whether the fused decode kernel loads its first key block's page ids right after its PDL wait, with the query rows
#: (``FLARE_DECODE_PAGES_FIRST=1`` / ``0``; read at each launch, for side-by-side runs; the plain key loop only -- one
#: row -- and not with :data:`DECODE_NEW_KEY_APART`).  Offline sm90 SASS of Qwen3-8B's one-row launch: the block's
#: page-id loads (``LDG.E``) come after the query rows' norm, rotation and layout change (and the writer's store), so
#: every program's chain holds three L2 round trips in series -- query rows, page ids, K and V -- where the page ids
#: need only the block table.  Tried and removed before: keeping the ids the pre-wait prefetch reads
#: (``FLARE_DECODE_PRE_PAGES``, 162 registers then).  The same values: the same bits.  Measured off: Qwen3-8B batch 1
#: side by side on an H100, with :data:`DECODE_V_FIRST` 2 0.9892x against 0.9877x without
#: (``results/20261205T183053Z-sm90-run184`` and run 183, the same A); beside the earlier configs 0.9999x (run 179).
#: On an H200 (``results/20261206T100400Z-sm90-run194``, the H200's GEMV configs): on 0.9971x at batch 1, paired blocks
#: 10/10 faster against A and the null A2 but 0.9994x against A2 and within noise by the min-max rule -- not enough to
#: turn it on.
DECODE_PAGES_FIRST = False


def decode_pages_first(pipelined: bool, apart: bool) -> bool:
    """:data:`DECODE_PAGES_FIRST` (``FLARE_DECODE_PAGES_FIRST``, read at each launch) for a launch whose key loop is
    ``pipelined`` or not and whose new key is ``apart`` or not: never for the pipelined loop or the key apart."""
    return not pipelined and not apart and switch("FLARE_DECODE_PAGES_FIRST", DECODE_PAGES_FIRST)


#: The largest batch whose fused decode kernel prefetches (``FLARE_DECODE_KV_PREFETCH_ROWS=N`` sets it).  1 since run
#: 13, when batch 4's qkv ran on cuBLAS (no early launch).  Since the tensor-core GEMV became the default (run 28) the
#: batch-4 qkv is a PDL kernel too, so the attention after it launches early there as well -- but the prefetch still
#: loses there: Qwen3-8B side by side in one process with the null (``results/20261201T125309Z-sm90-run32``, 4 rows
#: prefetching): batch 4 1.0211x slower (decode_topk 1.0223x; A rebuilt after B: 1.0020x), batch 1 within noise.
#: Again with the evict-last priority, the split P V, 17 splits and the gated gate/up
#: (``results/20261204T145000Z-sm90-run145``): batch 4 1.0257x slower (paired blocks 0/10; 120.06 -> 123.39 us per
#: layer).
DECODE_KV_PREFETCH_ROWS = 1


#: The smallest stream the K/V prefetch may overlap: the bytes of the kernel before the attention (the QKV
#: projection's weight, ``overlap_bytes``) must reach this, else the prefetch competes with a short projection on the
#: critical path (``FLARE_DECODE_KV_PREFETCH_MIN_MB=N`` sets it; 0: any).  Measured on the H200, 1024-token context,
#: batch 1: Qwen3-0.6B (an 8 MiB projection) without the prefetch 0.921x the step's time side by side in one process
#: (``results/20261201T184659Z-sm90-replayin-0.6B``, B faster by the min-max rule; the one-row layer graph 0.961x,
#: ``results/20261201T184100Z-sm90-run72``); Qwen3-8B (48 MiB) 1.014x slower without it (run 72's layer graph, and
#: run 53).  24 MiB lies between the two measured sizes.  With the wide one-row blocks (:data:`DECODE_WIDE`) the
#: prefetch at Qwen3-0.6B measured 0.9905x, within noise (``results/20261201T225800Z-sm90-run93``): unchanged then.
#: 0 (any stream) since run 125: with the evict-last priority (:data:`DECODE_KV_PREFETCH_LAST`) and the evict-first
#: preloads (:data:`GEMV_PRELOAD_EVICT_FIRST`) on, Qwen3-0.6B batch 1 with it 0.9906x side by side in one process
#: with the null (``results/20261202T100800Z-sm90-run125``; within noise by the min-max rule, paired blocks 10/10
#: faster against A and A2), batch 4 (no prefetch) within noise.  ``FLARE_DECODE_KV_PREFETCH_MIN_MB=24`` restores
#: the previous bound.
DECODE_KV_PREFETCH_MIN_BYTES = 0


#: Whether the decode attention's pre-wait K/V prefetch gives its lines the evict-last L2 priority
#: (``FLARE_DECODE_KV_PREFETCH_LAST=1`` / ``0``; read at each launch), so that the weights streaming between the
#: prefetch and the reads (the qkv projection's tail, o_proj's preload) evict other lines first.  On since run 121
#: (``results/20261202T094300Z-sm90-run121``, side by side in one process with the null, 1024-token context): Qwen3-8B
#: batch 1 0.9971x (paired blocks 10/10 faster against A and A2), with :data:`GEMV_PRELOAD_EVICT_FIRST` 0.9782x
#: against that one's 0.9803x alone; batch 4 (no prefetch there) within noise.
DECODE_KV_PREFETCH_LAST = True


#: Tried and removed: each program's first key block loaded into registers before its PDL wait (through L2), the
#: writer's stale new slot patched after its write with the values it stored (``FLARE_DECODE_KV_EARLY_ROWS``, b68dc17):
#: run 166's stamps had the last block's K/V at 3.62 us after the query rows in the layer.  Offline sm90 116 registers
#: as without; on the H200 its own bits (deterministic, within a few ulps of the launch without: the new key's norm
#: summed in another layout changed the new slot's bits), and side by side in one process with the null
#: (``results/20261205T145626Z-sm90-run173``) Qwen3-8B batch 1 **1.0290x slower** (paired blocks 0/10 faster against A
#: and A2).  Removed.


def decode_kv_prefetch_keys(batch: int, overlap_bytes: int | None = None) -> int:
    """Keys per program of the fused decode kernel's pre-wait K/V prefetch (0: none) for ``batch`` rows: up to
    :data:`DECODE_KV_PREFETCH_ROWS` rows, and only after a stream of at least
    :data:`DECODE_KV_PREFETCH_MIN_BYTES` (``overlap_bytes``: the bytes the kernel before it streams; None: unknown,
    the rows decide -- standalone launches).  ``FLARE_DECODE_KV_PREFETCH=0`` turns it off; all read at each launch,
    for side-by-side runs."""
    if (batch > switch_rows("FLARE_DECODE_KV_PREFETCH_ROWS", DECODE_KV_PREFETCH_ROWS)
            or not switch("FLARE_DECODE_KV_PREFETCH", True)):
        return 0
    least = mebibytes("FLARE_DECODE_KV_PREFETCH_MIN_MB", DECODE_KV_PREFETCH_MIN_BYTES)
    if overlap_bytes is not None and overlap_bytes < least:
        return 0
    return DECODE_KV_PREFETCH_KEYS


#: The fused decode kernel's split cap (``FLARE_DECODE_MAX_SPLITS`` overrides it).  It matters only for Qwen3-0.6B at
#: batch 1 (Qwen3-8B's cap is its group size's 32, batch 4 takes 16).  Side by side in the whole step
#: (1024-token context): run 23 (``results/20261201T102332Z-sm90-run23``) had 64 splits at 1.0215 ms against 1.0378
#: for 32, but 32 ran first there and every later variant was ~15 us faster; run 26
#: (``results/20261201T104724Z-sm90-run26``, 64 splits with the whole-K prologue preload against 32 without, order
#: swapped) 1.0270 against 1.0264 -- within noise.  In the step's critical path the attention takes 7.34 us per layer
#: at 64 (run 25) against 8.42 at 32 (run 22), another machine.  64 stays; the difference is not shown.
#: At Qwen3-8B's one row (17 splits, one 64-key block each) a cap of 9 (two blocks each, 72 programs) was 1.0113x
#: slower on an H100 side by side in one process (``results/20261205T162102Z-sm90-run176``; the attention 8.93 -> 11.49
#: us per layer, the reduce 2.66 -> 1.73), batch 4 1.0208x; and one attention program per SM
#: (``FLARE_DECODE_SMEM_KB=120``: 136 programs on 132 SMs, a second wave) 1.082x.
FUSED_DECODE_MAX_SPLITS = 64


def fused_decode_num_splits(batch: int, kv_heads: int, groups: int, max_blocks: int) -> int:
    """Splits per (row, KV head) of the fused decode kernel, from static shapes only: about 544 programs, at most
    :data:`FUSED_DECODE_MAX_SPLITS` splits and at most ``128 / GP`` (GP: the group size rounded up to a power of two
    -- the reduce kernel reads ``splits * GP`` partial rows per group), never more than the block-table width's key
    blocks (:data:`FUSED_DECODE_PROGRAMS`).  Fit to the H200 side by side (1024-token contexts, per layer in a
    36-layer graph):

    - ``results/20261201T031427Z-sm90-run9`` (before the pre-wait K/V prefetch): Qwen3-8B (G=4) B=1: 32 splits
      10.3 us (64: 11.6), B=4: 16 splits 17.1 us (8: 20.5, 32: 21.3); Qwen3-0.6B (G=2) B=1: 64 splits 9.3 us (32:
      10.3), B=4: 16 splits 16.8 us -- the three-launch path took 13.5, 22.5, 11.3 and 20.4 us;
    - ``results/20261201T065805Z-sm90-run20`` (with it): Qwen3-0.6B B=1: 32 splits 9.14 us, 64 splits 9.94;
      Qwen3-8B B=1 32 splits 9.08, B=4 16 splits 18.40 (32: 18.84)."""
    gp = triton.next_power_of_2(max(1, groups))
    cap = max(1, int(number("FLARE_DECODE_MAX_SPLITS", FUSED_DECODE_MAX_SPLITS)))  # side-by-side runs
    programs = whole("FLARE_DECODE_PROGRAMS", FUSED_DECODE_PROGRAMS, low=1)
    return max(1, min(max_blocks, cap, max(1, 128 // gp), triton.cdiv(programs, max(1, batch * kv_heads))))


#: Programs the fused decode kernel's split count aims for (``FLARE_DECODE_PROGRAMS=N``, side-by-side runs): 512,
#: one wave on the H200 at its register count -- 95 to 104 registers per thread at 4 warps (offline sm90 ptxas,
#: ``scripts/sm90_kernel_check.py``) hold 4 to 5 programs per SM, 528 to 660 on 132 SMs; 1024 programs ran in two
#: waves (run 9: 32 splits at batch 4 21.3 us per layer against 17.1 for 16).  A register cap that fits more programs
#: lost (Qwen3-8B side by side in one process, ``results/20261201T142844Z-sm90-run38``): 64 registers and 1024
#: programs 1.090x slower at batch 1, 1.056x at batch 4; 64 registers alone 1.092x / 1.025x (the spills); 80
#: registers and 768 programs 1.039x at batch 1, within noise at batch 4.  544 since run 142 (with
#: :data:`DECODE_PV_SPLIT`'s 84 registers, 5 programs per SM, one wave up to 660): at batch 4 and a 1024-token context
#: 65 pages over 17 splits make a 4-page chain instead of 16 splits' 5 -- Qwen3-8B side by side in one process with the
#: null (``results/20261204T134100Z-sm90-run142``): batch 4 0.9939x (paired blocks 10/10 faster against A and A2, within
#: noise by the min-max rule; the attention 12.61 -> 11.36 us per layer in the critical path, the layer 121.63 ->
#: 120.19), 640 programs (20 splits) alike (0.9940x); batch 1 unchanged (its group cap, 1.0011x).
FUSED_DECODE_PROGRAMS = 544


#: Warps per program of the fused decode kernel's one-row launches (except the wide one, Qwen3-0.6B's; every other
#: launch takes 4).  8 since run 167: Qwen3-8B side by side in one process with the null on the H200
#: (``results/20261205T015822Z-sm90-run167``, 1024-token context, on top of the plain one-row key loop): 8 warps
#: everywhere against 4 -- batch 1 0.9881x (paired blocks 10/10 faster against A and A2, within noise by the min-max
#: rule), batch 4 1.0609x slower (B slower by the min-max rule); in the replay of record (run 168) the attention took
#: 6.91 us per layer in the critical path against run 159's 9.12 (with the plain loop).  Why is not measured yet (no
#: clock stamps at 8 warps): offline sm90 ptxas gives the one-row launch 116 registers at 8 warps, still two programs
#: per SM, so the placement run 166's stamps showed (136 programs -- 8 KV heads x 17 splits -- two to an SM on 74 SMs
#: where the qkv projection's programs left first; the last key block's K/V 3.6 us there against 1.8 alone) is
#: probably unchanged; each program has twice the warps issuing its block's K/V loads.
DECODE_ONE_ROW_WARPS = 8


def fused_decode_launch_options(rows: int | None = None, wide: bool = False) -> dict:
    """Extra launch options of the fused decode kernel for a launch of ``rows`` rows (``wide``: the wide one-row
    launch) -- side-by-side runs, except the warps: ``num_warps`` :data:`DECODE_ONE_ROW_WARPS` for one row (not wide),
    else 4, ``FLARE_DECODE_WARPS=N`` for every launch; ``maxnreg`` from ``FLARE_DECODE_MAXNREG=N`` (a register cap of
    N per thread -- 64 holds 8 programs per SM, one wave of 1024 -- at the cost of a few spilled values);
    ``SMEM_PAD`` from ``FLARE_DECODE_SMEM_KB=N``: each program reserves at least N KiB of shared memory, which caps
    the programs one SM holds (:func:`pad_shared_memory`, :mod:`.launch`); ``TRIGGER`` from
    ``FLARE_DECODE_TRIGGER=N``: where the kernel lets the reduce (and through its early trigger the output projection)
    launch -- 0 after its wait, 1 once its query rows are ready, 2 after its key loop."""
    cap = whole("FLARE_DECODE_MAXNREG", 0, low=0)
    if cap and not 24 <= cap <= 255:
        raise ValueError(f"FLARE_DECODE_MAXNREG={cap}: expected 24..255 registers per thread (or 0: no cap)")
    warps = whole("FLARE_DECODE_WARPS", DECODE_ONE_ROW_WARPS if rows == 1 and not wide else 4, low=1)
    if warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"FLARE_DECODE_WARPS={warps}: expected 1, 2, 4, 8 or 16 warps per program")
    pad = whole("FLARE_DECODE_SMEM_KB", 0, low=0)
    if pad > 227:
        raise ValueError(f"FLARE_DECODE_SMEM_KB={pad}: expected at most 227 KiB per program (sm90)")
    trigger = whole("FLARE_DECODE_TRIGGER", 0, low=0)
    if trigger > 2:
        raise ValueError(f"FLARE_DECODE_TRIGGER={trigger}: expected 0 (after the wait), 1 (after the query rows) or "
                         "2 (after the key loop)")
    if _interpreting():
        return {"num_warps": warps}
    options = {"num_warps": warps, **({"maxnreg": cap} if cap else {})}
    if trigger:
        options["TRIGGER"] = trigger
    if pad:
        pad_shared_memory()
        options["SMEM_PAD"] = pad << 10
    return options
