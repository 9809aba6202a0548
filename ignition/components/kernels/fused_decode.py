"""The fused decode step of one layer (``flare::rope_decode_attention_``): q/k norms, rotary, the paged K/V write
and the decode attention's first pass in one launch, the reduce of :mod:`.paged_decode` after it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ignition.components.kernels.decode_plan import (_decode_geometry, _decode_workspace, decode_combine_in_kernel,
                                                     decode_kv_prefetch_keys, DECODE_KV_PREFETCH_LAST,
                                                     decode_new_key_apart, decode_pipelined, decode_pv_split,
                                                     decode_pages_first, decode_v_first,
                                                     fused_decode_launch_options)
from ignition.components.kernels.launch import (_interpreting, _pdl, _pdl_enter, _probe_args, _probe_smid, _probe_stamp,
                                                zeroed_counts)
from ignition.components.kernels.paged_decode import (_decode_block, _decode_blocks, _decode_combine_last,
                                                      _decode_init, _decode_len, _decode_pages, _decode_prefetch_kv,
                                                      _decode_share, _decode_store_partial, _LOG2E, _paged_decode_reduce_kernel)
from ignition.components.kernels.rope_write import (_check_rope_inputs, _norm_rope_halves, _rope_cos_sin, _rope_kv_rows,
                                                    _rope_store_kv, _rope_write_kv, rope_add_rn)
from ignition.components.switches import switch


# ------------------------------------------------------------------------------------------------------------
# Fused decode step of one layer (``flare::rope_decode_attention_``, ``ignition/components/decode_attention.py``):
# q_norm / k_norm, the rotary embedding, the paged K/V write and pass 1 of the decode attention (:mod:`.paged_decode`)
# in ONE launch, grid (B, KV heads, splits); pass 2 is its reduce kernel.  Each program forms its group's rotated query
# rows itself (the row helper of ``flare::rope_write_``), so nothing waits for another kernel's q.  The K/V write: the
# program whose share holds the row's last key block (split 0 when the row has no key) writes the new key and value of
# its KV head to the token's slot, then a CTA barrier, then reads its blocks -- the only reader of that slot in this
# launch is that program (the step's new token is its row's last key; other splits read earlier blocks; a sink slot is
# read by nobody), and a barrier orders a CTA's global writes before its later reads.  Side by side on the H200
# (``scripts/bench_decode_attention.py``, ``results/20261201T031427Z-sm90-run9``): a combine
# in the kernel by the last program of each group (atomic counter) lost to the reduce kernel at every shape (the
# last program reads all partials of its group alone), so pass 2 stays a kernel -- unless
# ``FLARE_DECODE_COMBINE_ROWS=N`` (``decode_plan.DECODE_COMBINE_ROWS``: a combine that issues the group's loads
# together, to be measured in the step).


#: The fused decode kernel's per-(row, KV head) counts of programs done when it combines its splits itself
#: (``decode_plan.DECODE_COMBINE_ROWS``), one buffer per device (``launch.zeroed_counts``).
_COMBINE_COUNTS: dict[tuple[str, int], torch.Tensor] = {}


@triton.jit
def _decode_writer(n_blocks, per_split, SPLITS: tl.constexpr, NEW_APART: tl.constexpr):
    """The split that writes the row's new key and value: the one holding the row's last key block (split 0 when
    the row has no key), or with ``NEW_APART`` the program of its own (split ``SPLITS``)."""
    if NEW_APART:
        writer = SPLITS
    else:
        writer = tl.where(n_blocks > 0, (n_blocks - 1) // tl.maximum(per_split, 1), 0)
    return writer


@triton.jit
def _rope_decode_kernel(Q, K, V, QW, KW, COS, SIN, KP, VP, SLOTS, BT, SL, M_ws, L_ws, ACC_ws, Out,
                        stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_cb, stride_sb,
                        stride_kp, stride_kt, stride_kph, stride_vp, stride_vt, stride_vph,
                        stride_bt, max_pages, qk_scale_log2, eps,
                        H: tl.constexpr, KVH: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, QR: tl.constexpr,
                        D: tl.constexpr, HALF: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                        SPLITS: tl.constexpr, Q_NORM: tl.constexpr, K_NORM: tl.constexpr,
                        DOT_F32: tl.constexpr, PIPELINE: tl.constexpr, USE_PDL: tl.constexpr,
                        KV_PREFETCH: tl.constexpr, KV_LINES: tl.constexpr, PROBE=None,
                        HAS_PROBE: tl.constexpr = False, KV_LAST: tl.constexpr = False,
                        NEW_APART: tl.constexpr = False, WS: tl.constexpr = 0, PV_SPLIT: tl.constexpr = False,
                        SMEM_PAD: tl.constexpr = 0, TRIGGER: tl.constexpr = 0, CNT=None,
                        COMBINE: tl.constexpr = False, V_FIRST: tl.constexpr = 0,
                        PAGES_FIRST: tl.constexpr = False, ADD_RN: tl.constexpr = True):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    b64 = b.to(tl.int64)
    prog = (b * KVH + kvh) * SPLITS + split  # the timing probe's row (HAS_PROBE: diagnostics only)
    _probe_stamp(PROBE, prog, 0, split, HAS_PROBE)
    _probe_smid(PROBE, prog, HAS_PROBE)
    # Before the wait (the rules at the top of this file): the share of this split from the sequence length, and an
    # L2 prefetch of its first KV_PREFETCH keys -- the old keys come from HBM while the qkv projection finishes.
    # NEW_APART: splits 0 .. SPLITS - 1 walk the keys before the row's last; program SPLITS (its share empty) writes
    # the new key and value and forms that key's partial alone (:data:`DECODE_NEW_KEY_APART`)
    seq_len, n_blocks, per_split, start, end = _decode_share(SL, b, split, max_pages, PAGE, BLOCK_N, SPLITS,
                                                             NEW_APART)
    if USE_PDL and KV_PREFETCH > 0:
        _decode_prefetch_kv(start, end, KP, VP, BT, b64, kvh, seq_len, stride_kp, stride_kt, stride_kph, stride_vp,
                            stride_vt, stride_vph, stride_bt, D, PAGE, BLOCK_N, KV_LINES, KV_PREFETCH, KV_LAST)
    _probe_stamp(PROBE, prog, 1, seq_len, HAS_PROBE)
    # after the wait: tried and removed, the reduce (and through it o_proj and the MLP) launched before it -- within
    # noise in the one-row layer graphs (Qwen3-0.6B 1.0032x, Qwen3-8B 1.0020x, ``results/20261201T190000Z-sm90-run77``).
    # Tried and removed too: the writer's new K/V rows and the first one or two key blocks loaded before the query
    # rows' arithmetic (the new slot patched in; same bits) -- slower in both layer graphs (1 block: Qwen3-8B 1.016x,
    # Qwen3-0.6B 1.044x; 2 blocks: 1.025x, 1.076x; ``results/20261201T202700Z-sm90-run79``).
    # Tried and removed too: the trigger after the key loop instead (so that the reduce and, through the EARLY chain,
    # the projections after it stream their weights only once this kernel's K/V loads are done) -- the last block's
    # K/V load stayed 3.3 us at Qwen3-0.6B, and slower: the one-row layer graphs 1.053x (0.6B) and 1.015x (8B), the
    # Qwen3-0.6B step 1.113x side by side (``results/20261201T213000Z-sm90-run84``).
    if TRIGGER == 0:
        _pdl_enter(USE_PDL)
    elif USE_PDL:  # a later trigger (``FLARE_DECODE_TRIGGER``, :func:`fused_decode_launch_options`): the wait alone
        gdc_wait()
    _probe_stamp(PROBE, prog, 2, split, HAS_PROBE)
    offs_g = tl.arange(0, QR)
    offs_d = tl.arange(0, D)
    d_mask = offs_d < D
    offs_h = tl.arange(0, HALF)
    pages0 = start  # PAGES_FIRST: the first key block's page ids, in flight with the query rows below
    if PAGES_FIRST:  # (:data:`decode_plan.DECODE_PAGES_FIRST`)
        tok0 = start * BLOCK_N + tl.arange(0, BLOCK_N)
        pages0 = _decode_pages(BT, b64, tok0, tok0 < seq_len, stride_bt, PAGE)
    if V_FIRST == 2:  # the writer's new key, value and key-norm weights in flight with the query rows below
        one = tl.arange(0, 1)[:, None]
        kv = _rope_kv_rows(K + b64 * stride_kb + kvh * stride_kh + one, V + b64 * stride_vb + kvh * stride_vh + one,
                           KW, offs_h, (one < 1) & (split == _decode_writer(n_blocks, per_split, SPLITS, NEW_APART)),
                           HALF, K_NORM)
    cos1, cos2, sin1, sin2 = _rope_cos_sin(COS + b64 * stride_cb, SIN + b64 * stride_sb, offs_h, HALF)
    q1, q2 = _norm_rope_halves(Q + b64 * stride_qb + (kvh * G + offs_g)[:, None] * stride_qh, (offs_g < G)[:, None],
                               QW, offs_h, cos1, cos2, sin1, sin2, eps, D, HALF, Q_NORM, ADD_RN)
    q = tl.reshape(tl.permute(tl.join(q1, q2), (0, 2, 1)), (QR, D))  # [QR, D]: the halves side by side; 0 past G
    _probe_stamp(PROBE, prog, 3, tl.sum(tl.sum(q.to(tl.float32), axis=1), axis=0).to(tl.int32, bitcast=True),
                 HAS_PROBE)
    if USE_PDL and TRIGGER == 1:
        gdc_launch_dependents()

    if split == _decode_writer(n_blocks, per_split, SPLITS, NEW_APART):
        slot = tl.load(SLOTS + b).to(tl.int64)
        one = tl.arange(0, 1)[:, None]
        if V_FIRST == 2:
            _rope_store_kv(kv, KP + (slot // PAGE) * stride_kp + (slot % PAGE) * stride_kt + kvh * stride_kph + one,
                           VP + (slot // PAGE) * stride_vp + (slot % PAGE) * stride_vt + kvh * stride_vph + one,
                           KW, offs_h, cos1, cos2, sin1, sin2, eps, one < 1, D, HALF, K_NORM, ADD_RN)
        else:  # the slot's rows spelled out in each call: named once before, the default launch's PTX moved
            _rope_write_kv(K + b64 * stride_kb + kvh * stride_kh + one, V + b64 * stride_vb + kvh * stride_vh + one,
                           KP + (slot // PAGE) * stride_kp + (slot % PAGE) * stride_kt + kvh * stride_kph + one,
                           VP + (slot // PAGE) * stride_vp + (slot % PAGE) * stride_vt + kvh * stride_vph + one,
                           KW, offs_h, cos1, cos2, sin1, sin2, eps, one < 1, D, HALF, K_NORM, ADD_RN, V_FIRST == 1)
        tl.debug_barrier()  # this CTA's reads of the new slot below come after its writes
    _probe_stamp(PROBE, prog, 4, split, HAS_PROBE)

    if NEW_APART and split == SPLITS:  # the new key alone, read back after this program's own write (the barrier)
        full = _decode_len(SL, b, max_pages, PAGE)
        m_i, l_i, acc = _decode_init(QR, D)
        if full > 0:
            m_i, l_i, acc = _decode_block((full - 1) // BLOCK_N, q, m_i, l_i, acc, KP, VP, BT, b64, kvh, full,
                                          tl.arange(0, BLOCK_N), offs_d, d_mask, stride_kp, stride_kt, stride_kph,
                                          stride_vp, stride_vt, stride_vph, stride_bt, qk_scale_log2, PAGE, BLOCK_N,
                                          DOT_F32, LAST_ONLY=True, PV_SPLIT=PV_SPLIT)
    else:
        m_i, l_i, acc = _decode_blocks(q, start, end, KP, VP, BT, b64, kvh, seq_len, tl.arange(0, BLOCK_N), offs_d,
                                       d_mask, stride_kp, stride_kt, stride_kph, stride_vp, stride_vt, stride_vph,
                                       stride_bt, qk_scale_log2, QR, D, PAGE, BLOCK_N, DOT_F32, PIPELINE, PROBE, prog,
                                       HAS_PROBE, PV_SPLIT=PV_SPLIT, PAGES0=pages0, HAS_PAGES0=PAGES_FIRST)
    _probe_stamp(PROBE, prog, 5, tl.sum(l_i, axis=0).to(tl.int32, bitcast=True), HAS_PROBE)
    if USE_PDL and TRIGGER == 2:
        gdc_launch_dependents()
    if SPLITS == 1 and not NEW_APART:
        out = tl.where(l_i[:, None] > 0.0, acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None], 0.0)
        tl.store(Out + b64 * (H * D) + (kvh * G + offs_g)[:, None] * D + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=(offs_g < G)[:, None])
    else:
        _decode_store_partial(M_ws, L_ws, ACC_ws, m_i, l_i, acc, b64, kvh, split, offs_g, offs_d, d_mask, KVH, GP, D,
                              WS if NEW_APART else SPLITS)
        if COMBINE:  # the group's last program combines it (``DECODE_COMBINE_ROWS``): no reduce launch
            _decode_combine_last(CNT, M_ws, L_ws, ACC_ws, Out, b64, kvh, offs_d, d_mask, H, KVH, G, GP, D, D,
                                 WS if NEW_APART else SPLITS, tl.num_programs(2))
    _probe_stamp(PROBE, prog, 6, split, HAS_PROBE)


def rope_decode_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: torch.Tensor | None,
                                 k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                                 k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
                                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scaling: float, *,
                                 num_splits: int | None = None, block_n: int | None = None,
                                 overlap_bytes: int | None = None,
                                 probe: tuple[torch.Tensor, torch.Tensor] | None = None,
                                 prefetch: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """The fused decode step of one layer: ``q [B, 1, H, D]``, ``k, v [B, 1, KV, D]`` (views of the packed QKV
    output are fine), norm weights ``[D]`` or None, ``cos, sin [B, 1, D]``, one layer's pools, sanitized
    ``slots [B]``, ``block_tables [B, P]``, ``seq_lens [B]`` -> ``[B, 1, H * D]``: ``rope_write_triton`` then
    ``paged_decode_attention_triton`` in two launches instead of three (the fused kernel, then the reduce kernel
    unless one split; one launch when the kernel combines its splits itself, :func:`decode_combine_in_kernel`).
    ``num_splits``: default :func:`fused_decode_num_splits`; ``block_n``: keys per block
    (:func:`decode_block_n`); ``overlap_bytes``: the bytes the kernel before it streams (the QKV projection's
    weight; None: unknown), which decide its K/V prefetch (:func:`decode_kv_prefetch_keys`).  ``probe``:
    diagnostics (``scripts/probe_decode_attention.py``) -- int64 buffers ``[B * KV * splits, 2 * PROBE_STAMPS]``
    and ``[B * H, 2 * PROBE_STAMPS]`` that the fused and the reduce kernel fill with clock stamps
    (:func:`_probe_stamp`).  ``prefetch``: ``(weight, nbytes)`` -- the reduce kernel's programs, before their wait,
    prefetch the last ``nbytes`` of ``weight`` (contiguous; the output projection's) into L2
    (``decode_attention.DECODE_REDUCE_PREFETCH_MB``; nothing when 0, in the interpreter or without a reduce launch).
    Shapes are checked by the op (``decode_attention.py``)."""
    geo = _decode_geometry("rope_decode_attention_triton", q, k_pool, v_pool, block_tables, num_splits, fused=True,
                           block_n=block_n)
    b, h, d, kvh, page = geo["B"], geo["H"], geo["D"], geo["KVH"], geo["PAGE"]
    _check_rope_inputs("rope_decode_attention_triton", d, (q, k, v, cos, sin), (q_norm, k_norm))
    out = torch.empty((b, 1, h * d), dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    splits = geo["SPLITS"]
    apart = decode_new_key_apart()
    parts = splits + 1 if apart else splits  # the partials per (row, KV head): with the new key's own
    ws_geo = {**geo, "SPLITS": parts, "SP": triton.next_power_of_2(parts)}
    m_ws, l_ws, acc_ws = _decode_workspace(ws_geo, q.device) if parts > 1 else (out, out, out)  # one split: unused
    combine = parts > 1 and decode_combine_in_kernel(b)
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    slots = slots if slots.is_contiguous() else slots.contiguous()
    _rope_decode_kernel[(b, kvh, parts)](
        q, k, v, q_norm if q_norm is not None else q, k_norm if k_norm is not None else k, cos, sin, k_pool, v_pool,
        slots, block_tables, seq_lens, m_ws, l_ws, acc_ws, out,
        q.stride(0), q.stride(2), k.stride(0), k.stride(2), v.stride(0), v.stride(2), cos.stride(0), sin.stride(0),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        block_tables.stride(0), block_tables.shape[1], float(scaling) * _LOG2E, float(eps),
        H=h, KVH=kvh, G=geo["G"], GP=geo["GP"], QR=geo["QR"], D=d, HALF=d // 2, PAGE=page, BLOCK_N=geo["BLOCK_N"],
        SPLITS=splits, Q_NORM=q_norm is not None, K_NORM=k_norm is not None, DOT_F32=_interpreting(),
        PIPELINE=decode_pipelined(b, geo["WIDE"]), KV_PREFETCH=decode_kv_prefetch_keys(b, overlap_bytes),
        KV_LAST=switch("FLARE_DECODE_KV_PREFETCH_LAST", DECODE_KV_PREFETCH_LAST),
        KV_LINES=max(1, d * k_pool.element_size() // 128), **_pdl(q.device),
        **({"NEW_APART": True, "WS": parts} if apart else {}), PV_SPLIT=decode_pv_split(geo["WIDE"]),
        V_FIRST=decode_v_first(), PAGES_FIRST=decode_pages_first(decode_pipelined(b, geo["WIDE"]), apart),
        ADD_RN=rope_add_rn(),
        **fused_decode_launch_options(b, geo["WIDE"]), **_probe_args(probe, 0, b * kvh * parts),
        **({"CNT": zeroed_counts(_COMBINE_COUNTS, q.device, b * kvh), "COMBINE": True} if combine else {}))
    if parts > 1 and not combine:
        _paged_decode_reduce_kernel[(b, h)](
            m_ws, l_ws, acc_ws, out, H=h, KVH=kvh, G=geo["G"], GP=geo["GP"], D=d, DP=d, SPLITS=parts,
            SP=ws_geo["SP"], num_warps=4, **_pdl(q.device, early_rows=b, overlap_bytes=overlap_bytes),
            **_probe_args(probe, 1, b * h), **_reduce_prefetch_args(prefetch))
    return out


def _reduce_prefetch_args(prefetch: tuple[torch.Tensor, int] | None) -> dict:
    """The reduce kernel's L2 prefetch arguments for ``(weight, nbytes)``: its last ``nbytes`` (whole 128-byte lines,
    at most the weight) -- none when None or 0 bytes, or in the interpreter; raises unless a contiguous CUDA
    tensor starting on a 128-byte line (the bulk prefetch takes 16-byte aligned addresses)."""
    if prefetch is None or prefetch[1] <= 0 or _interpreting():
        return {}
    weight, nbytes = prefetch
    if not (weight.is_cuda and weight.is_contiguous() and weight.data_ptr() % 128 == 0):
        raise ValueError(f"prefetch: a contiguous CUDA tensor on a 128-byte line, got {weight.device} "
                         f"{tuple(weight.shape)} (contiguous: {weight.is_contiguous()}, address mod 128: "
                         f"{weight.data_ptr() % 128})")
    total = weight.numel() * weight.element_size() // 128
    lines = min(total, triton.cdiv(int(nbytes), 128))
    return {"PF": weight, "PF_FIRST": total - lines, "PF_LINES": lines, "PF_STEP": 128 // weight.element_size(),
            "HAS_PF": True}
