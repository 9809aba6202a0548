"""``flare::rope_decode_attention_``: a decode step's norms, rotary, K/V write and attention as one op.

- CPU (everywhere): the op against independent references -- transformers' ``Qwen3RMSNorm`` /
  ``apply_rotary_pos_emb`` and an ``index_put_`` write (the pools, bit for bit), then an fp64 evaluation of the
  attention over those pools (within the decode kernel's derived bound, ``test_triton_attention.check``).
- Interpreter (``TRITON_INTERPRET=1``, CPU machines with Triton): the fused kernel against the two-kernel path
  (``rope_write_triton``, then ``paged_decode_attention_triton``) -- output and pools bit for bit (the interpreter
  sums in NumPy's order whatever the tile shape; on the GPU the two may differ by ulps, bounded there) -- and the
  fp64 bound.
- The H200 half is ``test_components_gpu.py`` (same comparisons, compiled).

Cases follow a decode step: each active row's new token sits at position ``seq_lens - 1`` of its block table, an
inactive row (seq_lens 0) writes to the sink; pools hold random old values everywhere (the new slot too, so a read
before the write shows), NaN where no row may read.
"""

from __future__ import annotations

import pytest
import torch

from ignition.components.attention import AttentionBatch, PagedKVCache
from ignition.components.custom_ops import op_effects
from ignition.components.decode_attention import rope_decode_attention_, rope_decode_attention_reference
from test_triton_attention import _HAVE_TRITON, interpreter  # sets TRITON_INTERPRET before triton is imported

if _HAVE_TRITON:  # (imported after test_triton_attention: its interpreter switch precedes Triton's)
    import triton
    import triton.language as tl

    from ignition.components.kernels.paged_decode import _decode_p_pieces

    @triton.jit
    def _p_pieces_kernel(P, O1, O2, O3, N: tl.constexpr):
        """``_decode_p_pieces`` of an fp32 vector, stored (module level: Triton resolves helpers from its globals)."""
        offs = tl.arange(0, N)
        p1, p2, p3 = _decode_p_pieces(tl.load(P + offs))
        tl.store(O1 + offs, p1)
        tl.store(O2 + offs, p2)
        tl.store(O3 + offs, p3)

EPS = 1e-6
PAGE = 16
WIDTH = 6  # block-table width: 96 keys
SEQ_LENS = (1, 17, 96, 40, 0)  # ragged, full width, an inactive row


def make_decode_case(heads, kv_heads, d, seq_lens=SEQ_LENS, *, norms=True, page=PAGE, width=WIDTH, seed=0):
    """``[q, k, v, q_norm, k_norm, cos, sin, k_pool, v_pool, slots, block_tables, seq_lens]`` of one decode step
    (see the module docstring); q/k/v are views of a packed QKV output."""
    from test_triton_attention import poison_past_seq_lens

    gen = torch.Generator().manual_seed(seed)
    b = len(seq_lens)
    qkv = (torch.randn(b, 1, (heads + 2 * kv_heads) * d, generator=gen) * 3).to(torch.bfloat16)
    q, k, v = (x.view(b, 1, -1, d) for x in qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1))
    qw = (torch.rand(d, generator=gen) + 0.5).to(torch.bfloat16) if norms else None
    kw = (torch.rand(d, generator=gen) + 0.5).to(torch.bfloat16) if norms else None
    pages = b * width + 3
    k_pool = torch.randn((pages + 1, page, kv_heads, d), generator=gen).to(torch.bfloat16)
    v_pool = torch.randn((pages + 1, page, kv_heads, d), generator=gen).to(torch.bfloat16)
    bt = torch.randperm(pages, generator=gen)[:b * width].view(b, width).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    poison_past_seq_lens(k_pool, v_pool, bt, lens)
    pos = (lens - 1).clamp(min=0)
    slots = bt[torch.arange(b), pos // page].long() * page + pos % page
    slots = torch.where(lens > 0, slots, torch.full_like(slots, pages * page))  # inactive: the sink
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2).float() / d))
    ang = pos[:, None, None].float() * inv
    emb = torch.cat((ang, ang), dim=-1)  # [B, 1, D]
    return [q, k, v, qw, kw, emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16), k_pool, v_pool, slots, bt,
            lens]


