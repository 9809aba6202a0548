#!/usr/bin/env python
"""Compile the decode kernels for sm90 on a machine without a GPU and report what ``ptxas`` says: registers, spills,
shared memory, and from them the programs one SM holds at once (``kernels.decode_plan.programs_per_sm``) -- and,
with ``--against REV``, whether each case's PTX equals the one git revision ``REV`` compiles for the case of that name
(its own script and kernels, in a temporary worktree; debug info aside, labels compared by their order of first
appearance), so a refactor can be shown to change no generated code.

    python scripts/sm90_kernel_check.py [--against REV] [--only TEXT] [--json OUT] [--ptx-dir DIR]

Fails (exit 1) where a case's PTX holds a bf16 fma (:data:`BF16_FMA`: a rounding point contracted away).
Needs Triton (its bundled ``ptxas``), no CUDA device.  The configurations are the measured ones: every
``GEMV_MEASURED`` entry with one row (with the default preload where it applies), the one-row launches of planned
side-by-side runs under their ``FLARE_GEMV_CONFIG`` items (``NAMED``), the fused decode kernel and the reduce kernel at
the Qwen3 shapes, the rope write and the RMSNorm kernel at Qwen3's heads and widths, the tensor-core GEMV's default
configs, the prefill attention, the rotary table, the top-k and sampler kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels even when started from an interpreter test's environment

P = "*bf16"
GEMV_SIG = {"X": P, "W": P, "NW": P, "R": P, "Y": P, "M": "i32", "N_OUT": "i32", "stride_x": "i32",
            "stride_w": "i32", "stride_r": "i32", "stride_y": "i32", "eps": "fp32"}
DECODE_SIG = {**{n: P for n in "Q K V QW KW COS SIN KP VP".split()}, "SLOTS": "*i64", "BT": "*i32", "SL": "*i64",
              "M_ws": "*fp32", "L_ws": "*fp32", "ACC_ws": "*fp32", "Out": P,
              **{n: "i32" for n in ("stride_qb stride_qh stride_kb stride_kh stride_vb stride_vh stride_cb stride_sb "
                                    "stride_kp stride_kt stride_kph stride_vp stride_vt stride_vph stride_bt "
                                    "max_pages").split()},
              "qk_scale_log2": "fp32", "eps": "fp32"}
PREFILL_SIG = {"Q": P, "K": P, "V": P, "BT": "*i32", "POS": "*i64", "SL": "*i64", "Out": P,
               **{n: "i32" for n in ("T stride_qb stride_qt stride_qh stride_kp stride_kt stride_kh stride_vp "
                                     "stride_vt stride_vh stride_bt stride_pb stride_ob stride_ot max_pages").split()},
               "qk_scale_log2": "fp32"}


#: The one-row projections as the Qwen3 recipe launches them: (name, N weight rows, K, norm, gated, residual,
#: gated input).
ONE_ROW = [
    ("8B qkv", 6144, 4096, True, False, False, False), ("8B o_proj", 4096, 4096, False, False, True, False),
    ("8B down (gated input)", 4096, 12288, False, False, True, True),
    ("8B gate_up packed", 24576, 4096, True, False, False, False),
    ("8B gate_up gated", 24576, 4096, True, True, False, False), ("8B down", 4096, 12288, False, False, True, False),
    ("0.6B qkv", 4096, 1024, True, False, False, False), ("0.6B o_proj", 1024, 2048, False, False, True, False),
    ("0.6B gate_up", 6144, 1024, True, True, False, False), ("0.6B down", 1024, 3072, False, False, True, False),
    ("8B head", 151936, 4096, True, False, False, False), ("0.6B head", 151936, 1024, True, False, False, False),
]
#: One-row launches under a ``FLARE_GEMV_CONFIG`` item of a planned side-by-side run: (name, ONE_ROW entry's name, the
#: item).  Qwen3-8B's MLP as gated gate/up (SiLU in its epilogue, whole K preloaded) and a plain-input down that
#: preloads nothing or 2 tiles -- run 134 paired the gated gate/up only with downs preloading 4 tiles.
#: The first two with the handoff too (``kernels.linear.GEMV_HANDOFF``'s gated form).
GATED_MLP = "1x24576x4096g=2/1024/4/2;1x4096x12288=8/1024/4/2/0"
NAMED = [
    ("8B qkv 4x1024", "8B qkv", "1x6144x4096=4/1024/4/2"),  # with the next: the H200's own (GEMV_MEASURED_BY_CARD)
    ("8B gate_up gated 2x1024", "8B gate_up gated", GATED_MLP),
    ("8B down 8x1024", "8B down", GATED_MLP),
    ("8B down 8x1024", "8B down", "1x4096x12288=8/1024/4/2/2"),
    ("8B down 4x1024", "8B down", "1x4096x12288=4/1024/4/2/0"),
    ("8B down 4x1024", "8B down", "1x4096x12288=4/1024/4/2/2"),
    # the plain down behind the gated gate/up (the default since run 169) in one wave of 512 programs, preloading:
    # 8x1024 one tile (126 registers, 4 per SM), 8x512 two (88, 5 per SM) or none (80, 6 per SM)
    ("8B down 8x1024", "8B down", "1x4096x12288=8/1024/4/2/1"),
    ("8B down 8x512", "8B down", "1x4096x12288=8/512/4/2/2"),
    ("8B down 8x512", "8B down", "1x4096x12288=8/512/4/2/0"),
]


@contextlib.contextmanager
def _named_config(item: str):
    """``FLARE_GEMV_CONFIG`` set to ``item`` inside the block, as it was after."""
    before = os.environ.get("FLARE_GEMV_CONFIG")
    os.environ["FLARE_GEMV_CONFIG"] = item
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FLARE_GEMV_CONFIG")
        else:
            os.environ["FLARE_GEMV_CONFIG"] = before


def _one_row_case(label: str, n: int, k: int, norm: bool, gated: bool, res: bool, gi: bool) -> tuple:
    """``(case name, constexprs, options)`` of a one-row GEMV launch as ``fused_linear_triton`` configures it (its
    config, preload, accumulator and eviction under the environment's ``FLARE_GEMV_CONFIG``)."""
    from ignition.components.kernels import linear

    cfg = linear.gemv_config(1, n, k, gated)
    bk = cfg["BK"]
    c = dict(K=k, MP=1, BN=cfg["BN"], BK=bk, HAS_NORM=norm, HAS_RES=res, GATED=gated, EVEN_K=k % bk == 0,
             GATED_IN=gi, USE_PDL=True, PREFETCH=2, PF_LINES=max(1, bk // 64),
             PRELOAD=linear.gemv_preload_tiles(1, k, bk, not (norm or gated or gi), cfg.get("preload")))
    c["FLAT"], c["STREAM_STAGES"] = linear.gemv_flat(1, k, bk, c["PRELOAD"])
    c.update(PRELOAD_EVICT=c["PRELOAD"] > 0 and linear.GEMV_PRELOAD_EVICT_FIRST,  # the launch's defaults
             X_AHEAD=linear.gemv_x_ahead(k, bk, c["PRELOAD"], not (norm or gi)))
    return f"gemv {label} preload {c['PRELOAD']}", c, dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def _with_handoff(c: dict, flags: dict) -> dict:
    """A one-row case's constexprs with the MLP handoff's ``flags``: its input then comes through the handoff, so no
    input tile one iteration ahead (``linear.gemv_x_ahead``: not with a handoff)."""
    return {**c, **flags, "X_AHEAD": False}


def cases():
    """``(name, kernel name, signature, constexprs, options)`` of the configurations to compile (:func:`kernel_of`)."""
    from ignition.components.kernels import (decode_plan, gumbel, linear, prefill_attention, rotary, sampler_front,
                                             sampling_cut)

    out = []
    for name, n, k, norm, gated, res, gi in ONE_ROW:
        label, c, options = _one_row_case(name, n, k, norm, gated, res, gi)
        out.append((label, "_fused_gemv_kernel", GEMV_SIG, c, options))
        if name in ("8B gate_up packed", "8B down (gated input)"):  # the MLP handoff's producer and consumer
            hidden, inter = (k, n // 2) if not gi else (n, k)
            flags = linear.gemv_handoff_constexprs(hidden, inter, consumer=gi)
            if gi:  # the consumer as the recipe launches it: compiled, early
                flags.update(FENCE=True, EARLY=True)
            out.append((f"gemv {name} preload {c['PRELOAD']} handoff", "_fused_gemv_kernel",
                        {**GEMV_SIG, "FLAGS": "*i32"}, _with_handoff(c, flags), options))
        if name in ("8B qkv", "8B gate_up gated"):  # the norm weights prefetched into L1 (linear.GEMV_NORM_L1)
            out.append((f"gemv {name} preload {c['PRELOAD']} norm l1", "_fused_gemv_kernel", GEMV_SIG,
                        {**c, "NORM_L1": True}, options))
        if c["PRELOAD"] * c["BK"] < c["K"] and not (norm or gi):  # streamed tiles of a plain input: the other
            # side of linear.GEMV_X_AHEAD (each input tile one iteration ahead, or in its own iteration)
            other = "x in its own iteration" if c["X_AHEAD"] else "x ahead"
            out.append((f"gemv {name} preload {c['PRELOAD']} {other}", "_fused_gemv_kernel", GEMV_SIG,
                        {**c, "X_AHEAD": not c["X_AHEAD"]}, options))
        if name.endswith("head"):  # the step's head into its float32 logits, inactive rows zero (HEAD_INTO)
            import triton.language as tl

            out.append((f"gemv {name} preload {c['PRELOAD']} into fp32 logits", "_fused_gemv_kernel",
                        {**GEMV_SIG, "Y": "*fp32", "ACTIVE": "*i1"},
                        {**c, "ROUND_TY": tl.bfloat16, "HAS_ACTIVE": True}, options))
        if name in ("8B qkv", "8B o_proj"):  # the timing probe (scripts/probe_decode_attention.py) compiles too
            out.append((f"gemv {name} preload {c['PRELOAD']} probed", "_fused_gemv_kernel",
                        {**GEMV_SIG, "PROBE": "*i64"}, {**c, "HAS_PROBE": True}, options))
    shapes = {entry[0]: entry[1:] for entry in ONE_ROW}
    for label, base, item in NAMED:
        with _named_config(item):
            name, c, options = _one_row_case(label, *shapes[base])
            gated_mlp = item == GATED_MLP  # the gated handoff's producer and consumer
            flags = {}
            if gated_mlp:
                flags = linear.gemv_handoff_constexprs(4096, 12288, consumer=not c["GATED"], gated=True)
        out.append((name, "_fused_gemv_kernel", GEMV_SIG, c, options))
        if gated_mlp:
            if not c["GATED"]:  # the consumer as the recipe launches it: compiled, early
                flags.update(FENCE=True, EARLY=True)
            out.append((f"{name} handoff", "_fused_gemv_kernel", {**GEMV_SIG, "FLAGS": "*i32"},
                        _with_handoff(c, flags), options))
    # Qwen3-8B's and Qwen3-0.6B's one-row launches: 0.6B's wide one (decode_plan.fused_decode_wide, 33 splits on 132
    # SMs) and its FLARE_DECODE_WIDE=0 one (8B: 64-key blocks, decode_plan.fused_decode_one_row_blocks -- 17 splits at
    # 1025 keys; every one prefetches its K/V), and Qwen3-8B's batch-4 launch (32-key blocks,
    # decode_plan.fused_decode_multi_row_blocks; 17 splits, no prefetch)
    # (the key loop's pipelining and the warps as the launch takes them: decode_plan.decode_pipelined,
    # fused_decode_launch_options -- one row: the plain loop; not wide: 8 warps)
    launches = ((32, 17, 64, 64, 1, False), (16, 64, 64, 16, 1, False), (16, 33, 64, 32, 1, True),
                (32, 17, 0, decode_plan.FUSED_DECODE_MULTI_ROW_BLOCK_N, 4, False))
    for heads, splits, prefetch, bn, rows, is_wide in launches:
        g = heads // 8
        pipe = decode_plan.decode_pipelined(rows, is_wide)
        warps = dict(num_warps=decode_plan.fused_decode_launch_options(rows, is_wide)["num_warps"])
        c = dict(H=heads, KVH=8, G=g, GP=g, QR=16, D=128, HALF=64, PAGE=16, BLOCK_N=bn, SPLITS=splits, Q_NORM=True,
                 K_NORM=True, DOT_F32=False, PIPELINE=pipe, USE_PDL=True, KV_PREFETCH=prefetch, KV_LINES=2,
                 KV_LAST=decode_plan.DECODE_KV_PREFETCH_LAST, PV_SPLIT=decode_plan.decode_pv_split(wide=is_wide),
                 V_FIRST=decode_plan.DECODE_V_FIRST)
        r = dict(H=heads, KVH=8, G=g, GP=g, D=128, DP=128, SPLITS=splits, SP=1 << (splits - 1).bit_length(),
                 USE_PDL=True, EARLY=True)
        rsig = {"M_ws": "*fp32", "L_ws": "*fp32", "ACC_ws": "*fp32", "Out": P}
        wide = " wide" if is_wide else (f" {bn}-key blocks" if prefetch == 0 else "")
        out.append((f"fused decode {heads}x8 splits {splits}{wide}", "_rope_decode_kernel", DECODE_SIG,
                    {**c, "PROBE": None}, warps))
        if heads == 32:  # Qwen3-8B's launches with P V the other way (FLARE_DECODE_PV_SPLIT flipped)
            other = "tf32x3" if decode_plan.DECODE_PV_SPLIT else "pv-split"
            out.append((f"fused decode {heads}x8 splits {splits}{wide} {other}", "_rope_decode_kernel", DECODE_SIG,
                        {**c, "PROBE": None, "PV_SPLIT": not decode_plan.DECODE_PV_SPLIT}, warps))
        if heads == 32 and rows == 1:  # the writer's loads elsewhere (decode_plan.DECODE_V_FIRST's other levels)
            for level in sorted({0, 1, 2} - {decode_plan.DECODE_V_FIRST}):
                out.append((f"fused decode {heads}x8 splits {splits}{wide} writer loads {level}", "_rope_decode_kernel",
                            DECODE_SIG, {**c, "PROBE": None, "V_FIRST": level}, warps))
            out.append((f"fused decode {heads}x8 splits {splits}{wide} pages first", "_rope_decode_kernel", DECODE_SIG,
                        {**c, "PROBE": None, "PAGES_FIRST": True}, warps))  # decode_plan.DECODE_PAGES_FIRST
            out.append((f"fused decode {heads}x8 splits {splits}{wide} pages first writer loads 1",
                        "_rope_decode_kernel", DECODE_SIG, {**c, "PROBE": None, "PAGES_FIRST": True, "V_FIRST": 1},
                        warps))
        if not is_wide:  # the launch combining its splits itself (decode_plan.DECODE_COMBINE_ROWS)
            out.append((f"fused decode {heads}x8 splits {splits}{wide} combining", "_rope_decode_kernel",
                        {**DECODE_SIG, "CNT": "*i32"}, {**c, "PROBE": None, "COMBINE": True}, warps))
        if wide:  # the wide launch's reduce, and the batch-4 one's (the one-row launch's: the same 17 splits)
            continue
        out.append((f"decode reduce {heads}x8 splits {splits}", "_paged_decode_reduce_kernel", rsig,
                    {**r, "PROBE": None}, dict(num_warps=4)))
        if heads == 32 and prefetch:  # the reduce prefetching the output projection's last rows into L2
            out.append((f"decode reduce {heads}x8 splits {splits} prefetching", "_paged_decode_reduce_kernel",
                        {**rsig, "PF": P, "PF_FIRST": "i32", "PF_LINES": "i32"}, {**r, "PROBE": None, "HAS_PF": True},
                        dict(num_warps=4)))
        if heads == 32 and prefetch:  # the timing probe (scripts/probe_decode_attention.py, one row) compiles too
            out.append((f"fused decode {heads}x8 splits {splits} probed", "_rope_decode_kernel",
                        {**DECODE_SIG, "PROBE": "*i64"}, {**c, "HAS_PROBE": True}, warps))
            out.append((f"decode reduce {heads}x8 splits {splits} probed", "_paged_decode_reduce_kernel",
                        {**rsig, "PROBE": "*i64"}, {**r, "HAS_PROBE": True}, dict(num_warps=4)))
    for name, n, k, norm, gated, res, gi in (("8B qkv (norm apart)", 6144, 4096, False, False, False, False),
                                             ("8B qkv (norm in it)", 6144, 4096, True, False, False, False),
                                             ("8B o_proj", 4096, 4096, False, False, True, False),
                                             ("8B gate_up", 24576, 4096, True, True, False, False),
                                             ("8B gate_up (norm apart)", 24576, 4096, False, True, False, False),
                                             ("8B down", 4096, 12288, False, False, True, True),
                                             ("8B down (plain)", 4096, 12288, False, False, True, False),
                                             ("0.6B qkv (norm apart)", 4096, 1024, False, False, False, False)):
        cfg = linear.gemm_rows_config(4, n, k, gated)
        c = dict(K=k, MP=linear.GEMV_MAX_ROWS, BN=cfg["BN"], BK=cfg["BK"], HAS_NORM=norm, HAS_RES=res, GATED=gated,
                 EVEN_K=True, GATED_IN=gi, USE_PDL=True, PREFETCH=2, PF_LINES=max(1, cfg["BK"] // 64),
                 DOT_F32=False, NORM_STAGES=linear.GEMM_ROWS_NORM_STAGES if norm else 0,
                 RES_FIRST=res and linear.GEMM_ROWS_RES_FIRST)
        out.append((f"tensor-core {name}", "_fused_gemm_rows_kernel", GEMV_SIG, c,
                    dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])))
        opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        parts = -(-(n // 2 if gated else n) // cfg["BN"])
        if name in ("8B o_proj", "8B down (plain)"):  # fused_linear.GEMM_ROWS_PRENORM's publishing launches
            out.append((f"tensor-core {name} publishing the next norm", "_fused_gemm_rows_kernel",
                        {**GEMV_SIG, "NW_OUT": P, "XW": P, "S_OUT": "*fp32", "stride_xw": "i32"},
                        {**c, "OUT_PARTS": parts}, opts))
        if name in ("8B qkv (norm apart)", "8B gate_up (norm apart)"):  # ... and the launches taking it
            out.append((f"tensor-core {name} taking the published norm", "_fused_gemm_rows_kernel",
                        {**GEMV_SIG, "S_IN": "*fp32"}, {**c, "IN_PARTS": 128, "IN_PP": 128}, opts))
    # the rope write outside the fused decode (prefill chunks; the unfused decode path) at Qwen3-8B's and -0.6B's heads,
    # and the standalone RMSNorm at their hidden sizes
    rope_sig = {**{n: P for n in "Q K V QW KW COS SIN KP VP".split()}, "SLOTS": "*i64", "QO": P, "T": "i32",
                **{n: "i32" for n in ("stride_qb stride_qt stride_qh stride_kb stride_kt stride_kh stride_vb stride_vt "
                                      "stride_vh stride_cb stride_ct stride_sb stride_st stride_kpp stride_kps "
                                      "stride_kph stride_vpp stride_vps stride_vph").split()}, "eps": "fp32"}
    for heads in (32, 16):
        out.append((f"rope write {heads}x8", "_rope_write_kernel", rope_sig,
                    dict(H=heads, KVH=8, HP=heads, KVP=8, D=128, HALF=64, PAGE=16, Q_NORM=True, K_NORM=True,
                         USE_PDL=True, ADD_RN=True), dict(num_warps=4 if heads * 128 <= 4096 else 8)))
    for hidden in (4096, 1024):
        out.append((f"rms norm {hidden}", "_rms_norm_kernel", {"X": P, "W": P, "Y": P, "rows": "i32",
                                                               "stride_x": "i32", "N": "i32", "eps": "fp32"},
                    dict(BLOCK=hidden, USE_PDL=True), dict(num_warps=4 if hidden <= 1024 else 8)))
    cfg = prefill_attention.paged_prefill_config(4096, 4, 128, 16)  # Qwen3-8B's 4096-token chunk
    out.append((f"prefill attention {cfg['BLOCK_M']}x{cfg['BLOCK_N']}", "_paged_prefill_kernel", PREFILL_SIG,
                dict(KVH=8, G=4, D=128, DP=128, PAGE=16, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], DOT_F32=False,
                     PIPELINE=True, USE_PDL=True), dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])))
    out.append(("topk chunk 4096 k64", "_topk_chunk_kernel", {"X": "*fp32", "WS": "*fp32", "V": "i32",
                                                               "stride_x": "i32"}, dict(CHUNK=4096, KP=64),
                dict(num_warps=8)))
    out.append(("topk merge 4096 k64", "_topk_merge_kernel", {"WS": "*fp32", "Out": "*fp32", "N": "i32", "K": "i32",
                                                               "stride_o": "i32"}, dict(NP=4096, KP=64),
                dict(num_warps=8)))
    rot = {"POS": "*i64", "INV": "*fp32", "COS": P, "SIN": P, "R": "i32", "scaling": "fp32", "IDS": "*i64",
           "TABLE": P, "HID": P, "stride_t": "i32", "SLOTMAP": "*i64", "ACTIVE": "*i1", "SEQLENS": "*i64",
           "SLOTS": "*i64", "VALID": "*i1", "LENS": "*i64", "T": "i32", "sink": "i32", "max_len": "i32"}
    out.append(("rotary cos/sin 64 bf16", "_rotary_cos_sin_kernel", rot,
                dict(HALF=64, HP=64, BLOCK_R=rotary.ROTARY_BLOCK_ROWS, USE_PDL=True), dict(num_warps=4)))
    out.append(("embed + rotary 4096 bf16", "_rotary_cos_sin_kernel", rot,  # flare::embed_rotary, Qwen3-8B's width
                dict(HALF=64, HP=64, BLOCK_R=rotary.ROTARY_BLOCK_ROWS, USE_PDL=True, H=4096,
                     BLOCK_H=rotary.EMBED_BLOCK_H), dict(num_warps=4)))
    out.append(("embed + rotary + batch 4096 bf16", "_rotary_cos_sin_kernel", rot,  # flare::embed_rotary_batch
                dict(HALF=64, HP=64, BLOCK_R=rotary.ROTARY_BLOCK_ROWS, USE_PDL=True, H=4096,
                     BLOCK_H=rotary.EMBED_BLOCK_H, META=True), dict(num_warps=4)))
    out.append(("sampling cut 2048", "_sampling_cut_kernel", {"Y": "*fp32", "TOPK": "*i32", "TOPP": "*fp32",
                                                              "SKIP": "*i1", "CUT": "*fp32", "WS": "*fp32",
                                                              "V": "i32", "stride_y": "i32"},
                dict(BLOCK=sampling_cut.SAMPLING_CUT_BLOCK, PIPELINE=True, NB=0),
                dict(num_warps=sampling_cut.SAMPLING_CUT_WARPS)))
    # the compacted cut at Qwen3's vocabulary (sampling_cut.sampling_cut_compact_triton: 38 chunks of 4096)
    # as the sampler launches them: the greedy rows skipped by the kernels, from the temperatures (SKIP_BELOW)
    rows = {"Y": "*fp32", "TOPK": "*i32", "TOPP": "*fp32", "SKIP": "*fp32"}
    mz = {"MC": "*fp32", "ZC": "*fp32"}
    chunks = dict(C=38, CP=64)
    bins = dict(NBINS=sampling_cut.SAMPLING_CUT_BINS, INV_W=sampling_cut.SAMPLING_CUT_INV_W)
    cut = []
    cut.append(("cut chunk stats 4096", "_cut_chunk_stats_kernel", {**rows, **mz, "V": "i32", "stride_y": "i32"},
                dict(C=38, CHUNK=4096, USE_PDL=True, SKIP_BELOW=1e-5), dict(num_warps=8)))
    cut.append(("cut chunk histogram 4096", "_cut_chunk_hist_kernel",
                {**rows, **mz, "H": "*i32", "V": "i32", "stride_y": "i32"},
                dict(**chunks, CHUNK=4096, **bins, USE_PDL=True, SKIP_BELOW=1e-5), dict(num_warps=8)))
    cut.append(("cut plan", "_cut_plan_kernel", {"TOPK": "*i32", "TOPP": "*fp32", "SKIP": "*fp32", **mz, "H": "*i32",
                                                 "PLAN": "*i32", "OFF": "*i32", "V": "i32"},
                dict(**chunks, **bins, MARGIN=sampling_cut.SAMPLING_CUT_MARGIN, USE_PDL=True, SKIP_BELOW=1e-5),
                dict(num_warps=16)))
    cut.append(("cut compact 4096", "_cut_compact_kernel",
                {**rows, **mz, "PLAN": "*i32", "OFF": "*i32", "BUF": "*fp32", "MA": "*fp32", "V": "i32",
                 "stride_y": "i32"},
                dict(**chunks, CHUNK=4096, **bins, BUFN=sampling_cut.SAMPLING_CUT_BUFFER, USE_PDL=True,
                     SKIP_BELOW=1e-5),
                dict(num_warps=8)))
    cut.append((f"cut final {sampling_cut.SAMPLING_CUT_CAP}", "_cut_final_kernel",
                {**rows, **mz, "PLAN": "*i32", "BUF": "*fp32", "MA": "*fp32", "CUT": "*fp32", "WS": "*fp32", "V": "i32",
                 "stride_y": "i32"},
                dict(**chunks, CAP=sampling_cut.SAMPLING_CUT_CAP, BUFN=sampling_cut.SAMPLING_CUT_BUFFER,
                     BLOCK=sampling_cut.SAMPLING_CUT_BLOCK, PIPELINE=True, NB=0, USE_PDL=True, SKIP_BELOW=1e-5),
                dict(num_warps=sampling_cut.SAMPLING_CUT_WARPS)))
    # and as flare::sample_advance_into_ launches them: every row done after the front -> return before the wait
    # (kernels.sampler_done; one row)
    done = ({"MINP": "*fp32", "B": "i32"}, dict(BP=1, SKIP_DONE=True))
    out += cut + [(f"{name} skip-done", kernel, {**sig, **done[0]}, {**consts, **done[1]}, opts)
                  for name, kernel, sig, consts, opts in cut]
    out.append((f"sorted cut {sampling_cut.SORTED_CUT_BLOCK}", "_sorted_cut_kernel",
                {"S": "*fp32", "TOPK": "*i32", "TOPP": "*fp32", "CUT": "*fp32", "n": "i32", "stride_s": "i32"},
                dict(BLOCK=sampling_cut.SORTED_CUT_BLOCK, PIPELINE=True, SCAN=sampling_cut.SORTED_CUT_SCAN),
                dict(num_warps=sampling_cut.SORTED_CUT_WARPS)))
    chunks = -(-151_936 // sampler_front.FRONT_CHUNK)  # the sampler's front over Qwen3's vocabulary
    rows = {n: "*fp32" for n in ("REP", "FREQ", "PRES", "TEMP")}
    draw = {"SEED": "*i64", "STEP": "*i64", "TOPK": "*i32", "TOPP": "*fp32", "MINP": "*fp32", "ACTIVE": "*i1",
            "OUT": "*i64", "PZ": "*fp32", "PZI": "*i32", "pad": "i32"}  # flare::sample_advance_into_'s front
    for with_draw in (False, True):
        out.append((f"sampler front {sampler_front.FRONT_CHUNK}{' draw' if with_draw else ''}", "_front_kernel",
                    {"X": P, "CNT": "*i32", "PM": "*i1", **rows, "Y": "*fp32", "PY": "*fp32", "PX": "*fp32",
                     "PI": "*i32", "TICK": "*i32", "GREEDY": "*i64", "YMAX": "*fp32", "V": "i32",
                     "stride_x": "i32", "stride_c": "i32", "stride_p": "i32", "stride_y": "i32",
                     **(draw if with_draw else {})},
                    dict(GREEDY_EPS=1e-5, HAS_PEN=True, CHUNK=sampler_front.FRONT_CHUNK, CHUNKS=chunks,
                         CP=1 << (chunks - 1).bit_length(), USE_PDL=True, DRAW=with_draw),
                    dict(num_warps=sampler_front.FRONT_WARPS)))
    for done in (False, True):  # the min-p mask, and in flare::sample_advance_into_ (its early trigger; one row)
        out.append((f"sampler min-p {sampler_front.FRONT_CHUNK}{' done' if done else ''}", "_min_p_kernel",
                    {"Y": "*fp32", "YMAX": "*fp32", "MINP": "*fp32", "V": "i32", "stride_y": "i32",
                     **({"TEMP": "*fp32", "TOPK": "*i32", "TOPP": "*fp32", "B": "i32", "eps": "fp32", "early": "i32"}
                        if done else {})},
                    dict(CHUNK=sampler_front.FRONT_CHUNK, USE_PDL=True, **(dict(BP=1, DONE=True) if done else {})),
                    dict(num_warps=sampler_front.FRONT_WARPS)))
    chunks = -(-151_936 // gumbel.GUMBEL_CHUNK)  # the sampler's draw over Qwen3's vocabulary
    # the draw alone, ending the sampler (flare::draw_finish_), and skipping the done rows (flare::sample_advance_into_)
    for finish, skip in ((False, False), (True, False), (True, True)):
        out.append((f"gumbel argmax {gumbel.GUMBEL_CHUNK}{' finish' if finish else ''}{' skip-done' if skip else ''}",
                    "_gumbel_argmax_kernel",
                    {"Y": "*fp32", "CUT": "*fp32", "SEED": "*i64", "STEP": "*i64", "PV": "*fp32", "PI": "*i32",
                     "CNT": "*i32", "OUT": "*i64", "V": "i32", "stride_y": "i32", "GREEDY": "*i64", "TEMP": "*fp32",
                     "ACTIVE": "*i1", "COUNTS": "*i32", "stride_c": "i32", "eps": "fp32", "pad": "i32",
                     **({"TOPK": "*i32", "TOPP": "*fp32", "MINP": "*fp32", "B": "i32"} if skip else {})},
                    dict(CHUNK=gumbel.GUMBEL_CHUNK, CHUNKS=chunks, CP=1 << (chunks - 1).bit_length(), FINISH=finish,
                         USE_PDL=True, **(dict(BP=1, SKIP_DONE=True) if skip else {})),
                    dict(num_warps=gumbel.GUMBEL_WARPS)))
    return out


def compile_sm90(fn, sig, consts, opts):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = {**{q.name: q.default for q in fn.params if q.is_constexpr and q.has_default}, **consts}
    div = [i for i, (k, t) in enumerate(sig.items()) if k.startswith("stride") or t.startswith("*")]
    full = {**sig, **{c: "constexpr" for c in consts}}
    if getattr(fn, "is_gluon", lambda: False)():  # a Gluon kernel (its own source kind)
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    src = ASTSource(fn=fn, signature=full, constexprs=consts, attrs={(i,): [["tt.divisibility", 16]] for i in div})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def kernel_of(name: str):
    """The kernel ``name`` of the kernel modules (``ignition.components.kernels``), or ``module.kernel`` of another
    module of ``ignition.components``."""
    import pkgutil

    from ignition.components import kernels

    if "." in name:
        module, _, kernel = name.rpartition(".")
        return getattr(importlib.import_module(f"ignition.components.{module}"), kernel)
    found = {id(fn): fn for fn in (vars(importlib.import_module(f"{kernels.__name__}.{m.name}")).get(name)
                                   for m in pkgutil.iter_modules(kernels.__path__)) if fn is not None}
    if len(found) != 1:  # one kernel, however many modules import it
        raise KeyError(f"kernel {name}: {len(found)} kernels of that name in the kernel modules")
    return next(iter(found.values()))


#: Labels only the debug info places (``$L__tmp3:`` between instructions, the function's begin and end): dropped.
DEBUG_LABEL = re.compile(r"\$L__(?:tmp|func_begin|func_end)\d*:?")


def _no_debug(ptx: str) -> str:
    """The PTX without comments, locations and the debug sections after the code."""
    return re.sub(r"\.file.*|\.loc.*", "", re.sub(r"//.*", "", ptx)).split(".section")[0]


def code_of(ptx: str) -> str:
    """The PTX without comments, debug sections, locations and debug labels, every other label renamed by its first
    appearance: ``bra $L__BB0_3`` and ``bra $L__BB0_2`` to the same place are the same code, to another place not."""
    names: dict[str, str] = {}
    ptx = re.sub(r"\$L__\w+", lambda m: names.setdefault(m.group(0), f"$L{len(names)}"),
                 DEBUG_LABEL.sub("", _no_debug(ptx)))
    return re.sub(r"\n\s*\n", "\n", ptx)


def legacy_code_of(ptx: str) -> str:
    """The normalization of this script's revisions before :func:`code_of` (every label name removed): what
    ``--against`` compares with a revision that archives no PTX of its own."""
    return re.sub(r"\n\s*\n", "\n", re.sub(r"\$L__\w+:?", "", _no_debug(ptx)))


#: A bf16 (or bf16x2) fused multiply-add in the PTX.  No kernel asks for one: the kernels compute in fp32 and round to
#: bf16 where the canonical modules do, and LLVM forms one only by narrowing ``bf16(bf16(a * b) + c)`` to bf16
#: operations and contracting them -- one rounding instead of two (``rope_write._sum_rounded``).
BF16_FMA = re.compile(r"\bfma\.rn(?:\.\w+)*\.bf16")


def _ptx_file(folder: Path, case: str) -> Path:
    return folder / (re.sub(r"[^\w.-]+", "_", case) + ".ptx")


def ptxas_report(ptx: str) -> str:
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        res = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True,
                             text=True)
    lines = [ln.split("ptxas info    :")[-1].strip() for ln in res.stderr.splitlines()
             if "registers" in ln or "spill" in ln]
    return " | ".join(lines) or res.stderr.strip()[-200:]


def ptx_at(rev: str, only: str) -> tuple[dict[str, str], bool]:
    """``({case: md5}, legacy)`` of revision ``rev``'s own check (its script, its kernels, its cases) run in a
    temporary worktree: the md5 of each case's PTX by this script's :func:`code_of` where ``rev``'s check writes its
    PTX (``--ptx-dir``), else ``rev``'s own ``ptx_md5`` (``legacy``: label names removed, :func:`legacy_code_of`)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree, out, ptx_dir = Path(tmp) / "tree", Path(tmp) / "rev.json", Path(tmp) / "ptx"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), rev], cwd=ROOT, check=True)
        try:
            script = tree / "scripts" / "sm90_kernel_check.py"
            legacy = "--ptx-dir" not in script.read_text()
            extra = [] if legacy else ["--ptx-dir", str(ptx_dir)]
            res = subprocess.run([sys.executable, str(script), "--only", only, "--json", str(out), *extra],
                                 cwd=tree, capture_output=True, text=True)
            if res.returncode:
                raise SystemExit(f"sm90_kernel_check at {rev} failed:\n{res.stderr[-2000:]}")
            rows = json.loads(out.read_text())
            if not legacy:
                return {r["case"]: hashlib.md5(code_of(_ptx_file(ptx_dir, r["case"]).read_text()).encode()).hexdigest()
                        for r in rows}, False
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    if any("ptx_md5" not in r for r in rows):
        raise SystemExit(f"sm90_kernel_check at {rev} reports no ptx_md5: too old to compare against")
    return {r["case"]: r["ptx_md5"] for r in rows}, True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", help="git revision whose own check to compare each case's PTX with")
    ap.add_argument("--only", default="", help="only cases whose name contains this")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--ptx-dir", type=Path, help="also write each case's PTX here (what --against reads of a revision)")
    args = ap.parse_args(argv)
    from ignition.components.kernels import decode_plan

    old, legacy = ptx_at(args.against, args.only) if args.against else (None, False)
    if legacy:
        print(f"{args.against}'s check writes no PTX: compared as it normalized it, every label name removed")
    if args.ptx_dir:
        args.ptx_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, kernel, sig, consts, opts in cases():
        if args.only not in name:
            continue
        k = compile_sm90(kernel_of(kernel), sig, consts, opts)
        row = {"case": name, "ptxas": ptxas_report(k.asm["ptx"]), "shared_bytes": k.metadata.shared}
        used = re.search(r"Used (\d+) registers", row["ptxas"])
        if used:  # resident programs per SM (decode_plan.programs_per_sm): what a launch's one wave holds
            row["per_sm"] = decode_plan.programs_per_sm(int(used.group(1)), opts.get("num_warps", 4),
                                                        k.metadata.shared)
        row["ptx_md5"] = hashlib.md5(code_of(k.asm["ptx"]).encode()).hexdigest()
        row["bf16_fma"] = len(BF16_FMA.findall(k.asm["ptx"]))
        if args.ptx_dir:
            _ptx_file(args.ptx_dir, name).write_text(k.asm["ptx"])
        if old is not None:
            mine = hashlib.md5(legacy_code_of(k.asm["ptx"]).encode()).hexdigest() if legacy else row["ptx_md5"]
            row["same_ptx_as_" + args.against] = old[name] == mine if name in old else "new case"
        rows.append(row)
        extra = f"  same PTX as {args.against}: {row['same_ptx_as_' + args.against]}" if old is not None else ""
        fused = f"  {row['bf16_fma']} bf16 fma: a rounding point contracted away" if row["bf16_fma"] else ""
        print(f"{name:<44} {row['ptxas']}  shared {row['shared_bytes']}  {row.get('per_sm', '?')} per SM{extra}{fused}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    contracted = [r["case"] for r in rows if r["bf16_fma"]]
    if contracted:
        print(f"FAIL: bf16 fma in {len(contracted)} case(s) ({', '.join(contracted)}): no kernel asks for one, so LLVM "
              "fused a product rounded to bf16 into the sum after it (rope_write._sum_rounded)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
