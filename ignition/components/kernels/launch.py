"""How the kernels launch: programmatic dependent launch (PDL) and what a kernel may do before its wait, the L2
prefetch helper, the shared-memory padding of a launch (``SMEM_PAD``), and the diagnostic timing probe (stamps per
program, off unless a probe buffer is passed)."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ignition.components.switches import mebibytes, rows as switch_rows, switch


# ------------------------------------------------------------------------------------------------------------
# Programmatic dependent launch (PDL, sm90+).  Launched with ``launch_pdl=True``, a kernel may start while the kernel
# before it on the stream is still finishing; the ``USE_PDL`` kernels (of every module of this package) then run
# ``gdc_wait()`` (wait for the previous kernel's completion and memory) before they read anything a kernel wrote, and
# let their own dependents launch early (``gdc_launch_dependents()``).  Captured into a CUDA graph as programmatic
# edges.  Every write happens after the wait, and a kernel completes only after its wait returned, so the stream order
# of every earlier kernel is kept.  What a kernel may do before its wait:
#
# - read weights (nothing in a step writes them): the decode GEMV prefetches its weight tiles into L2 there -- the
#   whole weight when it fits the L2 budget (``GEMV_PREFETCH_FULL_BYTES``), else its first tiles;
# - read what was written before the kernel two back on the stream, when that kernel ("the predecessor's
#   predecessor") is known complete: a kernel lets its dependents launch only once it passed its own wait, so when
#   a kernel starts, the one before its predecessor has completed -- EXCEPT after an ``EARLY`` kernel, which lets
#   its dependents launch before its wait.  Such reads go through L2 (``cache_modifier=".cg"``).  The fused decode
#   kernel reads the step's metadata (sequence lengths, block table) and prefetches its K/V blocks this way: its
#   predecessor is the qkv projection, never an ``EARLY`` kernel.
# - ``EARLY`` (at one row, :data:`PDL_EARLY_ROWS`, and the reduce at up to :data:`PDL_EARLY_LARGE_ROWS` behind a large
#   QKV stream; ``FLARE_PDL_EARLY=0`` turns it off): the decode attention's reduce kernel, so the output projection
#   after it launches while the attention runs and streams its weight into L2 during the attention's latency-bound
#   span.  The kernel after an ``EARLY`` one may read nothing but weights before its wait.  Measured on the H200
#   (Qwen3-8B batch 1, one machine, ``results/20261201T050909Z-sm90-run18``): EARLY without the whole-weight o_proj
#   prefetch 4.748 ms, the prefetch without EARLY 4.805, both 4.771 (run 17); Qwen3-0.6B batch 1 with both 1.1090
#   against 1.1217 (``results/20261201T045516Z-sm90-run15``).  At batch 4 it stalled Qwen3-0.6B's output projection
#   (``PDL_EARLY_ROWS``), not Qwen3-8B's (``PDL_EARLY_LARGE_ROWS``).  The one-row GEMVs their callers mark ``early``
#   (the output projection and the MLP's, :data:`GEMV_EARLY`) are ``EARLY`` too: their successors are GEMVs or
#   norms; the qkv projection, whose successor is the fused decode kernel, never is.
#
# ``FLARE_PDL=0`` turns PDL off (side-by-side measurements); off in the interpreter and before sm90.


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _sm90_or_newer(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_enabled(device: torch.device) -> bool:
    """Whether the kernels launch with programmatic dependent launch on ``device`` (``FLARE_PDL`` is read at
    each launch, so side-by-side runs may switch it; the device capability is queried once per device)."""
    if not switch("FLARE_PDL", True) or _interpreting() or device.type != "cuda":
        return False
    return _sm90_or_newer(device.index if device.index is not None else torch.cuda.current_device())


def _pdl(device: torch.device, early_rows: int | None = None, overlap_bytes: int | None = None) -> dict:
    """Launch options and the ``USE_PDL`` constexpr of one launch (nothing extra when PDL is off); ``early_rows``:
    the kernel takes an ``EARLY`` constexpr too, on when :func:`pdl_early_enabled` for that many rows (and
    ``overlap_bytes``)."""
    opts = {"USE_PDL": True, "launch_pdl": True} if pdl_enabled(device) else {"USE_PDL": False}
    if early_rows is not None:
        opts["EARLY"] = opts["USE_PDL"] and pdl_early_enabled(early_rows, overlap_bytes)
    return opts


#: Whether the step's small kernels outside the layers -- the sampler's (its front and min-p mask, the compacted cut's
#: five, the Gumbel draw) and the rotary cos/sin in front of the first layer -- launch with PDL like the layers' kernels
#: (``FLARE_SAMPLER_PDL=1`` / ``0`` and ``FLARE_ROTARY_PDL``; read at each launch, for side-by-side runs).  Each waits
#: before anything else (its first read) and lets the next kernel launch after that wait: a chain of short dependent
#: launches (Qwen3-8B's batch-1 step: ten sampler kernels of 1-7 us, 27 us of its critical path in run 194) where each
#: launch came only after the kernel before it completed; and the first layer's qkv projection, launched while the
#: rotary kernel runs, streams its weight into its registers there (its preload, 16.1 us in run 194's trace against
#: 12.1 in later layers, which launch during the down projection).  The same values: the same bits (the sampler's and
#: rotary GPU tests pass with them, runs 195-196).  Side by side in one process with the null on an H100
#: (``results/20261206T114900Z-sm90-run196``, Qwen3-8B, 1024-token context): the five step-glue switches of this
#: session off together (these two, ``FLARE_DRAW_INTO``, ``FLARE_CUT_SKIP_IN_KERNEL``, ``FLARE_FUSED_EMBED_ROTARY``)
#: 1.0010x slower at batch 1 and 1.0014x at batch 4, the step start's two alone 1.0009x / 1.0011x (paired blocks 0/10
#: faster against A and A2 each; within noise by the min-max rule).  Not yet on an H200.
SAMPLER_PDL = True
ROTARY_PDL = True


def pdl_if(device: torch.device, name: str, default: bool) -> dict:
    """:func:`_pdl`'s options for a launch whose PDL the switch ``name`` (default ``default``) may turn off."""
    return _pdl(device) if switch(name, default) else {"USE_PDL": False}