def _bits(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def check_against_canonical(got, k_pool, v_pool, case, scaling, g_round):
    """Pools: transformers' norm + rotary + index_put_ write, bit for bit; output: the decode bound against fp64
    over those pools with the canonical rotated queries (``test_triton_attention.check``)."""
    from test_rope_write import canonical
    from test_triton_attention import check

    q, k, v, qw, kw, cos, sin, kp0, vp0, slots, bt, lens = case
    q_rot, want_k, want_v = canonical(q, k, v, qw, kw, cos, sin, kp0, vp0, slots)
    assert _bits(k_pool, want_k) and _bits(v_pool, want_v)
    check(got, q_rot, want_k, want_v, bt, lens, scaling, g_round)


@pytest.mark.parametrize("heads,kv_heads,d,norms", [(4, 2, 16, True), (8, 2, 32, False), (32, 8, 128, True)])
def test_cpu_path_equals_the_canonical_modules_and_fp64(heads, kv_heads, d, norms):
    case = make_decode_case(heads, kv_heads, d, norms=norms, seed=heads + d)
    run = [x.clone() if isinstance(x, torch.Tensor) else x for x in case]
    got = rope_decode_attention_(*run[:5], EPS, *run[5:], d ** -0.5)
    assert got.shape == (len(SEQ_LENS), 1, heads * d) and got.is_contiguous()
    assert (got[-1] == 0).all()  # the inactive row
    check_against_canonical(got, run[7], run[8], case, d ** -0.5, 2.0 ** -8)


def test_op_declares_the_pools_it_writes_and_rejects_bad_shapes():
    assert op_effects(torch.ops.flare.rope_decode_attention_)["writes"] == ["k_pool", "v_pool"]
    case = make_decode_case(4, 2, 16)
    with pytest.raises(ValueError, match="seq_lens"):
        rope_decode_attention_reference(*case[:5], EPS, *case[5:11], case[11][:2], 0.25)
    two = [x.expand(-1, 2, -1, -1) if i < 3 else x for i, x in enumerate(case[:3])]
    with pytest.raises(ValueError, match="one query token"):
        rope_decode_attention_reference(*two, *case[3:5], EPS, case[5].expand(-1, 2, -1), case[6].expand(-1, 2, -1),
                                        *case[7:9], torch.cat([case[9], case[9]]), *case[10:], 0.25)
    with pytest.raises(ValueError, match="slots"):
        rope_decode_attention_reference(*case[:5], EPS, *case[5:9], case[9][:1], *case[10:], 0.25)


def test_backends_route_decode_through_the_op_and_agree():
    """"triton" runs a decode step through the fused op, "triton-unfused" through rope_write_ + decode attention:
    on CPU both are the references' composition, so equal bit for bit; "torch" keeps its own (eager) numerics."""
    from ignition.components.attention import TritonPagedAttention, TritonUnfusedPagedAttention

    q, k, v, qw, kw, cos, sin, kp, vp, slots, bt, lens = make_decode_case(8, 2, 32, seed=5)
    outs, pools = [], []
    for cls in (TritonPagedAttention, TritonUnfusedPagedAttention):
        cache = PagedKVCache(kp.clone()[None], vp.clone()[None], PAGE, WIDTH)
        batch = AttentionBatch.build(cache, (lens - 1).clamp(min=0)[:, None], torch.where(
            lens > 0, slots, torch.full_like(slots, -1))[:, None], bt, lens, lens > 0)
        assert torch.equal(batch.slots, slots)
        outs.append(cls(8, 2, 32, 32 ** -0.5).rope_attend(0, q, k, v, qw, kw, EPS, cos, sin, batch))
        pools.append((cache.k, cache.v))
    assert _bits(outs[0], outs[1]) and _bits(pools[0][0], pools[1][0]) and _bits(pools[0][1], pools[1][1])


# ---------------------------------------------------------------------------------- interpreter (the fused kernel)

def fused_vs_two_kernels(case, scaling, num_splits, block_n=None):
    """Run the fused kernel and the two-kernel path on copies of ``case`` with the same split count (``None``: the
    fused kernel's default) and keys per block: ``(fused out, pools), (two-kernel out, pools)`` (device of the
    case)."""
    from ignition.components.kernels import decode_plan
    from ignition.components.kernels.fused_decode import rope_decode_attention_triton
    from ignition.components.kernels.paged_decode import paged_decode_attention_triton
    from ignition.components.kernels.rope_write import rope_write_triton

    q, k, v, qw, kw, cos, sin, kp, vp, slots, bt, lens = case
    block_n = decode_plan.decode_block_n(kp.shape[1], block_n)  # the fused kernel's, for both (the sum order)
    if num_splits is None:  # the fused kernel's own choice, for both paths (the split count sets the sum order)
        num_splits = decode_plan._decode_geometry("test", q, kp, vp, bt, None, fused=True, block_n=block_n)["SPLITS"]
    kp1, vp1, kp2, vp2 = kp.clone(), vp.clone(), kp.clone(), vp.clone()
    fused = rope_decode_attention_triton(q, k, v, qw, kw, EPS, cos, sin, kp1, vp1, slots, bt, lens, scaling,
                                         num_splits=num_splits, block_n=block_n)
    q_rot = rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp2, vp2, slots)
    two = paged_decode_attention_triton(q_rot, kp2, vp2, bt, lens, scaling, num_splits=num_splits, block_n=block_n)
    return (fused, kp1, vp1), (two, kp2, vp2)


def assert_same_bits(a, b):
    for x, y in zip(a, b):
        assert _bits(x.cpu(), y.cpu()), "fused and two-kernel paths differ"


@interpreter
@pytest.mark.parametrize("heads,kv_heads,d,norms", [(8, 2, 32, True), (4, 4, 16, False), (16, 2, 64, True)])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_fused_kernel_equals_the_two_kernels_bitwise_and_fp64(heads, kv_heads, d, norms, num_splits):
    from ignition.components.kernels import decode_plan, rope_write

    case = make_decode_case(heads, kv_heads, d, norms=norms, seed=heads * d + (num_splits or 0))
    if num_splits is None:
        assert decode_plan.fused_decode_num_splits(len(SEQ_LENS), kv_heads, heads // kv_heads, WIDTH) > 1
    (got, kp, vp), two = fused_vs_two_kernels(case, d ** -0.5, num_splits)
    assert_same_bits((got, kp, vp), two)
    # (the rope half is rope_write_triton's bits: test_triton_kernels.py bounds those against transformers)
    # the attention half: within the decode bound of fp64 over the pools the kernel wrote
    from test_triton_attention import check

    q, k, v, qw, kw, cos, sin, kp0, vp0, slots, bt, lens = case
    q_rot = rope_write.rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp0.clone(), vp0.clone(), slots)
    check(got, q_rot, kp, vp, bt, lens, d ** -0.5, 2.0 ** -7)


@interpreter
@pytest.mark.parametrize("level,pages", [("1", "0"), ("2", "0"), ("0", "1"), ("1", "1")])
@pytest.mark.parametrize("heads,kv_heads,d,norms,num_splits", [(8, 2, 32, True, None), (4, 4, 16, False, 3),
                                                               (16, 2, 64, True, 1)])
def test_earlier_loads_equal_the_two_kernels_bitwise(monkeypatch, level, pages, heads, kv_heads, d, norms, num_splits):
    """``FLARE_DECODE_V_FIRST=1`` / ``2`` (:data:`decode_plan.DECODE_V_FIRST`: the writer loads the new value and the
    key norm's weights with the key, or all three with the query rows) and ``FLARE_DECODE_PAGES_FIRST=1``
    (:data:`decode_plan.DECODE_PAGES_FIRST`: the first key block's page ids with the query rows; the plain key loop,
    the interpreter's) -- the two-kernel path's bits, output and pools alike; a bad level names the switch; the page
    ids stay where they were for the pipelined loop and the new key apart."""
    from ignition.components.kernels import decode_plan

    monkeypatch.setenv("FLARE_DECODE_V_FIRST", level)
    monkeypatch.setenv("FLARE_DECODE_PAGES_FIRST", pages)
    assert decode_plan.decode_v_first() == int(level)
    assert decode_plan.decode_pages_first(False, False) == (pages == "1")
    assert not decode_plan.decode_pages_first(True, False) and not decode_plan.decode_pages_first(False, True)
    case = make_decode_case(heads, kv_heads, d, norms=norms, seed=3 * heads + d)
    assert_same_bits(*fused_vs_two_kernels(case, d ** -0.5, num_splits))
    monkeypatch.setenv("FLARE_DECODE_V_FIRST", "3")
    with pytest.raises(ValueError, match="FLARE_DECODE_V_FIRST=3"):
        decode_plan.decode_v_first()


