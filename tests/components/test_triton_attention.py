"""Paged decode attention that reads only each row's ``seq_lens`` keys: ``flare::paged_decode_attention``, its
Triton flash-decoding kernel and the ``TritonPagedAttention`` backend.

Two groups:

- CPU tests (run everywhere, no Triton needed): the op's CPU implementation (``paged_decode_attention_reference``)
  against an fp64 evaluation and against ``paged_attention_reference`` with the per-row visibility, and the
  backend (decode through the new op, T > 1 through ``flare::paged_attention``);
- interpreter tests (``TRITON_INTERPRET=1``; skipped where Triton is not installed, and where CUDA is present --
  the interpreter would also take over Inductor's kernels in that process): the Triton kernel against the same.

Tolerances (derived, not tuned).  Let ``x`` be the exact (fp64) attention output of the bf16 inputs.

- kernel: everything in fp32 (fp32 errors ~1e-6 relative), one final fp32 -> bf16 conversion.  On the GPU that
  rounds (<= 2**-8 |x|); Triton 3.6's interpreter truncates (< one bf16 spacing <= 2**-7 |x|).  Bound:
  ``2**-7 |x| + 1e-5``.  The CPU implementation rounds once: ``2**-8 |x| + 1e-5``.
- ``paged_attention_reference`` (eager-path numerics) rounds the raw score ``q.k`` and the scaled score to bf16
  (each <= 2**-9 relative), so every logit moves by at most ``eps = 2**-8 * max_j |s_j|`` (per row and head);
  softmax of logits each moved by <= eps moves every probability by at most ``(e**(2 eps) - 1) p_j``; it then
  rounds the probabilities to bf16 (<= 2**-9 p_j) and the output (<= 2**-8 |ref|).  Hence
  ``|ref - x| <= (e**(2 eps) - 1 + 2**-9) * sum_j p_j |v_j| + 2**-8 |ref|`` and
  ``|kernel - ref| <= that + 2**-7 |x| + 1e-5``, evaluated per output element from the fp64 probabilities.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from ignition.components.attention import (AttentionBatch, PagedKVCache, PyTorchPagedAttention, TritonPagedAttention,
                                           paged_attention_reference, paged_decode_attention,
                                           paged_decode_attention_reference, slot_mapping_for)
from ignition.components.custom_ops import op_effects

PAGE = 16
WIDTH = 8  # block-table width P: 128 keys
SEQ_LENS = (1, 17, 100, WIDTH * PAGE, 0)  # ragged, full width, and an inactive row (0)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first import of triton (as test_triton_kernels.py)
try:
    import triton  # noqa: F401
    _HAVE_TRITON = True
except Exception:
    _HAVE_TRITON = False

interpreter = pytest.mark.skipif(
    torch.cuda.is_available() or not _HAVE_TRITON,
    reason="interpreter tests run on CPU machines with Triton installed; the GPU matrix runs the compiled kernels")


def make_case(heads, kv_heads, head_dim, seq_lens=SEQ_LENS, seed=0, poison=False):
    """Random bf16 pools with scattered (non-contiguous, shuffled) pages; ``poison``: every slot no row may read
    (unallocated pages, the sink, the tail of each row's last page and its unused block-table entries' pages)
    holds NaN, so a read past seq_lens shows in the output."""
    gen = torch.Generator().manual_seed(seed)
    b = len(seq_lens)
    pages = b * WIDTH + 5
    shape = (pages + 1, PAGE, kv_heads, head_dim)
    k = torch.randn(shape, generator=gen).to(torch.bfloat16)
    v = torch.randn(shape, generator=gen).to(torch.bfloat16)
    q = torch.randn((b, 1, heads, head_dim), generator=gen).to(torch.bfloat16)
    block_tables = torch.randperm(pages, generator=gen)[:b * WIDTH].view(b, WIDTH).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    if poison:
        used = torch.zeros(pages + 1, PAGE, dtype=torch.bool)
        for row, n in enumerate(seq_lens):
            for j in range(n):
                used[block_tables[row, j // PAGE], j % PAGE] = True
        k[~used], v[~used] = float("nan"), float("nan")  # incl. the pages past each row's seq_lens
    return q, k, v, block_tables, lens


def exact(q, k, v, block_tables, lens, scaling):
    """fp64 attention of the bf16 inputs over keys < seq_lens: (output [B, H, D], sum_j p_j |v_j| [B, H, D],
    max_j |s_j| [B, H]); zeros for empty rows."""
    b, _, h, d = q.shape
    kvh = k.shape[-2]
    g = h // kvh
    out = torch.zeros(b, h, d, dtype=torch.float64)
    pv_abs = torch.zeros_like(out)
    smax = torch.zeros(b, h, dtype=torch.float64)
    for row in range(b):
        n = int(lens[row])
        if n == 0:
            continue
        kc = k[block_tables[row].long()].reshape(-1, kvh, d)[:n].double()
        vc = v[block_tables[row].long()].reshape(-1, kvh, d)[:n].double()
        kc, vc = kc.repeat_interleave(g, dim=1), vc.repeat_interleave(g, dim=1)  # head h uses kv h // G
        s = torch.einsum("hd,nhd->hn", q[row, 0].double(), kc) * scaling
        p = torch.softmax(s, dim=-1)
        out[row] = torch.einsum("hn,nhd->hd", p, vc)
        pv_abs[row] = torch.einsum("hn,nhd->hd", p, vc.abs())
        smax[row] = s.abs().amax(dim=-1)
    return out, pv_abs, smax


def visible_for(lens, width):
    """The decode visibility of the reference: key j visible iff j < seq_lens[b] ([B, 1, 1, 1, S])."""
    key = torch.arange(width)
    return (key[None, :] < lens[:, None]).view(len(lens), 1, 1, 1, width)


def reference_bound(x, pv_abs, smax, ref, g_round):
    """Per-element bound on |got - paged_attention_reference| (see the module doc); ``g_round``: the bound factor
    of got's own rounding (2**-7 interpreter truncation, 2**-8 round-to-nearest)."""
    eps = 2.0 ** -8 * smax[:, :, None]
    ref_err = (torch.expm1(2 * eps) + 2.0 ** -9) * pv_abs + 2.0 ** -8 * ref.abs()
    return ref_err + g_round * x.abs() + 1e-5


