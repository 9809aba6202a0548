"""A decode-time projection as one opaque op: ``flare::fused_linear`` = [RMSNorm ->] x @ W^T [-> SiLU gate]
[-> + residual].

What it fuses (each part optional, in this order):

- an RMSNorm prologue (``norm_weight [K]``, ``eps``): the canonical ``Qwen3RMSNorm`` of x;
- the projection by ``weight [N, K]`` (nn.Linear layout);
- or, instead of the prologue, a SiLU-gated input (``gated_input``): x is the packed ``[gate; up]`` output of the
  previous projection, ``[..., 2 * K]``, and the projection's input is ``silu(gate) * up`` (``gated_mlp_block``);
- a SiLU-gated epilogue (``gated``): ``weight`` is the packed ``[gate; up]`` of ``2 * I`` rows and the result
  is ``silu(gate) * up``, ``[..., I]`` (the canonical ``Qwen3MLP`` up to ``down_proj``);
- a residual epilogue (``residual [..., N_out]``): ``residual + y`` (the decoder layer's skip connection).

Rounding points (bf16 tensors, every product and sum in fp32, each arrow a rounding to bf16) -- exactly the
canonical modules' own, so the op differs from them only by the order of the fp32 sums:

    xn  = bf16(norm_weight * bf16(x * rsqrt(mean(x ** 2) + eps)))     (prologue; else xn = x)
    xn  = bf16(bf16(silu(gate)) * up)                                  (gated input)
    y   = bf16(sum_k xn[k] * w[n, k])                                  (gate and up each rounded when gated)
    y   = bf16(bf16(silu(g)) * u)                                      (gated)
    out = bf16(residual + y)                                           (residual)

- CPU: :func:`fused_linear_reference`, the canonical torch ops in that order (``rms_norm_reference``,
  ``F.linear`` -- gate and up as two projections, as ``Qwen3MLP`` runs them --, ``F.silu``, ``+``), so CPU
  numerics are the canonical module's bit for bit.
- CUDA: one Triton GEMV launch (``fused_linear_triton`` in ``kernels/linear.py``): programs over blocks of
  output columns, each streaming its weight rows once for all rows of x, with an fp32 accumulator summed once
  at the end.  Deterministic: its launch config is a pure function of the shapes (``gemv_config``; no runtime
  autotuning, no atomics, no split-K), so the fp32 summation order -- and the bits -- are the same for the
  same shapes in every process and every replay, eager or compiled (Inductor cannot see into the op).

When used: :func:`prefers_fused` is the one rule (measured on the H200, see its docstring); callers go through
:func:`linear_block`, which fuses when the rule says so and otherwise runs the separate canonical modules.  The
rule depends only on the row count and the weight's shape -- never on the device -- so the CPU (CI) takes the
fused path exactly where the GPU does (the CPU path being the canonical composition, CPU numerics stay the
canonical modules').  Any row count is accepted by the op itself (rows beyond 16 go to further row blocks of
the grid, re-reading the weight).
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn.functional as F

from ignition.components.custom_ops import opaque_op
from ignition.components.norms import rms_norm_reference
from ignition.components.switches import number, switch, whole

__all__ = ["carries_prenorm", "fused_linear", "fused_linear_publish", "fused_linear_reference", "gated_mlp_block",
           "head_block", "linear_block", "mlp_handoff", "mlp_publishes_prenorm", "mlp_takes_prenorm", "prefers_fused",
           "published_norm", "publishes_prenorm", "reorder_bound", "takes_prenorm"]

#: A gated weight above this many elements stays on cuBLAS at one row (Qwen3-8B gate_up: 1.33x slower fused);
#: ``FLARE_GATED_FUSED_MAX_ELEMENTS=N`` overrides it (side-by-side runs; read when a step is traced).  Again with the
#: gated launch's whole K preloaded like the packed one's (2 gate + 2 up rows per program, 2x1024 w4: 127 registers
#: offline, as the packed 4x1024), so that down takes the activated input plain: Qwen3-8B batch 1 side by side in one
#: process (``results/20261204T101700Z-sm90-run134``, ``...102500Z-sm90-run135``): 1.054x slower with down 8x1024
#: (preloading 4 tiles: 255 registers), 1.021x with down 8x512 -- the gated gate/up 45.82 -> 49.12 us per layer in the
#: critical path, the plain down 27.94 -> 27.01 -- 1.072x with down 4x1024.  Since run 169: above Qwen3-8B's packed
#: weight (the gated 2x1024 gate/up into a plain down 8x1024 preloading nothing: 127 registers each, 4 per SM offline;
#: ``kernels.linear.GEMV_MEASURED``) -- side by side in one process on an H100 (the H200 did not start), the step with
#: the old 1 << 26 1.0077x slower at batch 1 (10/10 paired blocks), batch 4 within noise; ``--check-compiled`` PASS
#: (``results/20261205T123640Z-sm90-run169``).  On the H200 (``results/20261205T144329Z-sm90-run171``, side by side
#: in one process with the null; that call's attention the unfused path in A and B alike): the old 1 << 26 1.0166x
#: slower at batch 1 (0/10 paired blocks faster), batch 4 within noise; the replay of record since
#: (``results/20261205T145626Z-sm90-run173``) has the down at 27.07 us per layer against run 168's 28.13.
GATED_FUSED_MAX_ELEMENTS = 1 << 27
#: Such a gated weight at one row: its packed [gate; up] product as one ungated ``flare::fused_linear`` launch with
#: the norm prologue (no norm kernel, a PDL launch) instead of the norm kernel and cuBLAS; ``down`` takes the packed
#: output either way.  ``FLARE_PACKED_GATE_UP=0/1`` overrides it (side-by-side runs; read when a step is traced).
#: With its old launch config (16x256 w4) slower in the captured step on the H200
#: (``results/20261201T044844Z-sm90-run14``, Qwen3-8B batch 1: 4.907 ms against 4.774; the packed launch took 54-57
#: us per layer where the norm kernel and cuBLAS took 52, and down after it was no faster) although alone it nearly
#: matched cuBLAS (50.11 against 49.22 us, run 13's sweep); again with the early output/MLP launches, side by side
#: in one process: 1.037x slower at batch 1, batch 4 within noise
#: (``results/20261201T190500Z-sm90-gpu-replay-8B``, run 75).  **On** since its launch config preloads its whole K
#: before the wait (4x1024 w4, ``kernels.linear.GEMV_MEASURED``): 0.9798x, faster by the min-max rule (4.4352 against
#: 4.5265 ms at batch 1, batch 4 unchanged; ``results/20261202T035300Z-sm90-run107``); with it on, turning it off is
#: 1.0214x slower (run 108, ``results/20261202T043500Z-sm90-run108``: the packed launch 46.75 us per layer, 4.31 TB/s,
#: where cuBLAS took 48.48 behind a 1.44 us norm kernel), ``--check-compiled`` bytewise at batch 1 and 4 and the GPU
#: GEMV test at this shape passing there.
PACKED_GATE_UP_FUSED = True
#: The step's vocabulary projection of one row behind the final norm (:func:`head_block`) as one
#: ``flare::fused_linear`` launch with the norm prologue, instead of the norm kernel and cuBLAS.  In Qwen3-8B's
#: captured step at batch 1 (run 108's trace, ``results/20261202T043500Z-sm90-run108``) 11.5 us pass between the
#: last down's end and the cuBLAS kernel's start: an Inductor gather, the norm kernel (2.2 us) and a memset node
#: before cuBLAS, then a 6.3 us launch gap.  Side by side in one process (``results/20261202T054700Z-sm90-run113``,
#: Qwen3-8B, 1024-token context, its table config 4x1024 w4 with the whole K preloaded): batch 1 4.4165 ms against
#: 4.4361 (0.9956x, within noise by the min-max rule); in the two sides' replay traces the head -- last down's end to
#: the vocabulary projection's end -- 278.7 us against 305.9 (median of 20 replays), the step's span 4442.5 against
#: 4466.1; 8x1024 w8 288.7 us.  On.  With it on (run 114, ``results/20261202T055900Z-sm90-run114``): off is 1.0064x
#: (within noise by min-max; null 1.0018) -- slower by the paired blocks (``qualify.paired_blocks``: 0 of 10 blocks
#: faster against A and against the null A2, p 0.002 each) -- B's critical path head +27.7 us, span +36.8.
#: Qwen3-0.6B (run 115, ``results/20261202T060800Z-sm90-run115``): off 1.0003x, null 1.0004, no paired verdict --
#: neutral there.  ``FLARE_HEAD_FUSED=0/1`` overrides it (side-by-side runs; read when a step is traced).
HEAD_FUSED = True


def _out_features(weight: torch.Tensor, gated: bool) -> int:
    n = weight.shape[0]
    if gated and n % 2:
        raise ValueError(f"fused_linear: gated needs an even number of weight rows, got {n}")
    return n // 2 if gated else n


def fused_linear_reference(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor] = None,
                           eps: float = 0.0, residual: Optional[torch.Tensor] = None,
                           gated: bool = False, gated_input: bool = False) -> torch.Tensor:
    """The canonical composition (the op's CPU path): ``[..., K]`` (``[..., 2 * K]`` with ``gated_input``) -> a
    new contiguous ``[..., N_out]``."""
    if gated_input:  # the packed [gate; up] output of the previous projection: Qwen3MLP's act_fn(gate) * up
        k = _gated_input_features(x, weight, norm_weight)
        x = F.silu(x[..., :k]) * x[..., k:]
    h = rms_norm_reference(x, norm_weight, eps) if norm_weight is not None else x
    if gated:
        i = _out_features(weight, gated)
        y = F.silu(F.linear(h, weight[:i])) * F.linear(h, weight[i:])
    else:
        y = F.linear(h, weight)
    if residual is not None:
        y = residual + y
    return y.contiguous()


def _gated_input_features(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor]) -> int:
    k = weight.shape[-1]
    if x.shape[-1] != 2 * k or norm_weight is not None:
        raise ValueError(f"fused_linear: gated_input needs x with 2 * K = {2 * k} columns (got {x.shape[-1]}) "
                         f"and no norm_weight")
    return k


#: A launch's role in the one-row MLP handoff (``fused_linear``'s ``handoff``; the GEMV kernel's ``HANDOFF``; 0 none):
#: the gate/up launch publishing its activation tiles, the down launch taking them (:func:`mlp_handoff`).
HANDOFF_PRODUCER, HANDOFF_CONSUMER = 1, 2


def _fake(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor], eps: float,
          residual: Optional[torch.Tensor], gated: bool, gated_input: bool = False,
          early: bool = False, xw: Optional[torch.Tensor] = None,
          norm_stats: Optional[torch.Tensor] = None, handoff: int = 0) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], _out_features(weight, gated)))


@opaque_op("fused_linear", mutates_args=(), fake=_fake)
def fused_linear(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor], eps: float,
                 residual: Optional[torch.Tensor], gated: bool, gated_input: bool = False,
                 early: bool = False, xw: Optional[torch.Tensor] = None,
                 norm_stats: Optional[torch.Tensor] = None, handoff: int = 0) -> torch.Tensor:
    """``x [..., K]`` (``[..., 2 * K]`` with ``gated_input``), ``weight [N, K]`` -> a new contiguous
    ``[..., N_out]`` (see the module docstring).  ``early``: the next kernel reads nothing but weights before its PDL
    wait (``kernels.linear.fused_linear_triton``); the result is the same either way.  ``xw`` and ``norm_stats``
    (with ``norm_weight``): x's norm as :func:`fused_linear_publish` published it with x (:data:`GEMM_ROWS_PRENORM`)
    -- on CUDA the launch takes ``xw`` (x times the norm's weights) as its input and scales its sums by the rstd of
    ``norm_stats``: no norm launch; the CPU path computes the canonical norm of x as always.  ``handoff``
    (:func:`mlp_handoff`; the launch's role, :data:`HANDOFF_PRODUCER` / :data:`HANDOFF_CONSUMER`, 0 none): on
    CUDA the one-row MLP's gate/up launch (packed, or gated) and its down launch (the gated input, or plain) hand the
    activation over tile by tile (``kernels.linear.GEMV_HANDOFF``); the same result."""
    if x.is_cuda:
        from ignition.components.kernels.linear import fused_linear_triton

        n_out = _out_features(weight, gated)
        lead = x.shape[:-1]
        res2 = residual.reshape(-1, n_out) if residual is not None else None
        if norm_stats is not None:
            if norm_weight is None or xw is None or xw.shape != x.shape:
                raise ValueError("fused_linear: norm_stats need norm_weight and the published xw of x's shape")
            out = fused_linear_triton(xw.reshape(-1, xw.shape[-1]), weight, eps=eps, residual=res2, gated=gated,
                                      early=early, dot=True, norm_stats=norm_stats)
        else:
            out = fused_linear_triton(x.reshape(-1, x.shape[-1]), weight, norm_weight=norm_weight, eps=eps,
                                      residual=res2, gated=gated, gated_input=gated_input, early=early,
                                      handoff=handoff)
        return out.view(*lead, n_out)
    return fused_linear_reference(x, weight, norm_weight, eps, residual, gated, gated_input)


def _prenorm_parts(x: torch.Tensor, weight: torch.Tensor) -> int:
    """Column blocks whose statistics :func:`fused_linear_publish` returns per row: the tensor-core launch's programs
    on CUDA (its config is a pure function of the shapes), one whole row on the CPU."""
    if x.device.type != "cuda":
        return 1
    from ignition.components.kernels.linear import gemm_rows_parts

    return gemm_rows_parts(x.numel() // x.shape[-1], weight.shape[0], weight.shape[1])


def _fake_publish(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor], next_norm: torch.Tensor,
                  parts: int, early: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out = x.new_empty((*x.shape[:-1], weight.shape[0]))
    return out, torch.empty_like(out), x.new_empty((x.numel() // x.shape[-1], parts), dtype=torch.float32)


@opaque_op("fused_linear_publish", mutates_args=(), fake=_fake_publish)
def fused_linear_publish(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor],
                         next_norm: torch.Tensor, parts: int,
                         early: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A plain, ungated :func:`fused_linear` (``x [..., K]`` -> ``out [..., N]``, ``+ residual``) that also publishes
    the next RMSNorm of its output (weights ``next_norm [N]``; :data:`GEMM_ROWS_PRENORM`): ``(out, xw, stats)`` with
    ``xw = bf16(next_norm * out)`` and ``stats [rows, parts]``, the fp32 sums of ``out ** 2`` over ``parts`` column
    blocks -- the next launch takes them as ``fused_linear(..., xw=xw, norm_stats=stats)``.  CUDA: the tensor-core
    launch (2..16 rows), each program publishing its own output tile; CPU: the canonical composition.  ``parts``
    (:func:`_prenorm_parts`) is an argument, not derived inside, so that a compiled graph records it: the launch config
    may follow the environment (``FLARE_GEMV_CONFIG``), which neither Dynamo's guards nor the compile caches key on
    (run 158: a graph compiled for 128 blocks met a launch of 256); a launch of another count raises."""
    n = weight.shape[0]
    if x.is_cuda:
        from ignition.components.kernels.linear import fused_linear_triton

        res2 = residual.reshape(-1, n) if residual is not None else None
        out, xw, stats = fused_linear_triton(x.reshape(-1, x.shape[-1]), weight, residual=res2, early=early, dot=True,
                                             publish_norm=next_norm)
        if stats.shape[1] != parts:
            raise ValueError(f"fused_linear_publish: the launch wrote {stats.shape[1]} column blocks, the caller "
                             f"expected parts={parts} (a launch config changed after the graph was traced?)")
        return out.view(*x.shape[:-1], n), xw.view(*x.shape[:-1], n), stats
    out = fused_linear_reference(x, weight, None, 0.0, residual)
    return out, *_published_norm(out, next_norm, parts)


def _published_norm(h: torch.Tensor, norm_weight: torch.Tensor, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(xw, stats)`` of ``h [..., N]`` as a publishing launch writes them (:func:`fused_linear_publish`): ``bf16(
    norm_weight * h)`` and the fp32 sums of ``h ** 2`` over ``parts`` equal column blocks (the last one short)."""
    n = h.shape[-1]
    rows = h.numel() // n
    xw = (norm_weight.float() * h.float()).to(h.dtype)
    width = -(-n // parts)
    hf = F.pad(h.reshape(rows, n).float(), (0, parts * width - n))
    return xw, hf.view(rows, parts, width).pow(2).sum(dim=-1)


def _fake_published(h: torch.Tensor, norm_weight: torch.Tensor, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(h), h.new_empty((h.numel() // h.shape[-1], parts), dtype=torch.float32)


@opaque_op("published_norm", mutates_args=(), fake=_fake_published)
def published_norm_op(h: torch.Tensor, norm_weight: torch.Tensor, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(xw, stats)`` of ``h [..., N]`` over ``parts`` column blocks (:func:`_published_norm`); one launch on CUDA
    (the torch ops are seven)."""
    if h.is_cuda:
        from ignition.components.kernels.linear import published_norm_triton

        xw, stats = published_norm_triton(h.reshape(-1, h.shape[-1]).contiguous(), norm_weight, parts)
        return xw.view(h.shape), stats
    return _published_norm(h, norm_weight, parts)


def published_norm(h: torch.Tensor, norm, projection) -> tuple[torch.Tensor, torch.Tensor]:
    """``(xw, stats)`` of ``h`` for ``norm`` as a publishing launch through ``projection`` (N output columns) would
    write them with h -- for a first consumer whose input no launch wrote (the embeddings)."""
    return published_norm_op(h, norm.weight, _prenorm_parts(h, projection.plain_weight()))


_ENABLED = [True]


def set_fused_projections(enabled: bool) -> None:
    """Process-wide switch for side-by-side measurements (``qualify.gpu_replay --no-fused-projections``):
    disabled, :func:`prefers_fused` is False everywhere and every projection runs as separate modules.  Must be
    set before a model's steps are traced or captured (a captured graph keeps the kernels it was built with)."""
    _ENABLED[0] = bool(enabled)


#: Rows the tensor-core variant of the kernel takes (``FLARE_GEMV_DOT``; ``kernels.gemm_rows._fused_gemm_rows_kernel``).
DOT_ROWS = range(2, 17)


#: Whether an ungated projection of 2..16 rows behind an RMSNorm takes the tensor-core variant with the norm in its
#: prologue (one launch) instead of the norm kernel and then the plain-input variant or cuBLAS
#: (``FLARE_GEMM_ROWS_NORM=1`` / ``0``; read at trace and at launch time).  Off: in this form Qwen3-8B batch 4 was
#: 1.0648x slower side by side in one process with the null (``results/20261202T094300Z-sm90-run121``; paired blocks
#: 0/10 faster), batch 1 (no such launch) within noise.  Run 23's prologue was slow (below) because two of its loads
#: were synchronous -- the row statistics' chunk loop waited out one L2 round trip per chunk, and the norm weights were
#: one synchronous load per main-loop chunk (offline sm90 TTGIR); both are now asynchronous (``_gemv_rstd``'s
#: ``STAGES``, the weights as a row-broadcast tile: no synchronous load left, 96 registers at Qwen3-8B's qkv, no
#: spills).  At batch 4 it would remove the layer's qkv norm kernel (1.70 us per layer in Qwen3-8B's critical path, run
#: 114) and, where the packed gate/up feeds down's gated input (Qwen3-0.6B), the gate/up's.
GEMM_ROWS_NORM = False
#: Tried and removed (commit 590bec8, reverted): the row statistics published by the launch that wrote x -- o_proj +
#: residual (and down + residual, carried to the next layer's qkv; the first layer's from the embeddings) summing its
#: output tile's squares per row in its epilogue -- so that the next tensor-core launch takes the norm into its
#: prologue without a statistics pass: no norm kernel at all.  Side by side in one process with the null on the H200
#: (``results/20261204T161200Z-sm90-run149``, Qwen3-8B, 1024-token context): batch 4 **1.158x slower** within the
#: layer, 1.263x carried (paired blocks 0/10) -- the gated gate/up with the norm prologue took 68.93 us per layer in
#: the critical path against the norm kernel's 1.66 + 49.31 (3 stages to stay in one wave; the normed input tile is
#: formed in registers each K step), o_proj with the statistics epilogue 13.12 against 10.46; batch 1 (no such launch)
#: within noise.


#: Whether a projection of 2..16 rows with the SiLU-gated input (the packed ``[gate; up]`` output of the previous
#: projection -- Qwen3-8B's down at batch 4 behind cuBLAS's gate/up) takes the tensor-core variant with the gate in its
#: prologue (one launch) instead of the activation kernel and then the plain-input variant
#: (``FLARE_GEMM_ROWS_GATED_IN=1`` / ``0``; read at trace and at launch time).  Run 23's 165.7 us (against cuBLAS's
#: 28.7) had the prologue's loads synchronous; the offline sm90 TTGIR now has them as asynchronous copies like the
#: weight's (4 stages of gate, up and weight tiles: ``scripts/sm90_kernel_check.py``, "tensor-core 8B down").  The same
#: input values (``bf16(bf16(silu(gate)) * up)``) and the same config, so the same sums: at batch 4 it would remove
#: Qwen3-8B's activation kernel (1.66 us per layer in run 122's critical path), at Qwen3-0.6B (whose down at 4 rows is
#: the CUDA-core kernel with the gated input now) it moves that launch to the tensor cores.  Measured in the step
#: (Qwen3-8B side by side in one process, ``results/20261204T033000Z-sm90-run127``): batch 4 2.52x slower -- that launch
#: took 239 us per layer in the critical path against the plain one's 30 (cause not found: the offline TTGIR shows the
#: same pipelined structure as the plain launch's, 72 registers, 96 KiB shared); off.
GEMM_ROWS_GATED_IN = False


#: Whether a gated projection of 2..16 rows (the packed ``[gate; up]`` weight, ``silu(gate) * up`` in the epilogue)
#: behind an RMSNorm takes the norm apart and then the tensor-core variant with the gated output (one launch after the
#: norm) instead of cuBLAS's packed product and the activation kernel (``FLARE_GEMM_ROWS_GATED=1`` / ``0``; read at
#: trace and at launch time).  On since run 145 (``results/20261204T145000Z-sm90-run145``, side by side in one process
#: with the null, 1024-token context, ``--timeline``): Qwen3-8B batch 4 **0.9736x** (B faster by the min-max rule,
#: paired blocks 10/10 against A and A2; per layer 120.13 -> 116.38 us in the critical path: the activation kernel
#: gone, down 27.62 -> 25.31 us as it now launches early behind a PDL launch, gate/up 48.56 -> 48.64), batch 1 (no
#: such launch) within noise; Qwen3-0.6B batch 4 0.9976x (within noise by min-max; no such launch there either: its
#: narrow packed path).  The 32x256 w4 s4 config instead of the heuristic 32x128 w4 s4: 0.9955x -- less than the
#: heuristic's.  Only for gated weights of at least :data:`GEMM_ROWS_GATED_MIN_ELEMENTS`.
GEMM_ROWS_GATED = True

#: The smallest packed ``[gate; up]`` weight (elements) :data:`GEMM_ROWS_GATED` takes
#: (``FLARE_GEMM_ROWS_GATED_MIN_ELEMENTS`` overrides it; read at trace and at launch time): 2^26, between Qwen3-0.6B's
#: 6.3M and Qwen3-8B's 100.7M.  Qwen3-0.6B's speculative rounds of 8 and 16 rows took the gated launch in run 147's
#: replay of record (``results/20261204T151200Z-sm90-run147``, ``report-0.6B-vs-run143``) and were slower than run 143's
#: cuBLAS product and activation kernel by the min-max rule: batch 1 width 8 1.047x, width 2 1.010x, batch 4 width 2
#: 1.034x, width 4 1.031x (its 3072 gated columns make 96-192 programs on 132 SMs); Qwen3-8B's rounds were faster
#: (0.957-0.985x).
GEMM_ROWS_GATED_MIN_ELEMENTS = 1 << 26


#: Whether a projection of 2..16 rows behind an RMSNorm that runs as the norm kernel and then the tensor-core launch
#: (:func:`linear_block`'s second path: Qwen3-8B's qkv and gate/up at batch 4) takes its norm from the launch that
#: wrote its input instead (``FLARE_GEMM_ROWS_PRENORM=1`` / ``0``; read at trace time): that launch (o_proj +
#: residual within the layer; with :data:`GEMM_ROWS_PRENORM_CARRY` down + residual for the next layer) also stores
#: ``bf16(norm_weight * out)`` and its output tile's sums of squares per row (:func:`fused_linear_publish`), and the
#: projection takes the former as a plain input -- pipelined as any plain input, unlike a prologue's -- and scales its
#: fp32 sums by the rstd of the latter before rounding.  One launch less per norm.  Not the canonical rounding points:
#: ``bf16(rstd * sum(w * bf16(nw * x)))`` for ``sum(w * bf16(nw * bf16(x * rstd)))`` -- the same value up to one
#: rounding of each input element, within :func:`reorder_bound`'s norm term.  Side by side in one process with the
#: null on the H200 (Qwen3-8B, 1024-token context, ``--timeline``): within the layer
#: (``FLARE_GEMM_ROWS_PRENORM_CARRY=0``) batch 4 0.9943x (``results/20261204T173500Z-sm90-run153``; paired blocks 10/10
#: faster against A and A2, within noise by the min-max rule: the norm kernel 1.63 + gate/up 48.64 us per layer in the
#: critical path -> gate/up 47.23, o_proj 10.46 -> 12.86) and 0.9911x with :data:`kernels.linear.GEMM_ROWS_RES_FIRST`
#: against 0.9934x for that alone (``results/20261204T174600Z-sm90-run154``); batch 1 (no such launch) within noise.
#: On, within the layer.  Carried it was slower, 1.0324x / 1.0325x (with the residual first; runs 153, 154): the qkv
#: taking the carried norm took 18.8-19.9 us per layer against the norm kernel's 1.8 + 14.1 -- launched during down
#: (lead 24.8 us, no norm launch between).  Not CTA packing, the hypothesis then (its 96 programs of 80 KiB placed two
#: to an SM as down's free theirs): with 6 stages (120 KiB, one program per SM) the carried step was 1.0421x slower
#: against the defaults within the layer (``results/20261204T175500Z-sm90-run155``).  Cause not found.
GEMM_ROWS_PRENORM = True
#: With :data:`GEMM_ROWS_PRENORM`: the decoder layers' down projection (+ residual) publishes the next layer's input
#: norm too (the last layer's the final norm's, unused: every layer's graph the same), the model's body carrying it
#: from layer to layer; the first layer's from the embeddings (:func:`published_norm`).
#: ``FLARE_GEMM_ROWS_PRENORM_CARRY=1`` / ``0`` sets it (read at trace time).  Off: slower as measured above.
GEMM_ROWS_PRENORM_CARRY = False


def uses_dot_kernel(rows: int, *, gated: bool = False, prologue: bool = False, norm: bool = False,
                    elements: int | None = None) -> bool:
    """Whether a ``flare::fused_linear`` launch of ``rows`` rows runs the tensor-core variant (on by default;
    ``FLARE_GEMV_DOT=0`` turns it off): 2..16 rows, a plain input (``prologue``: a norm or the gated input; a norm
    -- ``norm`` -- only with :data:`GEMM_ROWS_NORM`, the gated input -- a prologue without ``norm`` -- only with
    :data:`GEMM_ROWS_GATED_IN`) and an ungated output (a gated one only with :data:`GEMM_ROWS_GATED`, for a packed
    weight of ``elements`` at least :data:`GEMM_ROWS_GATED_MIN_ELEMENTS`; every launch passes its weight's, None --
    routing checks without a weight -- skips the bound) -- the only launches where it beat cuBLAS in isolation on the
    H200 (``results/20261201T102332Z-sm90-run23``, Qwen3-8B, 4 and 8 rows: o_proj with the
    residual 12.1 us against cuBLAS 13.2 -- whose step adds a split-K reduce and the add, ~4.6 us -- and down 30.0
    against 28.6 + the same two; with a prologue its input loads are not pipelined: qkv 26.1 against 14.3, down with
    the gated input 165.7 against 28.7; gated gate/up 61.3 against 49.0). In the step, side by side in one process
    (``results/20261201T114716Z-sm90-run28``, 1024-token context): Qwen3-8B batch 4 5.2483 ms against 5.4477
    (0.963x; decode_topk 5.1543 against 5.3491); Qwen3-0.6B batch 4 within noise (1.0078x,
    ``results/20261201T114209Z-sm90-run27``); batch 1 never takes it. Read at trace and at launch time alike."""
    plain = (not prologue or (norm and switch("FLARE_GEMM_ROWS_NORM", GEMM_ROWS_NORM))
             or (not norm and switch("FLARE_GEMM_ROWS_GATED_IN", GEMM_ROWS_GATED_IN)))
    output = not gated or (switch("FLARE_GEMM_ROWS_GATED", GEMM_ROWS_GATED) and (
        elements is None or elements >= number("FLARE_GEMM_ROWS_GATED_MIN_ELEMENTS", GEMM_ROWS_GATED_MIN_ELEMENTS)))
    return rows in DOT_ROWS and output and plain and switch("FLARE_GEMV_DOT", True)


#: The smallest K whose one-row plain-input, ungated projection takes the tensor-core variant (the row padded to 16;
#: its weight tiles copied into shared memory by the software pipeliner, ``num_stages`` of them in flight per program
#: without holding registers) instead of the one-row GEMV (``FLARE_GEMV_DOT_ONE_ROW_MIN_K=N``; read at each launch,
#: for side-by-side runs; 0: never).  Why: the one-row GEMV streams a long K one tile per program at a time (its
#: fp32 accumulator holds the registers a second tile would need), and Qwen3-8B's down (K 12288) took 27.07 us per
#: layer in run 173's critical path at one row (3.72 TB/s, +3.44 us above its floor), while the tensor-core launch of
#: the same weight took 25.31 us at batch 4 (3.98 TB/s).  Measured slower, off: Qwen3-8B batch 1 side by side in one
#: process on an H100 (``results/20261205T161652Z-sm90-run175``; no null, it did not fit): 32x512 w4 s4 1.0246x,
#: 32x256 w4 s6 1.0302x, 32x512 w4 s3 1.0396x slower (paired blocks 0/10 faster); in the critical path down 37.71 ->
#: 39.84 us per layer, o_proj 8.42 -> 13.18, qkv 15.07 -> 16.77, gate/up 65.57 -> 62.35.  Not measured on an H200.
DOT_ONE_ROW_MIN_K = 0


def uses_dot_one_row(rows: int, k: int, *, gated: bool = False, prologue: bool = False) -> bool:
    """Whether a one-row ``flare::fused_linear`` launch through a weight of ``k`` columns runs the tensor-core
    variant: a plain input and an ungated output, K at least :data:`DOT_ONE_ROW_MIN_K`
    (``FLARE_GEMV_DOT_ONE_ROW_MIN_K``), unless ``FLARE_GEMV_DOT=0``."""
    least = whole("FLARE_GEMV_DOT_ONE_ROW_MIN_K", DOT_ONE_ROW_MIN_K)
    return (rows == 1 and 0 < least <= k and not gated and not prologue and switch("FLARE_GEMV_DOT", True))


def prefers_fused(rows: int, weight: torch.Tensor, gated: bool, *, prologue: bool = False,
                  norm: bool = False) -> bool:
    """Whether ``rows`` rows through ``weight`` run as one ``flare::fused_linear`` launch.

    From the H200 sweep ``results/20261130T203339Z-sm90-run1`` (``scripts/bench_gemv.py``; the fused kernel
    also saves the separate norm, activation and add launches, 2-4 us each, not counted there):

    - one row: fused (Qwen3-8B o_proj 0.76x cuBLAS, down 1.07x, qkv 1.03x; Qwen3-0.6B o_proj 0.25x, down 0.60x),
      except gated weights above :data:`GATED_FUSED_MAX_ELEMENTS` (8B gate_up 1.33x: cuBLAS streams it faster);
    - 2-4 rows: only narrow, ungated outputs (<= 1024 columns: 0.6B o_proj 0.47x, down 0.91x at 4 rows), where
      cuBLAS leaves most SMs idle; wider ones lose 1.6-3.6x (the kernel is CUDA-core bound from 4 rows on);
    - more rows (larger decode batches, prefill, speculative rounds): cuBLAS;
    - 2..16 rows (unless ``FLARE_GEMV_DOT=0``): also the plain-input (``prologue`` False: no norm, no gated input),
      ungated projections, through the tensor-core variant (:func:`uses_dot_kernel`: where it won in isolation);
      with :data:`GEMM_ROWS_NORM` those behind a norm too (``norm``: the prologue is an RMSNorm), with
      :data:`GEMM_ROWS_GATED_IN` those with the gated input (``prologue`` without ``norm``).
    """
    if not _ENABLED[0]:
        return False
    n_out = weight.shape[0] // (2 if gated else 1)
    if rows == 1:
        limit = number("FLARE_GATED_FUSED_MAX_ELEMENTS", GATED_FUSED_MAX_ELEMENTS)
        return not (gated and weight.numel() > limit)
    if rows <= 4 and not gated and n_out <= 1024:
        return True
    return uses_dot_kernel(rows, gated=gated, prologue=prologue, norm=norm, elements=weight.numel())


def _norm_apart_dot(rows: int, weight: Optional[torch.Tensor], gated: bool) -> bool:
    """Whether :func:`linear_block` runs a projection behind a norm as the norm kernel and then the tensor-core
    launch (its second path)."""
    return (weight is not None and not prefers_fused(rows, weight, gated, prologue=True, norm=True)
            and uses_dot_kernel(rows, gated=gated, elements=weight.numel()))


def takes_prenorm(rows: int, projection, *, gated: bool = False, act_name: str | None = None) -> bool:
    """Whether :func:`linear_block` on ``rows`` rows through ``projection`` behind a norm takes a published norm
    (:data:`GEMM_ROWS_PRENORM`; ``prenorm``) -- so that the launch writing its input publishes one only where it is
    read."""
    return (switch("FLARE_GEMM_ROWS_PRENORM", GEMM_ROWS_PRENORM) and _ENABLED[0]
            and (not gated or act_name == "silu") and _norm_apart_dot(rows, projection.plain_weight(), gated))


def publishes_prenorm(rows: int, projection) -> bool:
    """Whether :func:`linear_block` (no norm, ungated) asked to ``publish_norm`` publishes it: a fused tensor-core
    launch (:func:`fused_linear_publish`)."""
    weight = projection.plain_weight()
    return (weight is not None and prefers_fused(rows, weight, False)
            and uses_dot_kernel(rows, elements=weight.numel()))


def carries_prenorm() -> bool:
    """Whether published norms cross decoder layers (:data:`GEMM_ROWS_PRENORM_CARRY`, with
    :data:`GEMM_ROWS_PRENORM`)."""
    return (switch("FLARE_GEMM_ROWS_PRENORM", GEMM_ROWS_PRENORM)
            and switch("FLARE_GEMM_ROWS_PRENORM_CARRY", GEMM_ROWS_PRENORM_CARRY))


def linear_block(x: torch.Tensor, projection, *, norm=None, residual: Optional[torch.Tensor] = None,
                 gated: bool = False, act_fn=None, act_name: str | None = None, early: bool = False,
                 prenorm: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                 publish_norm: Optional[torch.Tensor] = None):
    """``[norm ->] projection [-> act_fn(gate) * up] [-> residual +]`` on ``x [..., K]``.

    ``projection``: a ``Projection`` or ``PackedProjection`` (``plain_weight()``); ``norm``: an
    ``ignition.components.norms.RMSNorm``; ``gated``: ``projection`` is the packed ``(gate, up)`` pair and
    ``act_fn`` the canonical activation, ``act_name`` its config name (``hidden_act``: fusable when ``"silu"``).
    One ``flare::fused_linear`` launch when the projection is plain bf16 and :func:`prefers_fused` says so; an
    ungated projection of 2..16 rows behind a norm (unless ``FLARE_GEMV_DOT=0``) takes the norm apart and the
    projection (+ residual) as one tensor-core launch (that kernel takes plain inputs only: :func:`uses_dot_kernel`)
    -- with :data:`GEMM_ROWS_GATED` a gated one too (a packed weight of at least
    :data:`GEMM_ROWS_GATED_MIN_ELEMENTS`), its SiLU gate in the epilogue --; the qkv projection of a decode batch then
    launches
    from a kernel with programmatic dependent launch instead of cuBLAS, so the attention after it can start early;
    otherwise the separate modules, in the canonical order.  Returns what the projection returns: its output
    tensor, or for an ungated packed projection the tuple of its parts (column views of the packed output, on every
    path).  ``early``: what comes next reads nothing but weights before its wait (not the fused decode attention):
    a fused launch may let it start before its own wait (``flare::fused_linear``).
    ``publish_norm`` (no norm, ungated; the next norm's weights): return ``(y, published)``, ``published`` the
    ``(xw, stats)`` of :func:`fused_linear_publish` where the launch is a fused tensor-core one
    (:func:`publishes_prenorm`), else None.  ``prenorm``: that pair for ``x``, which the second path above then takes
    instead of the norm launch (:data:`GEMM_ROWS_PRENORM`; ignored on the other paths)."""
    weight = projection.plain_weight()
    rows = x.numel() // x.shape[-1]
    parts = getattr(projection, "part_sizes", None)
    if publish_norm is not None:
        if norm is not None or gated:
            raise ValueError("linear_block: publish_norm is for a plain, ungated projection")
        if publishes_prenorm(rows, projection):
            y, xw, stats = fused_linear_publish(x, weight, residual, publish_norm, _prenorm_parts(x, weight), early)
            return (y.split(parts, dim=-1) if parts is not None else y), (xw, stats)
        return linear_block(x, projection, residual=residual, early=early), None
    fusable_act = not gated or act_name == "silu"
    if weight is not None and fusable_act and prefers_fused(rows, weight, gated, prologue=norm is not None,
                                                            norm=norm is not None):
        y = fused_linear(x, weight, None if norm is None else norm.weight,
                         0.0 if norm is None else norm.variance_epsilon, residual, gated, False, early)
        return y.split(parts, dim=-1) if parts is not None and not gated else y
    if norm is not None and fusable_act and _norm_apart_dot(rows, weight, gated):
        if prenorm is not None:
            y = fused_linear(x, weight, norm.weight, norm.variance_epsilon, residual, gated, False, early, *prenorm)
        else:
            y = fused_linear(norm(x), weight, None, 0.0, residual, gated, False, early)
        return y.split(parts, dim=-1) if parts is not None and not gated else y
    h = x if norm is None else norm(x)
    y = projection(h)
    if gated:
        gate, up = y
        y = act_fn(gate) * up
    return y if residual is None else residual + y


def _gate_into_down(rows: int, gu_w, down_w, act_name: str | None, norm: bool) -> bool:
    """Whether :func:`gated_mlp_block` hands gate/up's packed output to down's gated-input launch (its first path)."""
    return (act_name == "silu" and gu_w is not None and down_w is not None
            and not prefers_fused(rows, gu_w, True, prologue=norm)
            and prefers_fused(rows, down_w, False, prologue=True))


def mlp_handoff(rows: int, gu_w: torch.Tensor, down_w: torch.Tensor, gated: bool = False) -> bool:
    """Whether :func:`gated_mlp_block`'s fused gate/up launch (packed, or ``gated``) and its down launch take the
    handoff (``kernels.linear.GEMV_HANDOFF``, ``FLARE_GEMV_HANDOFF``; read when a step is traced): one
    row on CUDA, where the two launch configs line up (``kernels.linear.gemv_handoff_fits``: elsewhere the two
    launches run as without the switch, PDL-ordered)."""
    if rows != 1 or not gu_w.is_cuda:
        return False
    from ignition.components.kernels.linear import GEMV_HANDOFF, gemv_handoff_fits

    if not switch("FLARE_GEMV_HANDOFF", GEMV_HANDOFF):
        return False
    hidden, inter = down_w.shape
    if gemv_handoff_fits(hidden, inter, gated):
        return True
    if switch("FLARE_GEMV_HANDOFF", False):  # asked for in this environment: say where it does not apply
        warnings.warn(f"FLARE_GEMV_HANDOFF: the one-row {'gated' if gated else 'packed'} MLP of hidden={hidden}, "
                      f"intermediate={inter} does not take the handoff (kernels.linear.gemv_handoff_fits: the "
                      f"launch configs do not line up, or down preloads tiles -- name its preload 0 in "
                      f"FLARE_GEMV_CONFIG); its launches run PDL-ordered", stacklevel=2)
    return False


def _gated_handoff(rows: int, gu_w, down_w, act_name: str | None, norm: bool) -> bool:
    """Whether :func:`gated_mlp_block` runs a gated gate/up launch (its SiLU product in the epilogue) and a plain
    down launch with the handoff between them (:func:`mlp_handoff` with ``gated``): both fused."""
    return (act_name == "silu" and gu_w is not None and down_w is not None
            and prefers_fused(rows, gu_w, True, prologue=norm, norm=norm) and prefers_fused(rows, down_w, False)
            and mlp_handoff(rows, gu_w, down_w, gated=True))


def mlp_takes_prenorm(rows: int, gate_up, down, act_name: str | None) -> bool:
    """Whether :func:`gated_mlp_block` behind a norm takes a published norm of its input (``prenorm``:
    :func:`takes_prenorm` for its gate/up)."""
    return (not _gate_into_down(rows, gate_up.plain_weight(), down.plain_weight(), act_name, True)
            and takes_prenorm(rows, gate_up, gated=True, act_name=act_name))


def mlp_publishes_prenorm(rows: int, gate_up, down, act_name: str | None) -> bool:
    """Whether :func:`gated_mlp_block` behind a norm asked to ``publish_norm`` publishes it (down's launch:
    :func:`publishes_prenorm`, not the gated-input one)."""
    return (not _gate_into_down(rows, gate_up.plain_weight(), down.plain_weight(), act_name, True)
            and publishes_prenorm(rows, down))


def _mlp_in(x: torch.Tensor, gu_w: torch.Tensor, norm, gated: bool, handoff: bool) -> torch.Tensor:
    """The MLP's fused gate/up launch behind ``norm`` (None: none): packed, or ``gated``; early (its successor is
    down's launch); the handoff's producer when ``handoff``."""
    return fused_linear(x, gu_w, None if norm is None else norm.weight, 0.0 if norm is None else norm.variance_epsilon,
                        None, gated, False, True, handoff=HANDOFF_PRODUCER if handoff else 0)


def _mlp_out(act: torch.Tensor, down_w: torch.Tensor, residual: Optional[torch.Tensor], gated_input: bool,
             early: bool, handoff: bool) -> torch.Tensor:
    """The MLP's fused down launch (+ residual) on gate/up's output (``gated_input``: the packed one); the handoff's
    consumer when ``handoff``."""
    return fused_linear(act, down_w, None, 0.0, residual, False, gated_input, early,
                        handoff=HANDOFF_CONSUMER if handoff else 0)


def gated_mlp_block(x: torch.Tensor, gate_up, down, *, norm=None, residual: Optional[torch.Tensor] = None,
                    act_fn=None, act_name: str | None = None, early: bool = False,
                    prenorm: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                    publish_norm: Optional[torch.Tensor] = None):
    """``[norm ->] gate_up -> act_fn(gate) * up -> down [-> residual +]`` (the canonical ``Qwen3MLP`` with the
    decoder layer's norm and skip connection) on ``x [..., K]``, by the measured rule of :func:`prefers_fused`:

    - gate/up fused (small gated weights): its launch applies the SiLU gate; ``down`` through :func:`linear_block`;
    - gate/up not fused with its gate (Qwen3-8B at one row) but ``down`` fused: gate/up's packed ``[gate; up]``
      output -- from cuBLAS, or from an ungated fused launch with the norm prologue (:data:`PACKED_GATE_UP_FUSED`)
      -- goes straight into down's launch, whose prologue computes ``silu(gate) * up`` (no activation kernel);
    - otherwise the separate modules (two :func:`linear_block` calls).

    ``early`` (:func:`linear_block`): what comes after the block reads nothing but weights before its wait; the
    launch inside the block is early in any case (its successor is the block's own next launch).
    ``prenorm``: the input's published norm (:func:`mlp_takes_prenorm`), for gate/up; ``publish_norm`` (the next
    norm's weights): return ``(out, published)`` (:func:`mlp_publishes_prenorm`; else ``published`` None)."""
    gu_w, down_w = gate_up.plain_weight(), down.plain_weight()
    rows = x.numel() // x.shape[-1]
    if _gate_into_down(rows, gu_w, down_w, act_name, norm is not None):
        packed_fused = switch("FLARE_PACKED_GATE_UP", PACKED_GATE_UP_FUSED)
        handoff = False
        if packed_fused and prefers_fused(rows, gu_w, False, prologue=norm is not None, norm=norm is not None):
            handoff = mlp_handoff(rows, gu_w, down_w)
            packed = _mlp_in(x, gu_w, norm, False, handoff)
        else:
            packed = F.linear(x if norm is None else norm(x), gu_w)  # gate_up's own product, left packed
        out = _mlp_out(packed, down_w, residual, True, early, handoff)
        return (out, None) if publish_norm is not None else out
    if _gated_handoff(rows, gu_w, down_w, act_name, norm is not None):
        out = _mlp_out(_mlp_in(x, gu_w, norm, True, True), down_w, residual, False, early, True)
        return (out, None) if publish_norm is not None else out
    act = linear_block(x, gate_up, norm=norm, gated=True, act_fn=act_fn, act_name=act_name, early=True,
                       prenorm=prenorm)
    return linear_block(act, down, residual=residual, early=early, publish_norm=publish_norm)


def head_block(x: torch.Tensor, projection, norm) -> torch.Tensor:
    """The step's head: ``projection(norm(x))`` on the rows kept for sampling, ``x [..., K]`` -> ``[..., V]`` in
    x's dtype.  One row (a batch-1 decode step or prefill chunk) with :data:`HEAD_FUSED` on: :func:`linear_block`
    (one fused launch with the norm prologue when :func:`prefers_fused` says so); otherwise the canonical modules.
    The same rounding points either way (the module docstring): only the order of the fp32 sums differs."""
    if x.numel() == x.shape[-1] and switch("FLARE_HEAD_FUSED", HEAD_FUSED):
        return linear_block(x, projection, norm=norm)
    return projection(norm(x))


#: Whether the step's one-row head writes its fp32 logits, zeroed on inactive rows, into the step's static logits from
#: its own launch (``flare::fused_linear_logits_``, :func:`head_logits_block`) instead of returning bf16 logits that a
#: traced ``.float().masked_fill(~active, 0)`` launch widens and copies there (``FLARE_HEAD_INTO=1`` / ``0``; read when
#: a step is traced, for side-by-side runs).  In run 194's Qwen3-8B batch-1 trace that launch took 1.6 us after the
#: head, 2.1 us of the critical path, and kept the sampler's first kernel from launching under PDL behind the head.
#: The same bits (the bf16 result widened exactly, the same zeros): its GPU test passes on an H100
#: (``results/20261206T142430Z-sm90-run197``).  Side by side in one process with the null on an H100
#: (``results/20261206T142950Z-sm90-run198``, Qwen3-8B, 1024-token context): off 1.0006x at batch 1 (paired blocks 0/10
#: faster against A, 3/10 against the null A2; within noise), 1.0015x at batch 4 (0/10 against A and A2: off slower).
#: Not measured on an H200.
HEAD_INTO = True


def _logits_fake(x, weight, norm_weight, eps, active, out) -> None:
    return None


@opaque_op("fused_linear_logits_", mutates_args=("out",), fake=_logits_fake)
def fused_linear_logits_(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor], eps: float,
                         active: torch.Tensor, out: torch.Tensor) -> None:
    """``out [M, N]`` float32 = ``fused_linear(x, weight, norm_weight, eps)`` widened, rows whose ``active [M]`` flag
    is off zero: the step's logits (``x [M, K]``, one row on the step's path).  CUDA: the one-row GEMV's launch stores
    them itself (``kernels.linear.fused_linear_triton``'s ``out`` / ``active``); elsewhere the reference, copied."""
    if x.is_cuda:
        from ignition.components.kernels.linear import fused_linear_triton

        fused_linear_triton(x, weight, norm_weight=norm_weight, eps=eps, out=out, active=active, dot=False)
        return
    if tuple(active.shape) != (x.shape[0],) or active.dtype != torch.bool:
        raise ValueError(f"fused_linear_logits_: active must be a [{x.shape[0]}] bool tensor, got "
                         f"{tuple(active.shape)} {active.dtype}")
    out.copy_(fused_linear_reference(x, weight, norm_weight, eps, None, False).float()
              .masked_fill(~active[:, None], 0.0))


def head_logits_block(x: torch.Tensor, projection, norm, active: torch.Tensor,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`head_block`'s logits widened to float32, zero on the rows whose ``active`` flag is off (``x [B, K]``,
    one row per batch row; ``active [B]``).  With ``out`` (the step's static ``[B, V]`` float32 logits), on CUDA, one
    row, where :func:`head_block` takes the one-row fused launch and :data:`HEAD_INTO` is on: that launch writes them
    into ``out`` (``flare::fused_linear_logits_``) and ``out`` is returned -- else a new tensor the caller stores."""
    weight = projection.plain_weight()
    k = x.shape[-1]
    if (out is not None and x.is_cuda and x.numel() == k and weight is not None and norm is not None
            and tuple(out.shape) == (1, weight.shape[0]) and out.dtype == torch.float32 and out.is_contiguous()
            and x.dtype in (torch.bfloat16, torch.float16) and switch("FLARE_HEAD_FUSED", HEAD_FUSED)
            and switch("FLARE_HEAD_INTO", HEAD_INTO)
            and prefers_fused(1, weight, False, prologue=True, norm=True)
            and not uses_dot_one_row(1, k, gated=False, prologue=True)):
        fused_linear_logits_(x.reshape(1, k), weight, norm.weight, norm.variance_epsilon, active.reshape(1), out)
        return out
    return head_block(x, projection, norm).float().masked_fill(~active[:, None], 0.0)


def reorder_bound(xn: torch.Tensor, weight: torch.Tensor, *, norm: bool, gated: bool) -> torch.Tensor:
    """``[M, N_out]`` absolute error bound of the kernel's pre-rounding result against the reference beyond whole
    bf16 ulps (tests and ``scripts/bench_gemv.py`` add their ulps of the result): a reordered fp32 sum differs by a
    few fp32 ulps of ``sum_k |xn_k w_k|`` (2^-20 of it, for results near zero); with the norm prologue a
    neighbouring bf16 ``xn`` (statistics summed in another order; the interpreter truncates) perturbs the sum by a
    random walk bounded by 6 sigma, ``2^-7 * 6 * sqrt(sum_k (xn_k w_k)^2) / sqrt(3)``; gated, the gate's and up's
    errors propagate through ``bf16(bf16(silu(bf16 g)) * bf16 u)``: each of the three roundings before the product
    may land one ulp (2^-7 relative, the interpreter truncating) from the reference's, and the gate's error moves
    silu by the local slope, ``|silu'(g)| + |silu''| * dg`` with ``|silu''| <= 0.5`` -- not the global 1.1 (a gate of
    -3 moves silu 25 times less)."""
    xa, wa = xn.float().abs(), weight.float().abs()
    tol = 2.0 ** -20 * (xa @ wa.T)
    if norm:
        tol = tol + 2.0 ** -7 * 6 * ((xa * xa) @ (wa * wa).T).sqrt() / 3 ** 0.5
    if gated:
        i = weight.shape[0] // 2
        g, u = F.linear(xn, weight[:i]).float(), F.linear(xn, weight[i:]).float()
        dg, du = tol[:, :i] + 2.0 ** -7 * g.abs(), tol[:, i:] + 2.0 ** -7 * u.abs()
        sig = torch.sigmoid(g)
        slope = (sig * (1 + g * (1 - sig))).abs() + 0.5 * dg
        act = F.silu(g).abs()
        d_act = slope * dg + 2.0 ** -7 * act
        tol = u.abs() * d_act + act * du + d_act * du
    return tol