@interpreter
@pytest.mark.parametrize("block_n", [32, 64])
@pytest.mark.parametrize("num_splits", [None, 2])
def test_blocks_of_several_pages_equal_the_two_kernels_bitwise_and_fp64(block_n, num_splits):
    """Key blocks that gather several pages (one page id per key; the last block partly past the table width):
    the fused kernel equals the two-kernel path at the same block size, within the fp64 bound."""
    from ignition.components.kernels import rope_write
    from test_triton_attention import check

    case = make_decode_case(8, 2, 32, seed=block_n + (num_splits or 0))
    (got, kp, vp), two = fused_vs_two_kernels(case, 32 ** -0.5, num_splits, block_n)
    assert_same_bits((got, kp, vp), two)
    q, k, v, qw, kw, cos, sin, kp0, vp0, slots, bt, lens = case
    q_rot = rope_write.rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp0.clone(), vp0.clone(), slots)
    check(got, q_rot, kp, vp, bt, lens, 32 ** -0.5, 2.0 ** -7)


@interpreter
@pytest.mark.parametrize("heads,kv_heads,seq_lens,num_splits,block_n", [
    (8, 2, SEQ_LENS, None, None), (8, 2, (1, 17, 96, 40, 0), 3, None), (8, 2, (5, 80), 1, None),
    (16, 4, (90,), None, 64), (8, 2, (33, 64), 2, 32)])
def test_new_key_apart_writes_the_same_pools_and_stays_within_fp64(monkeypatch, heads, kv_heads, seq_lens,
                                                                   num_splits, block_n):
    """``FLARE_DECODE_NEW_KEY_APART=1``: the new key's partial from a program of its own -- the pools bit for bit
    the two-kernel path's (the same write), the output within the decode bound of fp64 over them (its sums group
    otherwise), zeros for an inactive row, and the same bits launch after launch; ragged rows, a row of one key, one
    split, blocks of several pages."""
    from ignition.components.kernels import rope_write
    from test_triton_attention import check

    case = make_decode_case(heads, kv_heads, 32, seq_lens, seed=heads + len(seq_lens) + (num_splits or 0))
    monkeypatch.setenv("FLARE_DECODE_NEW_KEY_APART", "1")
    (got, kp, vp), (two, kp2, vp2) = fused_vs_two_kernels(case, 32 ** -0.5, num_splits, block_n)
    assert _bits(kp, kp2) and _bits(vp, vp2)
    q, k, v, qw, kw, cos, sin, kp0, vp0, slots, bt, lens = case
    q_rot = rope_write.rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp0.clone(), vp0.clone(), slots)
    check(got, q_rot, kp, vp, bt, lens, 32 ** -0.5, 2.0 ** -7)
    assert (got[lens == 0] == 0).all()
    (again, _, _), _ = fused_vs_two_kernels(case, 32 ** -0.5, num_splits, block_n)
    assert _bits(got, again)
    monkeypatch.setenv("FLARE_DECODE_NEW_KEY_APART", "0")
    (plain, _, _), _ = fused_vs_two_kernels(case, 32 ** -0.5, num_splits, block_n)
    assert _bits(plain, two)  # off: the two-kernel path's bits, as every other test here checks


@interpreter
@pytest.mark.parametrize("apart", [False, True])
@pytest.mark.parametrize("heads,kv_heads,seq_lens,num_splits,block_n", [
    (8, 2, SEQ_LENS, None, None), (8, 2, (1, 17, 96, 40, 0), 3, None), (16, 4, (90,), None, 64),
    (8, 2, (33, 64), 2, 32), (4, 4, (5, 80), 2, None)])
def test_combine_in_kernel_writes_no_reduce_and_stays_within_fp64(monkeypatch, heads, kv_heads, seq_lens, num_splits,
                                                                  block_n, apart):
    """``FLARE_DECODE_COMBINE_ROWS=8``: the group's last program combines the splits (no reduce launch) -- the
    pools bit for bit the two-kernel path's, the output within the decode bound of fp64 and within a few ulps of the
    reduce kernel's (the same weights, the sums in another order), zeros for an inactive row, the same bits launch
    after launch, and the device's counts back at zero; also with the new key's partial apart, one group size 1."""
    from ignition.components.kernels import fused_decode, launch, paged_decode, rope_write
    from test_triton_attention import check

    launched = []
    reduce_kernel = paged_decode._paged_decode_reduce_kernel
    monkeypatch.setattr(fused_decode, "_paged_decode_reduce_kernel", _Recording(reduce_kernel, launched))
    case = make_decode_case(heads, kv_heads, 32, seq_lens, seed=3 * heads + len(seq_lens) + (num_splits or 0))
    monkeypatch.setenv("FLARE_DECODE_NEW_KEY_APART", "1" if apart else "0")
    monkeypatch.setenv("FLARE_DECODE_COMBINE_ROWS", str(len(seq_lens) - 1))  # fewer rows than the launch: off
    (reduced, _, _), _ = fused_vs_two_kernels(case, 32 ** -0.5, num_splits, block_n)
    assert launched, "the reduce kernel runs without the switch"
    launched.clear()
    monkeypatch.setenv("FLARE_DECODE_COMBINE_ROWS", "8")
    (got, kp, vp), (two, kp2, vp2) = fused_vs_two_kernels(case, 32 ** -0.5, num_splits, block_n)
    assert not launched, "the reduce kernel launched though the fused kernel combines"
    assert _bits(kp, kp2) and _bits(vp, vp2)
    q, k, v, qw, kw, cos, sin, kp0, vp0, slots, bt, lens = case
    q_rot = rope_write.rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp0.clone(), vp0.clone(), slots)
    check(got, q_rot, kp, vp, bt, lens, 32 ** -0.5, 2.0 ** -7)
    assert (got[lens == 0] == 0).all()
    torch.testing.assert_close(got.float(), reduced.float(), rtol=2.0 ** -6, atol=2.0 ** -12)
    counts = fused_decode._COMBINE_COUNTS[launch.device_key(got.device)]
    assert counts.numel() >= len(seq_lens) * kv_heads and not counts.any()
    (again, _, _), _ = fused_vs_two_kernels(case, 32 ** -0.5, num_splits, block_n)
    assert _bits(got, again) and not counts.any()