def check(got, q, k, v, block_tables, lens, scaling, g_round):
    b, _, h, d = q.shape
    assert got.shape == (b, 1, h * d) and got.dtype == q.dtype and got.is_contiguous()
    got = got.view(b, h, d).double()
    x, pv_abs, smax = exact(q, k, v, block_tables, lens, scaling)
    active = lens > 0
    assert torch.isfinite(got).all()
    # 1. against the fp64 evaluation: one rounding of the output
    assert ((got - x).abs() <= g_round * x.abs() + 1e-5).all(), (got - x).abs().max()
    # 2. inactive rows (seq_lens 0) are zeros
    assert (got[~active] == 0).all()
    # 3. against the eager-path reference with the per-row visibility (active rows: the reference gives an
    #    inactive row the mean of every value, not zeros)
    if torch.isfinite(k).all():
        ref = paged_attention_reference(q, k, v, block_tables, visible_for(lens, block_tables.shape[1] * PAGE),
                                        scaling).view(b, h, d).double()
        bound = reference_bound(x, pv_abs, smax, ref, g_round)
        diff = (got - ref).abs()
        assert (diff[active] <= bound[active]).all(), (diff - bound)[active].max()


# ------------------------------------------------------------------------------------------- CPU (always run)

@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 64), (8, 2, 128), (16, 4, 64), (16, 2, 128)])
def test_cpu_op_matches_fp64_and_the_reference(heads, kv_heads, head_dim):
    q, k, v, bt, lens = make_case(heads, kv_heads, head_dim, seed=heads + head_dim)
    scaling = head_dim ** -0.5
    check(paged_decode_attention(q, k, v, bt, lens, scaling), q, k, v, bt, lens, scaling, 2.0 ** -8)


def test_cpu_op_never_lets_keys_past_seq_lens_reach_the_output():
    q, k, v, bt, lens = make_case(8, 2, 64, poison=True)
    got = paged_decode_attention(q, k, v, bt, lens, 0.125)
    check(got, q, k, v, bt, lens, 0.125, 2.0 ** -8)


def test_op_declaration():
    effects = op_effects(paged_decode_attention)
    assert effects["name"] == "flare::paged_decode_attention"
    assert effects["reads"] == ["q", "k_pool", "v_pool", "block_tables", "seq_lens"] and effects["writes"] == []
    with pytest.raises(ValueError, match="one query token"):
        paged_decode_attention_reference(torch.zeros(1, 2, 4, 64, dtype=torch.bfloat16),
                                         *make_case(4, 2, 64, seq_lens=(3,))[1:], 0.125)