#: The largest batch whose decode reduce kernel is ``EARLY`` (``FLARE_PDL_EARLY_ROWS=N`` sets it).  Measured at one
#: row (see the rules above); at 4 rows it stalled the output projection after it: Qwen3-0.6B batch 4, side by side
#: in one process (``results/20261201T131618Z-sm90-run34``), 2.02 ms with EARLY against 0.7457x that without -- the
#: o_proj's critical-path share went from 5.4 to 24.0 us per layer once the qkv before it ran run 31's 32x128 w4 s5
#: config (``results/20261201T130837Z-sm90-run33``; either change alone undoes it).
#: Again at 4 rows with the tensor-core o_proj, side by side in one process with the null (``FLARE_PDL_EARLY_ROWS=4``):
#: Qwen3-8B batch 4 0.9926x (paired blocks 10/10 faster against A and A2; the reduce 2.59 -> 1.82 us per layer in the
#: critical path; ``results/20261204T162300Z-sm90-run150``), but Qwen3-0.6B batch 4 1.4114x slower (its o_proj 5.34 ->
#: 23.90 us; ``results/20261204T163100Z-sm90-run151``) -- not adopted, the cause of the loss not diagnosed.  On top of
#: the published norms (carried, ``fused_linear.GEMM_ROWS_PRENORM``) at Qwen3-8B batch 4 no gain: 1.0324x against
#: 1.0325x without it (``results/20261204T174600Z-sm90-run154``).
PDL_EARLY_ROWS = 1