class _Recording:
    """A kernel whose launches (``kernel[grid](...)``) are recorded in ``launched`` and then run."""

    def __init__(self, kernel, launched):
        self.kernel, self.launched = kernel, launched

    def __getitem__(self, grid):
        self.launched.append(grid)
        return self.kernel[grid]


@interpreter
def test_p_pieces_sum_to_the_fp32_probabilities_exactly():
    """``_decode_p_pieces`` (``FLARE_DECODE_PV_SPLIT``): three bf16 pieces whose sum is each fp32 probability exactly
    (fp64 sums), over probabilities from 2^-60 to 1, 0 and 1 themselves; and no piece is redundant -- the first two
    alone miss some."""
    gen = torch.Generator().manual_seed(3)
    n = 4096
    prob = torch.exp2(-60 * torch.rand(n, generator=gen, dtype=torch.float64)).float()
    prob[:2] = torch.tensor([0.0, 1.0])
    out = [torch.empty(n, dtype=torch.bfloat16) for _ in range(3)]
    _p_pieces_kernel[(1,)](prob, *out, N=n)
    p1, p2, p3 = (o.double() for o in out)
    assert torch.equal(p1 + p2 + p3, prob.double())
    assert not torch.equal(p1 + p2, prob.double())


@interpreter
@pytest.mark.parametrize("heads,kv_heads,seq_lens,num_splits,block_n", [
    (8, 2, SEQ_LENS, None, None), (16, 4, (90,), None, 64), (8, 2, (33, 64), 2, 32)])
def test_pv_split_equals_the_two_kernels_bitwise_and_fp64(monkeypatch, heads, kv_heads, seq_lens, num_splits,
                                                           block_n):
    """``FLARE_DECODE_PV_SPLIT=1`` (P V from P's bf16 pieces) in both decode kernels: the fused kernel the two-kernel
    path's bits, the pools unchanged by it, the output within the decode bound of fp64, zeros for an inactive row."""
    from ignition.components.kernels import decode_plan, rope_write
    from test_triton_attention import check

    case = make_decode_case(heads, kv_heads, 32, seq_lens, seed=7 * heads + len(seq_lens))
    monkeypatch.setenv("FLARE_DECODE_PV_SPLIT", "1")
    assert decode_plan.decode_pv_split()
    (got, kp, vp), two = fused_vs_two_kernels(case, 32 ** -0.5, num_splits, block_n)
    assert_same_bits((got, kp, vp), two)
    q, k, v, qw, kw, cos, sin, kp0, vp0, slots, bt, lens = case
    q_rot = rope_write.rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp0.clone(), vp0.clone(), slots)
    check(got, q_rot, kp, vp, bt, lens, 32 ** -0.5, 2.0 ** -7)
    assert (got[lens == 0] == 0).all()
    monkeypatch.setenv("FLARE_DECODE_PV_SPLIT", "0")
    (_, kp2, vp2), _ = fused_vs_two_kernels(case, 32 ** -0.5, num_splits, block_n)
    assert _bits(kp2, kp) and _bits(vp2, vp)


def test_fused_decode_split_cap_switch(monkeypatch):
    pytest.importorskip("triton")
    from ignition.components.kernels import decode_plan

    # 544 programs over 8 KV heads would be 68 splits: capped
    assert decode_plan.fused_decode_num_splits(1, 8, 2, 256) == decode_plan.FUSED_DECODE_MAX_SPLITS == 64
    monkeypatch.setenv("FLARE_DECODE_MAX_SPLITS", "32")
    assert decode_plan.fused_decode_num_splits(1, 8, 2, 256) == 32
    monkeypatch.setenv("FLARE_DECODE_MAX_SPLITS", "64")
    assert decode_plan.fused_decode_num_splits(1, 8, 2, 256) == 64  # G=2 allows 64
    assert decode_plan.fused_decode_num_splits(1, 8, 4, 256) == 32  # G=4: the reduce kernel's 128 / GP rows
    assert decode_plan.fused_decode_num_splits(4, 8, 2, 256) == 17
    assert decode_plan.fused_decode_num_splits(1, 8, 2, 40) == 40


def test_pv_split_default_per_launch_and_forced(monkeypatch):
    """``FLARE_DECODE_PV_SPLIT`` unset: the pieces for every launch but the wide one-row launch (measured slower
    there); ``1`` / ``0`` force it for every launch."""
    pytest.importorskip("triton")
    from ignition.components.kernels import decode_plan

    monkeypatch.delenv("FLARE_DECODE_PV_SPLIT", raising=False)
    assert decode_plan.decode_pv_split() is decode_plan.DECODE_PV_SPLIT is True
    assert decode_plan.decode_pv_split(wide=True) is False
    monkeypatch.setenv("FLARE_DECODE_PV_SPLIT", "1")
    assert decode_plan.decode_pv_split() and decode_plan.decode_pv_split(wide=True)
    monkeypatch.setenv("FLARE_DECODE_PV_SPLIT", "0")
    assert not decode_plan.decode_pv_split() and not decode_plan.decode_pv_split(wide=True)