def _backend_step(backend, t, seq_lens, seed=0):
    """One layer step through ``backend`` on a fresh cache: rows' contexts prefilled with random K/V, then ``t``
    new tokens per row ending at position seq_len - 1 (the last row inactive)."""
    gen = torch.Generator().manual_seed(seed)
    h, kvh, d = backend.num_heads, backend.num_kv_heads, backend.head_dim
    b = len(seq_lens)
    cache = PagedKVCache.allocate(1, b * WIDTH, PAGE, kvh, d, max_context=WIDTH * PAGE)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    block_tables = torch.arange(b * WIDTH, dtype=torch.int32).flip(0).view(b, WIDTH)
    lens = torch.tensor(seq_lens)
    active = torch.tensor([True] * (b - 1) + [False])
    positions = (lens[:, None] - t + torch.arange(t)[None, :]).clamp(min=0)
    valid = positions < lens[:, None]
    slots = slot_mapping_for(block_tables, positions, valid, PAGE)
    batch = AttentionBatch.build(cache, positions, slots, block_tables, lens, active)
    q = torch.randn(b, t, h, d, generator=gen).to(torch.bfloat16)
    k = torch.randn(b, t, kvh, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(b, t, kvh, d, generator=gen).to(torch.bfloat16)
    return backend(0, q, k, v, batch), batch, q


def test_attention_batch_seq_lens_is_the_decode_visibility():
    _, batch, _ = _backend_step(PyTorchPagedAttention(8, 2, 64, 0.125), 1, (5, 40, 128, 9))
    assert batch.seq_lens.dtype == torch.int64
    assert torch.equal(batch.seq_lens, batch.visible[:, 0, 0, 0, :].sum(-1))
    assert batch.seq_lens[-1] == 0  # inactive
    legacy = AttentionBatch(batch.cache, batch.slots, batch.block_tables, batch.visible, batch.valid, batch.active)
    assert torch.equal(legacy.decode_lens(), batch.seq_lens)


def test_triton_backend_decode_and_declared_prefill_path():
    """CPU: decode goes through flare::paged_decode_attention (its CPU implementation), T > 1 through
    flare::paged_attention -- bit-identical to the "pytorch" backend there."""
    lens = (5, 40, 128, 9)
    for t in (1, 3):
        got, batch, q = _backend_step(TritonPagedAttention(8, 2, 64, 0.125), t, lens, seed=t)
        want, _, _ = _backend_step(PyTorchPagedAttention(8, 2, 64, 0.125), t, lens, seed=t)
        if t > 1:
            assert torch.equal(got, want)
            continue
        # the new K/V were written (the cache after the step), then the new op read seq_lens keys of it
        expect = paged_decode_attention_reference(q, batch.cache.k[0], batch.cache.v[0], batch.block_tables,
                                                  batch.seq_lens, 0.125)
        assert torch.equal(got, expect)
        assert (got[-1] == 0).all()  # inactive row
        diff = (got.float() - want.float()).abs()[:-1]
        assert diff.max() < 0.05  # the eager-path rounding (bounded precisely in the op tests above)


# ---------------------------------------------------------------------------------- interpreter (Triton kernel)

CASES = [(4, 2, 64), (8, 2, 128), (8, 2, 64), (16, 2, 128)]  # GQA groups 2, 4, 4, 8; head_dim 64 and 128


@interpreter
@pytest.mark.parametrize("heads,kv_heads,head_dim", CASES)
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_triton_decode_kernel_matches_fp64_and_the_reference(heads, kv_heads, head_dim, num_splits):
    from ignition.components.triton_kernels import paged_decode_attention_triton, paged_decode_num_splits

    if num_splits is None:  # the static choice: > 1 here (5 rows x 2 KV heads, 8 pages)
        assert paged_decode_num_splits(len(SEQ_LENS), kv_heads, WIDTH) > 1
    q, k, v, bt, lens = make_case(heads, kv_heads, head_dim, seed=heads * head_dim)
    scaling = 1.0 / math.sqrt(head_dim)
    got = paged_decode_attention_triton(q, k, v, bt, lens, scaling, num_splits=num_splits)
    check(got, q, k, v, bt, lens, scaling, 2.0 ** -7)
    # and against the op's CPU implementation (same numerics): both within one rounding of the fp64 value
    cpu = paged_decode_attention(q, k, v, bt, lens, scaling).double()
    x = exact(q, k, v, bt, lens, scaling)[0].reshape(cpu.shape)
    assert ((got.double() - cpu).abs() <= (2.0 ** -7 + 2.0 ** -8) * x.abs() + 2e-5).all()


@interpreter
def test_triton_decode_kernel_reads_only_seq_lens_keys():
    """Every slot past seq_lens (page tails, unused pages, the sink) is NaN: the output stays finite and exact."""
    from ignition.components.triton_kernels import paged_decode_attention_triton

    q, k, v, bt, lens = make_case(8, 2, 64, poison=True, seed=7)
    for splits in (None, 5):
        got = paged_decode_attention_triton(q, k, v, bt, lens, 0.125, num_splits=splits)
        check(got, q, k, v, bt, lens, 0.125, 2.0 ** -7)


@interpreter
def test_triton_decode_kernel_workspace_and_more_splits_than_pages():
    from ignition.components.triton_kernels import paged_decode_attention_triton

    q, k, v, bt, lens = make_case(8, 4, 64, seq_lens=(1, 33, 0), seed=3)
    splits = WIDTH  # row 0 has 1 page: 7 splits empty; row 2 none
    ws = (torch.full((3, 4, splits, 2), float("nan")), torch.full((3, 4, splits, 2), float("nan")),
          torch.full((3, 4, splits, 2, 64), float("nan")))
    got = paged_decode_attention_triton(q, k, v, bt, lens, 0.125, num_splits=splits, workspace=ws)
    check(got, q, k, v, bt, lens, 0.125, 2.0 ** -7)
