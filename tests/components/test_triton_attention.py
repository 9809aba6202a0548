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

from ignition.components.attention import (AttentionBatch, PagedKVCache, PyTorchPagedAttention,
                                           TritonDecodePagedAttention, TritonPagedAttention,
                                           TritonUnfusedPagedAttention, paged_attention_reference,
                                           paged_decode_attention, paged_decode_attention_reference, slot_mapping_for,
                                           step_needs_visible)
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
    q, k, v, block_tables = random_pools(len(seq_lens), 1, heads, kv_heads, head_dim, PAGE, WIDTH, 5, seed)
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    if poison:
        poison_past_seq_lens(k, v, block_tables, lens)
    return q, k, v, block_tables, lens


def random_pools(b, t, heads, kv_heads, head_dim, page, width, spare, seed):
    """``q [b, t, H, D]`` and pools of ``b * width + spare`` pages (+ the sink), bf16 normal; block tables: a
    shuffled, scattered choice of ``width`` pages per row."""
    gen = torch.Generator().manual_seed(seed)
    pages = b * width + spare
    shape = (pages + 1, page, kv_heads, head_dim)
    k = torch.randn(shape, generator=gen).to(torch.bfloat16)
    v = torch.randn(shape, generator=gen).to(torch.bfloat16)
    q = torch.randn((b, t, heads, head_dim), generator=gen).to(torch.bfloat16)
    block_tables = torch.randperm(pages, generator=gen)[:b * width].view(b, width).to(torch.int32)
    return q, k, v, block_tables