def test_fused_decode_programs_and_register_cap_switches(monkeypatch):
    """``FLARE_DECODE_PROGRAMS`` sets the programs the split count aims for (the group and table caps still hold);
    ``FLARE_DECODE_MAXNREG`` a register cap of the launch (none by default, none in the interpreter); bad values name
    the switch."""
    pytest.importorskip("triton")
    from ignition.components.kernels import decode_plan

    assert decode_plan.FUSED_DECODE_PROGRAMS == 544
    assert decode_plan.fused_decode_num_splits(4, 8, 4, 256) == 17  # 544 / 32 rounded up
    monkeypatch.setenv("FLARE_DECODE_PROGRAMS", "1024")
    assert decode_plan.fused_decode_num_splits(4, 8, 4, 256) == 32
    assert decode_plan.fused_decode_num_splits(4, 8, 2, 256) == 32
    assert decode_plan.fused_decode_num_splits(1, 8, 4, 256) == 32  # G=4: the reduce kernel's 128 / GP rows
    monkeypatch.setenv("FLARE_DECODE_PROGRAMS", "768")
    assert decode_plan.fused_decode_num_splits(4, 8, 4, 256) == 24
    for bad in ("0", "2.5", "many"):
        monkeypatch.setenv("FLARE_DECODE_PROGRAMS", bad)
        with pytest.raises(ValueError, match="FLARE_DECODE_PROGRAMS"):
            decode_plan.fused_decode_num_splits(4, 8, 4, 256)
    monkeypatch.delenv("FLARE_DECODE_PROGRAMS")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert decode_plan.fused_decode_launch_options() == {"num_warps": 4}
    assert decode_plan.DECODE_ONE_ROW_WARPS == 8  # one row, not the wide launch: 8 warps (run 167)
    assert [decode_plan.fused_decode_launch_options(rows, wide)["num_warps"]
            for rows, wide in ((1, False), (1, True), (2, False), (4, False))] == [8, 4, 4, 4]
    monkeypatch.setenv("FLARE_DECODE_MAXNREG", "64")
    assert decode_plan.fused_decode_launch_options() == {"num_warps": 4, "maxnreg": 64}
    monkeypatch.setenv("FLARE_DECODE_WARPS", "8")
    monkeypatch.setenv("FLARE_DECODE_SMEM_KB", "120")
    monkeypatch.setenv("FLARE_DECODE_TRIGGER", "1")
    assert decode_plan.fused_decode_launch_options() == {"num_warps": 8, "maxnreg": 64, "SMEM_PAD": 120 << 10,
                                                         "TRIGGER": 1}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # no register cap or padding in the interpreter
    assert decode_plan.fused_decode_launch_options() == {"num_warps": 8}
    for name, bads in (("FLARE_DECODE_MAXNREG", ("16", "300", "-1", "x")), ("FLARE_DECODE_WARPS", ("3", "32", "0")),
                       ("FLARE_DECODE_SMEM_KB", ("228", "-1", "1.5")), ("FLARE_DECODE_TRIGGER", ("3", "-1"))):
        for bad in bads:
            monkeypatch.setenv(name, bad)
            with pytest.raises(ValueError, match=name):
                decode_plan.fused_decode_launch_options()
        monkeypatch.delenv(name)