#: The largest batch whose decode reduce kernel is ``EARLY`` behind a large stream: when the projection before the
#: attention (``overlap_bytes``, the QKV weight) reaches :data:`PDL_EARLY_LARGE_MIN_BYTES`
#: (``FLARE_PDL_EARLY_LARGE_ROWS=N``, ``FLARE_PDL_EARLY_LARGE_MIN_MB=N`` set them) -- Qwen3-8B's 48 MiB, not
#: Qwen3-0.6B's 8 MiB, whose o_proj stalled with it (above); 1: no more than :data:`PDL_EARLY_ROWS`.  4 since run 157:
#: Qwen3-8B batch 4 0.9949x side by side in one process with the null, on top of the published norms
#: (``results/20261204T185500Z-sm90-run157``; paired blocks 10/10 faster against A and A2; per layer 114.53 -> 113.92
#: us, the reduce 2.56 -> 1.86), batch 1 0.9989x.
PDL_EARLY_LARGE_ROWS = 4
PDL_EARLY_LARGE_MIN_BYTES = 24 << 20


def pdl_early_rows(overlap_bytes: int | None = None) -> int:
    """The largest batch whose ``EARLY`` kernels let their dependents launch before their wait:
    :data:`PDL_EARLY_ROWS`, or :data:`PDL_EARLY_LARGE_ROWS` when larger and ``overlap_bytes`` (the stream before the
    attention; None: unknown) reaches :data:`PDL_EARLY_LARGE_MIN_BYTES`.  Read at each launch."""
    rows = switch_rows("FLARE_PDL_EARLY_ROWS", PDL_EARLY_ROWS)
    if overlap_bytes is not None and overlap_bytes >= mebibytes("FLARE_PDL_EARLY_LARGE_MIN_MB",
                                                                PDL_EARLY_LARGE_MIN_BYTES):
        rows = max(rows, switch_rows("FLARE_PDL_EARLY_LARGE_ROWS", PDL_EARLY_LARGE_ROWS))
    return rows


def pdl_early_enabled(rows: int = 1, overlap_bytes: int | None = None) -> bool:
    """Whether the kernels that may let their dependents launch before their own wait do so for ``rows`` rows: up to
    :func:`pdl_early_rows` (``overlap_bytes``: the stream before the attention, for its reduce kernel) unless
    ``FLARE_PDL_EARLY=0``; read at each launch, for side-by-side runs."""
    return rows <= pdl_early_rows(overlap_bytes) and switch("FLARE_PDL_EARLY", True)


def device_key(device: torch.device) -> tuple[str, int]:
    """``(type, index)`` of ``device``, the current CUDA device's index where it names none (-1 off CUDA)."""
    if device.index is None:
        return device.type, torch.cuda.current_device() if device.type == "cuda" else -1
    return device.type, device.index


#: The fewest int32 slots of a device's count buffer (:func:`zeroed_counts`), so that a buffer rarely grows.
COUNT_SLOTS_MIN = 1024

#: Count buffers a larger one replaced: never freed, since a captured CUDA graph holds their addresses.
_RETIRED: list[torch.Tensor] = []


def zeroed_counts(store: dict, device: torch.device, slots: int) -> torch.Tensor:
    """int32 counts of at least ``slots`` slots on ``device``, all zero between launches: every kernel that counts in
    them puts them back to zero before it completes.  One buffer per device in ``store`` (at least
    :data:`COUNT_SLOTS_MIN` slots), reused by every launch -- the layers of a step run one after another, and so do the
    graphs.  A launch that needs more slots gets a larger buffer; the one it replaces is kept alive (a captured graph
    may launch on it).  Made while a CUDA graph is captured, the buffer comes from the graph's pool and its zeroing is
    a node of that graph (each replay zeroes it again: harmless, the counts are zero between launches)."""
    key = device_key(device)
    counts = store.get(key)
    if counts is None or counts.numel() < slots:
        if counts is not None:
            _RETIRED.append(counts)
        counts = torch.zeros(max(slots, COUNT_SLOTS_MIN), dtype=torch.int32, device=device)
        store[key] = counts
    return counts


@triton.jit
def _pdl_enter(USE_PDL: tl.constexpr, EARLY: tl.constexpr = False):
    """Wait for the previous kernel (its writes visible after this) and let the next kernel launch -- after the wait,
    or with ``EARLY`` before it (see the rules above)."""
    if USE_PDL:
        if EARLY:
            gdc_launch_dependents()
        gdc_wait()
        if not EARLY:
            gdc_launch_dependents()