def poison_past_seq_lens(k, v, block_tables, lens):
    """NaN in every pool slot no row may read: unallocated pages, the sink, each row's slots at or past seq_lens."""
    page = k.shape[1]
    used = torch.zeros(k.shape[:2], dtype=torch.bool)
    for row in range(block_tables.shape[0]):
        for j in range(int(lens[row])):
            used[block_tables[row, j // page], j % page] = True
    k[~used], v[~used] = float("nan"), float("nan")


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


def _backend_step(backend, t, seq_lens, seed=0, with_visible=True):
    """One layer step through ``backend`` on a fresh cache: rows' contexts prefilled with random K/V, then ``t``
    new tokens per row ending at position seq_len - 1 (the last row inactive); ``with_visible``: the batch's."""
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
    batch = AttentionBatch.build(cache, positions, slots, block_tables, lens, active, with_visible=with_visible)
    q = torch.randn(b, t, h, d, generator=gen).to(torch.bfloat16)
    k = torch.randn(b, t, kvh, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(b, t, kvh, d, generator=gen).to(torch.bfloat16)
    return backend(0, q, k, v, batch), batch, q


@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("backend_cls", [PyTorchPagedAttention, TritonPagedAttention, TritonDecodePagedAttention,
                                         TritonUnfusedPagedAttention])
def test_step_needs_visible_exactly_where_a_backend_reads_it(backend_cls, t, monkeypatch):
    """A batch built without ``visible`` serves a backend at ``t`` tokens per row -- the same output bytes as with
    it, every other tensor of the batch the same -- exactly where :func:`step_needs_visible` says the mask is not
    needed; where it says needed, the step without the mask raises, naming it (the mask is read: no silent
    fallback).  ``FLARE_BATCH_VISIBLE=1`` asks for it everywhere."""
    backend = backend_cls(8, 2, 64, 0.125)
    lens = (5, 40, 128, 9)
    out, full, _ = _backend_step(backend, t, lens)
    assert full.visible is not None
    needed = step_needs_visible([backend], t)
    if needed:
        with pytest.raises(ValueError, match="visible"):
            _backend_step(backend, t, lens, with_visible=False)
    else:
        bare_out, bare, _ = _backend_step(backend, t, lens, with_visible=False)
        assert bare.visible is None
        for name in ("slots", "valid", "active", "seq_lens", "positions", "block_tables"):
            assert torch.equal(getattr(bare, name), getattr(full, name)), name
        assert torch.equal(bare_out, out)
    monkeypatch.setenv("FLARE_BATCH_VISIBLE", "1")
    assert step_needs_visible([backend], t)
    monkeypatch.setenv("FLARE_BATCH_VISIBLE", "0")
    assert step_needs_visible([backend], t) == needed
    assert step_needs_visible([object(), backend], t)  # a backend that does not say is assumed to read it


def test_attention_batch_seq_lens_is_the_decode_visibility():
    _, batch, _ = _backend_step(PyTorchPagedAttention(8, 2, 64, 0.125), 1, (5, 40, 128, 9))
    assert batch.seq_lens.dtype == torch.int64
    assert torch.equal(batch.seq_lens, batch.visible[:, 0, 0, 0, :].sum(-1))
    assert batch.seq_lens[-1] == 0  # inactive
    legacy = AttentionBatch(batch.cache, batch.slots, batch.block_tables, batch.visible, batch.valid, batch.active)
    assert torch.equal(legacy.decode_lens(), batch.seq_lens)
    real = batch.valid & batch.active[:, None]
    assert torch.equal(batch.query_positions(), batch.positions)
    assert torch.equal(legacy.query_positions()[real], batch.positions[real])  # recovered from visible


@pytest.mark.parametrize("view", ["1", "0"])
@pytest.mark.parametrize("t", [1, 3])
def test_last_valid_is_each_rows_last_real_token(monkeypatch, t, view):
    """The head's rows: each row's last real token (position 0 for a row with none, the inactive last row), by
    indexing each row apart -- at one token per row a view of ``hidden`` (``FLARE_HEAD_VIEW`` on), else a gather."""
    monkeypatch.setenv("FLARE_HEAD_VIEW", view)
    _, batch, _ = _backend_step(PyTorchPagedAttention(8, 2, 64, 0.125), t, (1, 40, 2, 9))
    hidden = torch.randn(4, t, 16)
    want = []
    for r in range(4):
        real = [i for i in range(t) if batch.valid[r, i]]
        want.append(hidden[r, real[-1] if real else 0])
    got = batch.last_valid(hidden)
    assert torch.equal(got, torch.stack(want))
    assert (got.untyped_storage().data_ptr() == hidden.untyped_storage().data_ptr()) == (t == 1 and view == "1")


def test_triton_backend_decode_and_declared_prefill_path():
    """CPU: decode goes through flare::paged_decode_attention (its CPU implementation), T > 1 through
    flare::paged_prefill_attention (its CPU implementation, close to the "pytorch" backend)."""
    lens = (5, 40, 128, 9)
    for t in (1, 3):
        got, batch, q = _backend_step(TritonPagedAttention(8, 2, 64, 0.125), t, lens, seed=t)
        want, _, _ = _backend_step(PyTorchPagedAttention(8, 2, 64, 0.125), t, lens, seed=t)
        if t > 1:  # bounded precisely in the prefill tests below
            assert (got[-1] == 0).all()  # inactive row
            assert (got.float() - want.float()).abs()[:-1].max() < 0.05
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
    from ignition.components.kernels.decode_plan import paged_decode_num_splits
    from ignition.components.kernels.paged_decode import paged_decode_attention_triton

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
    from ignition.components.kernels.paged_decode import paged_decode_attention_triton

    q, k, v, bt, lens = make_case(8, 2, 64, poison=True, seed=7)
    for splits in (None, 5):
        got = paged_decode_attention_triton(q, k, v, bt, lens, 0.125, num_splits=splits)
        check(got, q, k, v, bt, lens, 0.125, 2.0 ** -7)


@interpreter
def test_triton_decode_kernel_workspace_and_more_splits_than_pages():
    from ignition.components.kernels.paged_decode import paged_decode_attention_triton

    q, k, v, bt, lens = make_case(8, 4, 64, seq_lens=(1, 33, 0), seed=3)
    splits = WIDTH  # row 0 has 1 page: 7 splits empty; row 2 none
    ws = (torch.full((3, 4, splits, 2), float("nan")), torch.full((3, 4, splits, 2), float("nan")),
          torch.full((3, 4, splits, 2, 64), float("nan")))
    got = paged_decode_attention_triton(q, k, v, bt, lens, 0.125, num_splits=splits, workspace=ws)
    check(got, q, k, v, bt, lens, 0.125, 2.0 ** -7)


# ------------------------------------------------------------------ prefill / verify: flare::paged_prefill_attention
#
# Tolerances (derived).  Let x be the exact (fp64) attention of the bf16 inputs for a real query, p_j its
# probabilities and pv = sum_j p_j |v_j|.  Both the op's CPU implementation and the kernel compute fp32 scores
# and softmax (errors ~1e-6 relative), round the unnormalized probabilities e_j to bf16 before P @ V while
# normalizing by the fp32 sum of e_j (error <= u * pv), and round the output once (<= u |x|); u = 2**-8 for
# round-to-nearest (CPU, GPU), 2**-7 for the interpreter, which truncates fp32 -> bf16.  Hence
#   |cpu - x| <= 2**-8 (pv + |x|) + 1e-5,   |kernel - x| <= 2**-7 (pv + |x|) + 1e-5,
# and against the eager-path reference ``paged_attention_reference``: its error (``reference_bound``'s ref_err,
# see the module doc) plus the CPU implementation's own 2**-8 (pv + |x|).

PF_WIDTH = 8  # block-table width in the prefill cases


def make_prefill_case(heads, kv_heads, head_dim, page, rows, t, seed=0, poison=True):
    """``rows``: per row ``(context, new)``: ``context`` keys already cached, ``new`` tokens in this chunk at
    positions context .. context + new - 1 (seq_lens = context + new); ``new == 0``: an inactive row (seq_lens 0,
    garbage positions).  Padding queries (i >= new) get positions past seq_lens.  Shuffled, scattered pages; with
    ``poison`` every slot at or past a row's seq_lens (page tails, unused pages, the sink) is NaN."""
    q, k, v, bt = random_pools(len(rows), t, heads, kv_heads, head_dim, page, PF_WIDTH, 3, seed)
    lens = torch.tensor([c + n if n else 0 for c, n in rows], dtype=torch.int64)
    positions = torch.stack([torch.arange(t) + c if n else torch.full((t,), 10 ** 6) for c, n in rows])
    assert int(lens.max()) <= PF_WIDTH * page
    if poison:
        poison_past_seq_lens(k, v, bt, lens)
    valid = positions < lens[:, None]
    return q, k, v, bt, positions, lens, valid


def prefill_exact(q, k, v, bt, positions, lens):
    """fp64: (x [B, T, H, D], pv [B, T, H, D], max_j |s_j| [B, T, H]) for real queries (zeros elsewhere)."""
    b, t, h, d = q.shape
    kvh = k.shape[-2]
    g = h // kvh
    x = torch.zeros(b, t, h, d, dtype=torch.float64)
    pv = torch.zeros_like(x)
    smax = torch.zeros(b, t, h, dtype=torch.float64)
    scaling = d ** -0.5
    for row in range(b):
        n = int(lens[row])
        if n == 0:
            continue
        kc = k[bt[row].long()].reshape(-1, kvh, d)[:n].double().repeat_interleave(g, dim=1)
        vc = v[bt[row].long()].reshape(-1, kvh, d)[:n].double().repeat_interleave(g, dim=1)
        for i in range(t):
            pos = int(positions[row, i])
            if pos >= n:
                continue
            s = torch.einsum("hd,nhd->hn", q[row, i].double(), kc[:pos + 1]) * scaling
            p = torch.softmax(s, dim=-1)
            x[row, i] = torch.einsum("hn,nhd->hd", p, vc[:pos + 1])
            pv[row, i] = torch.einsum("hn,nhd->hd", p, vc[:pos + 1].abs())
            smax[row, i] = s.abs().amax(dim=-1)
    return x, pv, smax


def check_prefill(got, case, u):
    q, k, v, bt, positions, lens, valid = case
    b, t, h, d = q.shape
    assert got.shape == (b, t, h * d) and got.dtype == q.dtype and got.is_contiguous()
    got = got.view(b, t, h, d).double()
    assert torch.isfinite(got).all()  # padding queries too; nothing past seq_lens (NaN) reached the output
    assert (got[lens == 0] == 0).all()  # inactive rows
    x, pv, _ = prefill_exact(q, k, v, bt, positions, lens)
    err = (got - x).abs()[valid]
    bound = (u * (pv + x.abs()) + 1e-5)[valid]
    assert (err <= bound).all(), (err - bound).max()


PF_ROWS = [(5, 11), (0, 20), (0, 0), (13, 1)]  # chunk after context; full chunk from 0; inactive; verify-like


def test_prefill_cpu_op_matches_fp64_and_the_eager_reference():
    """CPU (no Triton): the op's CPU implementation against fp64 and against ``paged_attention_reference`` with the
    AttentionBatch visibility (real queries of active rows)."""
    from ignition.components.attention import paged_prefill_attention

    for heads, kvh, d, page in [(4, 2, 32, 4), (6, 2, 16, 8), (8, 8, 32, 4)]:
        case = make_prefill_case(heads, kvh, d, page, PF_ROWS, 20, seed=heads + d, poison=False)
        q, k, v, bt, positions, lens, valid = case
        scaling = d ** -0.5
        got = paged_prefill_attention(q, k, v, bt, positions, lens, scaling)
        check_prefill(got, case, 2.0 ** -8)
        active = lens > 0
        batch = AttentionBatch.build(PagedKVCache(k[None], v[None], page, PF_WIDTH), positions,
                                     slot_mapping_for(bt, positions, valid, page), bt, lens, active)
        ref = paged_attention_reference(q, k, v, bt, batch.visible, scaling).view(q.shape).double()
        x, pv, smax = prefill_exact(q, k, v, bt, positions, lens)
        eps = 2.0 ** -8 * smax[..., None]
        bound = ((torch.expm1(2 * eps) + 2.0 ** -9) * pv + 2.0 ** -8 * ref.abs()  # the eager path's own error
                 + 2.0 ** -8 * (pv + x.abs()) + 1e-5)  # the CPU implementation's
        diff = (got.view(q.shape).double() - ref).abs()
        assert (diff[valid] <= bound[valid]).all(), (diff - bound)[valid].max()
        # poisoned slots past seq_lens never reach any output (real or padding queries)
        poisoned = make_prefill_case(heads, kvh, d, page, PF_ROWS, 20, seed=heads + d, poison=True)
        assert torch.equal(paged_prefill_attention(*poisoned[:6], scaling), got)


def test_prefill_op_declaration():
    from ignition.components.attention import paged_prefill_attention

    effects = op_effects(paged_prefill_attention)
    assert effects["name"] == "flare::paged_prefill_attention"
    assert effects["reads"] == ["q", "k_pool", "v_pool", "block_tables", "positions", "seq_lens"]
    assert effects["writes"] == []


def test_triton_backend_prefill_uses_the_prefill_op():
    """CPU: T > 1 writes the chunk's K/V, then calls flare::paged_prefill_attention with the batch's positions
    (recovered from the visibility) and seq_lens -- identical to the op on the written cache for real queries."""
    from ignition.components.attention import paged_prefill_attention_reference

    lens = (5, 40, 128, 9)
    t = 4
    got, batch, q = _backend_step(TritonPagedAttention(8, 2, 64, 0.125), t, lens, seed=11)
    positions = (torch.tensor(lens)[:, None] - t + torch.arange(t)[None, :]).clamp(min=0)
    want = paged_prefill_attention_reference(q, batch.cache.k[0], batch.cache.v[0], batch.block_tables,
                                             positions, batch.seq_lens, 0.125)
    real = batch.valid
    assert torch.equal(got[real], want[real])
    assert (got[~batch.active] == 0).all()


PF_KERNEL_CASES = [  # heads, kv_heads, head_dim, page, config (None: paged_prefill_config)
    (4, 2, 16, 4, {"BLOCK_M": 16, "BLOCK_N": 16}),  # several query and key blocks, 4 pages per key block
    (4, 2, 32, 8, None),  # the static config (one 64-row query block, one key block of 64)
    (6, 2, 16, 4, {"BLOCK_M": 32, "BLOCK_N": 16}),  # G = 3: packed rows straddle query blocks
    (4, 4, 32, 8, {"BLOCK_M": 16, "BLOCK_N": 8}),  # MHA, one page per key block (interpreter only: < 16)
]


@interpreter
@pytest.mark.parametrize("heads,kv_heads,head_dim,page,config", PF_KERNEL_CASES)
def test_triton_prefill_kernel_matches_fp64_and_the_cpu_op(heads, kv_heads, head_dim, page, config):
    from ignition.components.attention import paged_prefill_attention_reference
    from ignition.components.kernels.prefill_attention import paged_prefill_attention_triton

    case = make_prefill_case(heads, kv_heads, head_dim, page, PF_ROWS, 20, seed=heads * head_dim + page)
    q, k, v, bt, positions, lens, valid = case
    scaling = head_dim ** -0.5
    got = paged_prefill_attention_triton(q, k, v, bt, positions, lens, scaling, config=config)
    check_prefill(got, case, 2.0 ** -7)  # NaN-poisoned pools: a read past seq_lens would show
    cpu = paged_prefill_attention_reference(q, k, v, bt, positions, lens, scaling).view(q.shape).double()
    x, pv, _ = prefill_exact(q, k, v, bt, positions, lens)
    diff = (got.view(q.shape).double() - cpu).abs()
    bound = (2.0 ** -7 + 2.0 ** -8) * (pv + x.abs()) + 2e-5
    assert (diff[valid] <= bound[valid]).all(), (diff - bound)[valid].max()
    # deterministic: the same call gives the same bits
    assert torch.equal(paged_prefill_attention_triton(q, k, v, bt, positions, lens, scaling, config=config), got)


@interpreter
def test_triton_prefill_kernel_stops_at_the_context():
    """A block table much wider than the context, every slot past seq_lens NaN: short rows, a two-token verify
    round after 28 keys and an inactive row stay finite and exact -- a V row past seq_lens entering a tile would
    make the output NaN (0 * NaN in P @ V).  (That the loop also skips key blocks past the tile's largest position
    is by construction of its bound; the interpreter does not time it.)"""
    from ignition.components.kernels.prefill_attention import paged_prefill_attention_triton

    case = make_prefill_case(4, 2, 16, 4, [(0, 3), (28, 2), (0, 0)], 3, seed=5)
    got = paged_prefill_attention_triton(*case[:6], 0.25, config={"BLOCK_M": 16, "BLOCK_N": 16})
    check_prefill(got, case, 2.0 ** -7)