def test_decode_pipeline_rule_by_rows(monkeypatch):
    """The compiled decode key loop is software-pipelined from ``DECODE_PIPELINE_MIN_ROWS`` rows (two: one row takes the
    plain loop, run 165) and for the three-launch path's row-blind call, never for the wide one-row launch;
    ``FLARE_DECODE_PIPELINE`` forces either way for the others;
    the interpreter always runs the plain loop."""
    pytest.importorskip("triton")
    from ignition.components.kernels import decode_plan

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("FLARE_DECODE_PIPELINE", raising=False)
    assert decode_plan.DECODE_PIPELINE_MIN_ROWS == 2
    assert [decode_plan.decode_pipelined(rows) for rows in (1, 2, 4, 64)] == [False, True, True, True]
    assert decode_plan.decode_pipelined() is True
    monkeypatch.setenv("FLARE_DECODE_PIPELINE", "1")
    assert decode_plan.decode_pipelined(1) and decode_plan.decode_pipelined(4)
    assert not decode_plan.decode_pipelined(1, wide=True)  # the wide launch: the plain loop, forced or not
    monkeypatch.setenv("FLARE_DECODE_PIPELINE", "0")
    assert not any(decode_plan.decode_pipelined(rows) for rows in (1, 4, None))
    monkeypatch.setenv("FLARE_DECODE_PIPELINE", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not decode_plan.decode_pipelined(4)


def test_reduce_prefetch_switch_and_arguments(monkeypatch):
    """``FLARE_DECODE_REDUCE_PREFETCH_MB``: 0 by default, MiB as bytes, a negative size names the switch; the reduce
    launch's prefetch arguments: none without a weight, for 0 bytes or in the interpreter, and a weight off CUDA is
    refused (the kernel's line arithmetic runs in the GPU test)."""
    pytest.importorskip("triton")
    from ignition.components.kernels import fused_decode
    from ignition.components.decode_attention import decode_reduce_prefetch_bytes

    monkeypatch.delenv("FLARE_DECODE_REDUCE_PREFETCH_MB", raising=False)
    assert decode_reduce_prefetch_bytes() == 0
    monkeypatch.setenv("FLARE_DECODE_REDUCE_PREFETCH_MB", "12")
    assert decode_reduce_prefetch_bytes() == 12 << 20
    monkeypatch.setenv("FLARE_DECODE_REDUCE_PREFETCH_MB", "-1")
    with pytest.raises(ValueError, match="FLARE_DECODE_REDUCE_PREFETCH_MB"):
        decode_reduce_prefetch_bytes()
    weight = torch.zeros(64, 64, dtype=torch.bfloat16)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fused_decode._reduce_prefetch_args(None) == {}
    assert fused_decode._reduce_prefetch_args((weight, 1 << 20)) == {}
    monkeypatch.delenv("TRITON_INTERPRET")
    assert fused_decode._reduce_prefetch_args((weight, 0)) == {}
    with pytest.raises(ValueError, match="contiguous CUDA tensor on a 128-byte line"):
        fused_decode._reduce_prefetch_args((weight, 1 << 20))


def test_kv_prefetch_rows_switch(monkeypatch):
    """The pre-wait K/V prefetch: batch 1 by default, up to ``FLARE_DECODE_KV_PREFETCH_ROWS`` rows when set (0: none),
    ``FLARE_DECODE_KV_PREFETCH=0`` off whatever the rows; a bad row count names the switch."""
    pytest.importorskip("triton")
    from ignition.components.kernels import decode_plan

    keys = decode_plan.DECODE_KV_PREFETCH_KEYS
    assert [decode_plan.decode_kv_prefetch_keys(b) for b in (1, 2, 4)] == [keys, 0, 0]
    monkeypatch.setenv("FLARE_DECODE_KV_PREFETCH_ROWS", "4")
    assert [decode_plan.decode_kv_prefetch_keys(b) for b in (1, 4, 8)] == [keys, keys, 0]
    monkeypatch.setenv("FLARE_DECODE_KV_PREFETCH", "0")
    assert decode_plan.decode_kv_prefetch_keys(1) == 0
    monkeypatch.delenv("FLARE_DECODE_KV_PREFETCH")
    monkeypatch.setenv("FLARE_DECODE_KV_PREFETCH_ROWS", "0")
    assert decode_plan.decode_kv_prefetch_keys(1) == 0
    for bad in ("-1", "1.5", "four"):
        monkeypatch.setenv("FLARE_DECODE_KV_PREFETCH_ROWS", bad)
        with pytest.raises(ValueError, match="FLARE_DECODE_KV_PREFETCH_ROWS"):
            decode_plan.decode_kv_prefetch_keys(1)


def test_kv_prefetch_needs_a_long_enough_stream_before_it(monkeypatch):
    """Behind a QKV projection below ``DECODE_KV_PREFETCH_MIN_BYTES`` (default 0: any, Qwen3-0.6B's 8 MiB too) the
    decode kernel does not prefetch; unknown (None) leaves it to the rows; ``FLARE_DECODE_KV_PREFETCH_MIN_MB`` moves
    the bound (24: the previous one, Qwen3-8B's 48 MiB yes, Qwen3-0.6B's 8 no), a negative or non-numeric value names
    the switch."""
    pytest.importorskip("triton")
    from ignition.components.kernels import decode_plan

    keys, mib = decode_plan.DECODE_KV_PREFETCH_KEYS, 1 << 20
    assert decode_plan.DECODE_KV_PREFETCH_MIN_BYTES == 0
    assert [decode_plan.decode_kv_prefetch_keys(1, n * mib) for n in (0, 8, 48)] == [keys, keys, keys]
    assert decode_plan.decode_kv_prefetch_keys(1, None) == keys
    assert decode_plan.decode_kv_prefetch_keys(4, 48 * mib) == 0
    monkeypatch.setenv("FLARE_DECODE_KV_PREFETCH_MIN_MB", "24")
    assert [decode_plan.decode_kv_prefetch_keys(1, n * mib) for n in (8, 23, 24, 48)] == [0, 0, keys, keys]
    monkeypatch.setenv("FLARE_DECODE_KV_PREFETCH_MIN_MB", "64")
    assert decode_plan.decode_kv_prefetch_keys(1, 48 * mib) == 0
    for bad in ("-1", "lots"):
        monkeypatch.setenv("FLARE_DECODE_KV_PREFETCH_MIN_MB", bad)
        with pytest.raises(ValueError, match="FLARE_DECODE_KV_PREFETCH_MIN_MB"):
            decode_plan.decode_kv_prefetch_keys(1, 8 * mib)


def test_early_reduce_rows_switch(monkeypatch):
    """The reduce kernel lets the output projection launch before its own wait at one row by default, up to
    ``FLARE_PDL_EARLY_ROWS`` rows when set, up to 4 behind a QKV stream of at least 24 MiB
    (``FLARE_PDL_EARLY_LARGE_ROWS`` / ``_MIN_MB``), never with ``FLARE_PDL_EARLY=0``; a bad value names the switch."""
    pytest.importorskip("triton")
    from ignition.components.kernels import launch

    assert [launch.pdl_early_enabled(b) for b in (1, 2, 4)] == [True, False, False]
    monkeypatch.setenv("FLARE_PDL_EARLY_ROWS", "4")
    assert [launch.pdl_early_enabled(b) for b in (1, 4, 8)] == [True, True, False]
    monkeypatch.setenv("FLARE_PDL_EARLY", "0")
    assert not launch.pdl_early_enabled(1)
    monkeypatch.delenv("FLARE_PDL_EARLY")
    for bad in ("-1", "2.5", "many"):
        monkeypatch.setenv("FLARE_PDL_EARLY_ROWS", bad)
        with pytest.raises(ValueError, match="FLARE_PDL_EARLY_ROWS"):
            launch.pdl_early_enabled(1)
    monkeypatch.delenv("FLARE_PDL_EARLY_ROWS")
    # behind a large stream (the reduce's overlap_bytes: the QKV weight) FLARE_PDL_EARLY_LARGE_ROWS more rows
    mib = 1 << 20
    assert launch.PDL_EARLY_LARGE_ROWS == 4  # the default: Qwen3-8B's batch 4 (run 157)
    early = [launch.pdl_early_enabled(b, n * mib) for b, n in ((1, 8), (4, 8), (4, 23), (4, 24), (4, 48), (8, 48))]
    assert early == [True, False, False, True, True, False]
    assert not launch.pdl_early_enabled(4) and not launch.pdl_early_enabled(4, None)  # unknown stream: the rows decide
    monkeypatch.setenv("FLARE_PDL_EARLY_LARGE_MIN_MB", "64")
    assert not launch.pdl_early_enabled(4, 48 * mib)
    monkeypatch.setenv("FLARE_PDL_EARLY_LARGE_MIN_MB", "-1")
    with pytest.raises(ValueError, match="FLARE_PDL_EARLY_LARGE_MIN_MB"):
        launch.pdl_early_enabled(4, 48 * mib)
    monkeypatch.delenv("FLARE_PDL_EARLY_LARGE_MIN_MB")
    monkeypatch.setenv("FLARE_PDL_EARLY_LARGE_ROWS", "1")  # off: the rows alone decide
    assert not launch.pdl_early_enabled(4, 48 * mib)


def test_wide_blocks_rule(monkeypatch):
    """On by default (:data:`DECODE_WIDE`; ``FLARE_DECODE_WIDE=1`` too): one-row fused launches of groups up to 2
    heads take 32-key blocks (at least a page) and the plain loop, their splits capped at one wave of 2 programs per
    SM; more rows, larger groups, ``FLARE_DECODE_WIDE=0`` or an explicit ``FLARE_DECODE_BLOCK_N`` / ``block_n`` keep
    whole pages; the two-kernel path never widens."""
    pytest.importorskip("triton")
    from ignition.components.kernels import decode_plan

    assert decode_plan.DECODE_WIDE and decode_plan.fused_decode_wide(1, 2)
    monkeypatch.setenv("FLARE_DECODE_WIDE", "1")
    assert [decode_plan.fused_decode_wide(b, g) for b, g in ((1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (4, 1))] == [
        True, True, False, False, False, False]
    q, k, v, qw, kw, cos, sin, kp, vp, slots, bt, lens = make_decode_case(4, 2, 32, (40,), seed=3)

    def geo(**kw):
        return decode_plan._decode_geometry("test", q, kp, vp, bt, None, **kw)

    assert (geo(fused=True)["BLOCK_N"], geo(fused=True)["WIDE"]) == (32, True)
    assert geo(fused=True, block_n=16)["BLOCK_N"] == 16 and geo()["BLOCK_N"] == 16
    monkeypatch.setenv("FLARE_DECODE_BLOCK_N", "64")
    assert (geo(fused=True)["BLOCK_N"], geo(fused=True)["WIDE"]) == (64, False)
    monkeypatch.delenv("FLARE_DECODE_BLOCK_N")
    monkeypatch.setenv("FLARE_DECODE_WIDE", "0")
    assert (geo(fused=True)["BLOCK_N"], geo(fused=True)["WIDE"]) == (16, False)
    monkeypatch.setenv("FLARE_DECODE_WIDE", "1")
    big = [x.new_zeros(x.shape[0], 64, *x.shape[2:]) for x in (kp, vp)]  # 64-key pages: a block is at least a page
    assert decode_plan._decode_geometry("test", q, *big, bt, None, fused=True)["BLOCK_N"] == 64

    # larger groups at one row: 64-key blocks (fused_decode_one_row_blocks), at more rows 32-key blocks
    # (fused_decode_multi_row_blocks); FLARE_DECODE_ONE_ROW_BLOCKS=0 / FLARE_DECODE_MULTI_ROW_BLOCKS=0, an explicit
    # block_n or FLARE_DECODE_BLOCK_N, the two-kernel path: whole pages (or what was asked)
    for b, expect in ((1, 64), (2, 32), (4, 32)):
        q4, _, _, _, _, _, _, kp4, vp4, _, bt4, _ = make_decode_case(16, 4, 32, (40,) * b, seed=3)
        assert decode_plan._decode_geometry("test", q4, kp4, vp4, bt4, None, fused=True)["BLOCK_N"] == expect, b
        assert decode_plan._decode_geometry("test", q4, kp4, vp4, bt4, None)["BLOCK_N"] == 16, b
        monkeypatch.setenv("FLARE_DECODE_MULTI_ROW_BLOCKS", "0")
        geo = decode_plan._decode_geometry("test", q4, kp4, vp4, bt4, None, fused=True)
        assert geo["BLOCK_N"] == (64 if b == 1 else 16)
        monkeypatch.delenv("FLARE_DECODE_MULTI_ROW_BLOCKS")
    assert [decode_plan.fused_decode_one_row_blocks(b, g) for b, g in ((1, 4), (1, 8), (1, 2), (4, 4))] == [
        True, True, False, False]
    assert [decode_plan.fused_decode_multi_row_blocks(b, g) for b, g in ((1, 4), (4, 8), (4, 2), (4, 4), (2, 3))] == [
        False, True, False, True, True]
    q4, _, _, _, _, _, _, kp4, vp4, _, bt4, _ = make_decode_case(16, 4, 32, (40,), seed=3)
    assert decode_plan._decode_geometry("test", q4, kp4, vp4, bt4, None, fused=True, block_n=32)["BLOCK_N"] == 32
    assert decode_plan._decode_geometry("test", q4, kp4, vp4, bt4, None)["BLOCK_N"] == 16
    monkeypatch.setenv("FLARE_DECODE_BLOCK_N", "32")
    assert decode_plan._decode_geometry("test", q4, kp4, vp4, bt4, None, fused=True)["BLOCK_N"] == 32
    monkeypatch.delenv("FLARE_DECODE_BLOCK_N")
    monkeypatch.setenv("FLARE_DECODE_ONE_ROW_BLOCKS", "0")
    assert decode_plan._decode_geometry("test", q4, kp4, vp4, bt4, None, fused=True)["BLOCK_N"] == 16
    monkeypatch.delenv("FLARE_DECODE_ONE_ROW_BLOCKS")

    # Qwen3-0.6B's shape (16 heads, 8 KV heads) with a 4096-key table: 128 blocks of 32 keys would take the 64-split
    # cap (512 programs, two waves at 2 per SM); capped at one wave of the SMs the interpreter assumes (132)
    q, k, v, qw, kw, cos, sin, kp, vp, slots, bt, lens = make_decode_case(16, 8, 32, (40,), width=256, seed=3)
    wide = decode_plan._decode_geometry("test", q, kp, vp, bt, None, fused=True)
    assert wide["WIDE"] and wide["SPLITS"] * 8 <= 2 * decode_plan.DEFAULT_SMS < (wide["SPLITS"] + 1) * 8
    monkeypatch.setenv("FLARE_DECODE_WIDE_PER_SM", "4")  # a leaner kernel's wave (FLARE_DECODE_PV_SPLIT's registers)
    geo = decode_plan._decode_geometry("test", q, kp, vp, bt, None, fused=True)
    assert geo["SPLITS"] == min(64, 4 * decode_plan.DEFAULT_SMS // 8)
    monkeypatch.setenv("FLARE_DECODE_WIDE_PER_SM", "0")
    with pytest.raises(ValueError, match="FLARE_DECODE_WIDE_PER_SM"):
        decode_plan._decode_geometry("test", q, kp, vp, bt, None, fused=True)
    monkeypatch.delenv("FLARE_DECODE_WIDE_PER_SM")
    monkeypatch.setenv("FLARE_DECODE_NEW_KEY_APART", "1")  # the new key's own programs count in the wave
    apart = decode_plan._decode_geometry("test", q, kp, vp, bt, None, fused=True)
    assert (apart["SPLITS"] + 1) * 8 <= 2 * decode_plan.DEFAULT_SMS < (apart["SPLITS"] + 2) * 8
    monkeypatch.delenv("FLARE_DECODE_NEW_KEY_APART")
    # an explicit count stays
    assert decode_plan._decode_geometry("test", q, kp, vp, bt, 48, fused=True)["SPLITS"] == 48
    monkeypatch.setenv("FLARE_DECODE_WIDE", "0")
    assert decode_plan._decode_geometry("test", q, kp, vp, bt, None, fused=True)["SPLITS"] == 64


@interpreter
@pytest.mark.parametrize("heads,wide,block_n", [(8, True, 32), (16, False, 64)])
def test_one_row_launch_equals_the_two_kernels_bitwise_and_fp64(monkeypatch, heads, wide, block_n):
    """The one-row launches' own blocks -- the wide one of a 2-head group (``FLARE_DECODE_WIDE=1``: 32-key blocks,
    ``fused_decode_wide``), 64-key blocks for a 4-head group (``fused_decode_one_row_blocks``) -- equal the two-kernel
    path at those blocks bit for bit, within the fp64 bound."""
    from ignition.components.kernels import decode_plan, fused_decode, rope_write
    from test_triton_attention import check

    monkeypatch.setenv("FLARE_DECODE_WIDE", "1")
    case = make_decode_case(heads, 4, 32, (90,), seed=11)
    q, k, v, qw, kw, cos, sin, kp0, vp0, slots, bt, lens = case
    geo = decode_plan._decode_geometry("test", q, kp0, vp0, bt, None, fused=True)
    assert (geo["WIDE"], geo["BLOCK_N"]) == (wide, block_n)
    kp, vp = kp0.clone(), vp0.clone()
    got = fused_decode.rope_decode_attention_triton(q, k, v, qw, kw, EPS, cos, sin, kp, vp, slots, bt, lens, 32 ** -0.5)
    _, two = fused_vs_two_kernels(case, 32 ** -0.5, geo["SPLITS"], block_n)
    assert_same_bits((got, kp, vp), two)
    q_rot = rope_write.rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp0.clone(), vp0.clone(), slots)
    check(got, q_rot, kp, vp, bt, lens, 32 ** -0.5, 2.0 ** -7)


def test_decode_block_n_names_a_bad_value(monkeypatch):
    pytest.importorskip("triton")
    from ignition.components.kernels import decode_plan

    assert decode_plan.decode_block_n(16) == 16 and decode_plan.decode_block_n(8) == 16
    assert decode_plan.decode_block_n(32) == 32
    assert decode_plan.decode_block_n(16, 64) == 64
    for bad in (24, 8, 48):
        with pytest.raises(ValueError, match=f"block_n {bad}"):
            decode_plan.decode_block_n(16, bad)
    monkeypatch.setenv("FLARE_DECODE_BLOCK_N", "32")
    assert decode_plan.decode_block_n(16) == 32
    monkeypatch.setenv("FLARE_DECODE_BLOCK_N", "thirty")
    with pytest.raises(ValueError, match="FLARE_DECODE_BLOCK_N"):
        decode_plan.decode_block_n(16)


@interpreter
def test_fused_kernel_on_a_single_split_per_group_and_an_all_inactive_batch():
    case = make_decode_case(8, 2, 32, seq_lens=(0, 0), seed=11)
    (got, kp, vp), two = fused_vs_two_kernels(case, 0.2, None)
    assert_same_bits((got, kp, vp), two)
    assert (got == 0).all()
    case = make_decode_case(8, 2, 32, seq_lens=(5, 80), width=5, seed=12)
    assert_same_bits(*fused_vs_two_kernels(case, 0.2, 1))
    case = make_decode_case(8, 2, 32, seq_lens=(70,), seed=13)  # one row
    assert_same_bits(*fused_vs_two_kernels(case, 0.2, None))


def test_the_cases_are_decode_steps():
    """Each active row's slot is its position seq_lens - 1 through the block table; an inactive row's the sink."""
    q, k, v, qw, kw, cos, sin, kp, vp, slots, bt, lens = make_decode_case(4, 2, 16)
    for row, n in enumerate(lens.tolist()):
        want = int(bt[row, (n - 1) // PAGE]) * PAGE + (n - 1) % PAGE if n else (kp.shape[0] - 1) * PAGE
        assert int(slots[row]) == want


def fused_decode_plain_q_checks(heads, kv_heads, seq_lens, device, g_round):
    """The fused decode kernel's attention arithmetic against fp64 on ``device``: q passes the kernel's own norm and
    rotary unchanged (no q norm, the identity rotation: cos 1, sin 0 -- exact in fp32), so the fp64 evaluation over
    the pools the launch wrote is its output's reference (``test_triton_attention.check``: one rounding ``g_round``
    of the output, as the two-pass kernel is held to) -- for the default launch (the wide one-row blocks where they
    apply), the new key's own program (``FLARE_DECODE_NEW_KEY_APART=1``), P V the other way
    (``FLARE_DECODE_PV_SPLIT`` flipped) and the splits combined in the kernel (``FLARE_DECODE_COMBINE_ROWS``).  Returns
    the variants checked."""
    from test_triton_attention import check

    from ignition.components.kernels import decode_plan, fused_decode
    from ignition.components.switches import environment

    q, k, v, _, kw, cos, sin, kp, vp, slots, bt, lens = make_decode_case(heads, kv_heads, 128, seq_lens, width=80,
                                                                         seed=heads + len(seq_lens))
    ones, zeros = torch.ones_like(cos), torch.zeros_like(sin)
    on = [x.to(device) for x in (q, k, v, kw, ones, zeros, slots, bt, lens)]
    scaling = 128 ** -0.5
    pv = decode_plan.decode_pv_split(wide=decode_plan.fused_decode_wide(len(seq_lens), heads // kv_heads))
    variants = ({}, {"FLARE_DECODE_NEW_KEY_APART": "1"}, {"FLARE_DECODE_PV_SPLIT": "0" if pv else "1"},
                {"FLARE_DECODE_COMBINE_ROWS": str(len(seq_lens))})
    for env in variants:
        with environment(env):
            kp1, vp1 = kp.to(device).clone(), vp.to(device).clone()
            got = fused_decode.rope_decode_attention_triton(on[0], on[1], on[2], None, on[3], EPS, on[4], on[5], kp1,
                                                            vp1, on[6], on[7], on[8], scaling)
        check(got.cpu(), q, kp1.cpu(), vp1.cpu(), bt, lens, scaling, g_round)
    return variants


@interpreter
def test_fused_decode_plain_q_reference_in_the_interpreter():
    """:func:`fused_decode_plain_q_checks` in the interpreter (truncating: 2^-7), the CPU side of the GPU test."""
    assert len(fused_decode_plain_q_checks(8, 2, (40, 1, 17, 0), "cpu", 2.0 ** -7)) == 4