@triton.jit
def _prefetch_l1(ptrs):
    """L1 prefetch of the lines at ``ptrs`` (no registers written, nothing returned to the program)."""
    tl.inline_asm_elementwise("prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _prefetch_l2(ptrs, LAST: tl.constexpr = False):
    """L2 prefetch of the lines at ``ptrs`` (no registers written, nothing returned to the program); ``LAST``: with
    the evict-last L2 priority."""
    asm: tl.constexpr = f"prefetch.global.L2{'::evict_last' if LAST else ''} [$1]; mov.u32 $0, 0;"
    tl.inline_asm_elementwise(asm, "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


def pad_shared_memory() -> None:
    """Let a kernel with a ``SMEM_PAD`` constexpr reserve that many bytes of dynamic shared memory per program
    (when more than its own use): the launch then holds fewer programs per SM and the block scheduler spreads them
    over more SMs -- a side-by-side knob (``FLARE_DECODE_SMEM_KB``).  Triton has no such option: this wraps
    ``CompiledKernel._init_handles`` once, so the size is set before the binary is loaded (which opts in to more than
    48 KiB) and before its first launch."""
    from triton.compiler.compiler import CompiledKernel

    if getattr(CompiledKernel, "_flare_shared_pad", False):
        return
    load = CompiledKernel._init_handles

    def _init_handles(self):
        fn = getattr(self.src, "fn", None)
        if self.module is None and fn is not None and "SMEM_PAD" in fn.arg_names:
            pad = int(self.src.constants.get((fn.arg_names.index("SMEM_PAD"),), 0) or 0)
            if pad > self.metadata.shared:
                self.metadata = self.metadata._replace(shared=pad)
                self.packed_metadata = (self.metadata.num_warps, self.metadata.num_ctas, pad)
        load(self)

    CompiledKernel._init_handles = _init_handles
    CompiledKernel._flare_shared_pad = True


#: Stamps per program of the decode kernels' timing probe (``scripts/probe_decode_attention.py``): the first half
#: %globaltimer (ns, one clock for every SM), the second %clock64 (this SM's cycles) at the same points.
PROBE_STAMPS = tl.constexpr(16)


@triton.jit
def _probe_stamp(P, program, point, dep, HAS_PROBE: tl.constexpr):
    """Diagnostics only (off: nothing compiled): both clocks at probe ``point`` of ``program``, read once ``dep`` (an
    int32 scalar the point's work produced) is computed -- the asm takes it as an input, so it cannot be hoisted above
    that work."""
    if HAS_PROBE:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep], dtype=tl.int64, is_pure=False,
                                      pack=1)
        c = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [dep], dtype=tl.int64, is_pure=False, pack=1)
        row = P + program.to(tl.int64) * (2 * PROBE_STAMPS)
        tl.store(row + point, t)
        tl.store(row + PROBE_STAMPS + point, c)


@triton.jit
def _probe_smid(P, program, HAS_PROBE: tl.constexpr):
    """Diagnostics only (off: nothing compiled): the SM ``program`` runs on, in the last %globaltimer slot of its
    probe row (which programs shared an SM)."""
    if HAS_PROBE:
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [program], dtype=tl.int32, is_pure=False,
                                       pack=1)
        tl.store(P + program.to(tl.int64) * (2 * PROBE_STAMPS) + PROBE_STAMPS - 1, sm.to(tl.int64))


def _probe_args(probe: tuple[torch.Tensor, ...] | None, which: int, programs: int) -> dict:
    """The ``PROBE``/``HAS_PROBE`` launch arguments for buffer ``which`` of ``probe`` (none when None); raises when
    the buffer cannot hold ``programs`` rows of stamps."""
    if probe is None:
        return {}
    buf = probe[which]
    if buf.dtype != torch.int64 or not buf.is_contiguous() or buf.numel() < programs * 2 * PROBE_STAMPS.value:
        raise ValueError(f"probe buffer {which}: need a contiguous int64 tensor of >= {programs} x "
                         f"{2 * PROBE_STAMPS.value} stamps, got {buf.dtype} {tuple(buf.shape)}")
    return {"PROBE": buf, "HAS_PROBE": True}
