"""``flare::fused_linear`` on CPU: the canonical modules' numerics bit for bit, and opaque under torch.compile
(no Triton needed; the Triton kernel is tested against this path in ``test_triton_kernels.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from ignition.components.custom_ops import op_effects
from ignition.components.fused_linear import fused_linear, fused_linear_reference

EPS = 1e-6


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


def _modules(k: int, n_out: int, gated: bool, seed: int):
    torch.manual_seed(seed)
    norm = Qwen3RMSNorm(k, eps=EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k) + 0.5)
    projs = [nn.Linear(k, n_out, bias=False) for _ in range(2 if gated else 1)]
    return norm.to(torch.bfloat16), [p.to(torch.bfloat16) for p in projs]


@pytest.mark.parametrize("lead,k,n_out", [((1,), 64, 96), ((3,), 256, 128), ((2, 4), 128, 1000), ((1, 1), 1024, 64)])
@pytest.mark.parametrize("norm,gated,residual", [(False, False, False), (True, False, False), (False, True, False),
                                                 (False, False, True), (True, True, False), (True, True, True)])
def test_cpu_path_equals_the_canonical_modules_bitwise(lead, k, n_out, norm, gated, residual):
    norm_mod, projs = _modules(k, n_out, gated, seed=k + n_out)
    x = (torch.randn(*lead, k) * 2).to(torch.bfloat16)
    r = torch.randn(*lead, n_out).to(torch.bfloat16) if residual else None
    with torch.no_grad():
        h = norm_mod(x) if norm else x
        y = F.silu(projs[0](h)) * projs[1](h) if gated else projs[0](h)  # Qwen3MLP before down_proj
        want = r + y if residual else y  # the decoder layer's skip connection
        weight = torch.cat([p.weight for p in projs]) if gated else projs[0].weight
        nw = norm_mod.weight if norm else None
        got = fused_linear(x, weight, nw, EPS, r, gated)
        ref = fused_linear_reference(x, weight, nw, EPS, r, gated)
    assert got.is_contiguous() and _bits_equal(got, want) and _bits_equal(ref, want)


@pytest.mark.parametrize("lead,k,n_out,residual", [((1,), 64, 96, True), ((4,), 256, 128, False), ((2, 3), 128, 64, True)])
def test_gated_input_equals_the_canonical_mlp_bitwise(lead, k, n_out, residual):
    """``gated_input``: x is gate/up's packed output and the op is Qwen3MLP's ``down_proj(act_fn(gate) * up)``
    (plus the skip connection)."""
    _, (down,) = _modules(k, n_out, False, seed=k)
    gate_up = (torch.randn(*lead, 2 * k) * 2).to(torch.bfloat16)
    r = torch.randn(*lead, n_out).to(torch.bfloat16) if residual else None
    with torch.no_grad():
        y = down(F.silu(gate_up[..., :k]) * gate_up[..., k:])
        want = r + y if residual else y
        got = fused_linear(gate_up, down.weight, None, EPS, r, False, True)
    assert _bits_equal(got, want)
    with pytest.raises(ValueError, match="2 \\* K"):
        fused_linear(gate_up[..., 1:], down.weight, None, EPS, r, False, True)


def test_compiled_equals_eager_bitwise():
    norm_mod, projs = _modules(256, 192, True, seed=1)
    weight = torch.cat([p.weight for p in projs]).detach()
    nw = norm_mod.weight.detach()

    def step(x, r):  # the op between ordinary ops that Inductor does fuse
        y = fused_linear(x * 1.5, weight, nw, EPS, r, True)
        return y + 1.0

    x = (torch.randn(2, 3, 256) * 2).to(torch.bfloat16)
    r = torch.randn(2, 3, 192).to(torch.bfloat16)
    eager = step(x, r)
    compiled = torch.compile(step, fullgraph=True, backend="inductor")(x, r)
    assert _bits_equal(eager, compiled)


def test_op_declares_no_writes_and_rejects_an_odd_gated_weight():
    eff = op_effects(torch.ops.flare.fused_linear)
    assert eff["writes"] == [] and eff["reads"][:2] == ["x", "weight"]
    with pytest.raises(ValueError):
        fused_linear(torch.ones(1, 8, dtype=torch.bfloat16), torch.ones(3, 8, dtype=torch.bfloat16), None, 0.0,
                     None, True)


@pytest.mark.parametrize("rows", [8, 16])
def test_tensor_core_switch_routes_only_plain_input_projections(monkeypatch, rows):
    """The tensor-core variant (default; ``FLARE_GEMV_DOT=0`` turns it off) at 2..16 rows (beyond the narrow few-row
    rule): a wide MLP (1100-column output) runs gate/up and the SiLU gate as separate modules (with
    ``FLARE_GEMM_ROWS_GATED=0``, or a gate/up below ``GEMM_ROWS_GATED_MIN_ELEMENTS``; else gate/up is one gated
    launch after the norm) and down + residual as one ``flare::fused_linear`` with a plain input -- never down's
    gated-input prologue, never a norm prologue (a qkv projection's norm runs apart, the projection as one launch)
    -- with the canonical result, bit for bit."""
    from ignition.components import fused_linear as fl
    from ignition.components.norms import RMSNorm
    from ignition.components.projections import BF16, PackedProjection, UnquantizedProjection

    hidden, inter = 1100, 16
    torch.manual_seed(rows)
    norm = RMSNorm(nn.Parameter((torch.rand(hidden) + 0.5).to(torch.bfloat16), requires_grad=False), EPS)
    gate_up = PackedProjection(hidden, [inter, inter], BF16)
    down = UnquantizedProjection(inter, hidden)
    with torch.no_grad():
        gate_up.plain_weight().copy_(torch.randn(2 * inter, hidden) / hidden ** 0.5)
        down.weight.copy_(torch.randn(hidden, inter) / inter ** 0.5)
    x = torch.randn(rows, hidden).to(torch.bfloat16)
    calls, real = [], fl.fused_linear

    def counting(x, weight, norm_weight, eps, residual, gated, gated_input=False, early=False, **kw):
        calls.append((norm_weight is not None, residual is not None, gated, gated_input))
        return real(x, weight, norm_weight, eps, residual, gated, gated_input, early, **kw)

    monkeypatch.setattr(fl, "fused_linear", counting)
    run = lambda: fl.gated_mlp_block(x, gate_up, down, norm=norm, residual=x, act_fn=F.silu, act_name="silu")  # noqa
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED", "0")
    monkeypatch.setenv("FLARE_GEMV_DOT", "0")
    with torch.no_grad():
        plain = run()
        assert calls == []  # cuBLAS and separate modules with the switch off
        monkeypatch.delenv("FLARE_GEMV_DOT")
        got = run()
    assert calls == [(False, True, False, False)]  # down + residual, plain input
    with torch.no_grad():
        h = norm(x)
        gate, up = gate_up(h)
        want = x + down(F.silu(gate) * up)
    assert _bits_equal(plain, want) and _bits_equal(got, want)
    monkeypatch.delenv("FLARE_GEMM_ROWS_GATED")  # the default: this gate/up is below GEMM_ROWS_GATED_MIN_ELEMENTS
    calls.clear()
    with torch.no_grad():
        assert _bits_equal(run(), want)
    assert calls == [(False, True, False, False)]
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED_MIN_ELEMENTS", "0")  # then gate/up one gated launch after the norm
    calls.clear()
    with torch.no_grad():
        gated = run()
    assert calls == [(False, False, True, False), (False, True, False, False)]
    assert _bits_equal(gated, want)
    monkeypatch.delenv("FLARE_GEMM_ROWS_GATED_MIN_ELEMENTS")
    # a packed qkv-like projection behind the norm: the norm apart, the projection one launch on its output
    qkv = PackedProjection(hidden, [1024, 64, 64], BF16)
    with torch.no_grad():
        qkv.plain_weight().copy_(torch.randn(1152, hidden) / hidden ** 0.5)
        calls.clear()
        got = fl.linear_block(x, qkv, norm=norm)
        want = qkv(norm(x))
    assert calls == [(False, False, False, False)]
    assert len(got) == 3 and all(_bits_equal(g, w) for g, w in zip(got, want))


def test_published_block_count_is_recorded_by_the_caller(monkeypatch):
    """``fused_linear_publish``'s ``parts`` is an argument, so a traced graph records it: the fake's statistics take
    it as given, and the caller's count (``_prenorm_parts``, on CUDA the tensor-core launch's programs along N) follows
    a ``FLARE_GEMV_CONFIG`` override keyed by the row count -- run 158's graph compiled under another environment met
    a launch of twice its blocks.  On the CPU the op sums squares over those blocks, the published ``xw`` unchanged."""
    pytest.importorskip("triton")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ignition.components.fused_linear import _published_norm, fused_linear_publish
    from ignition.components.kernels.linear import gemm_rows_parts

    assert gemm_rows_parts(4, 4096, 4096) == 4096 // 32  # the table's 32-column blocks
    monkeypatch.setenv("FLARE_GEMV_CONFIG", "4x4096x4096=16/512/4/4")
    assert gemm_rows_parts(4, 4096, 4096) == 4096 // 16 and gemm_rows_parts(8, 4096, 4096) == 4096 // 32
    monkeypatch.delenv("FLARE_GEMV_CONFIG")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 1, 64, generator=gen).to(torch.bfloat16)
    w = (torch.randn(48, 64, generator=gen) / 8).to(torch.bfloat16)
    r = torch.randn(4, 1, 48, generator=gen).to(torch.bfloat16)
    nw = (torch.rand(48, generator=gen) + 0.5).to(torch.bfloat16)
    with FakeTensorMode() as mode:
        out, xw, stats = torch.ops.flare.fused_linear_publish(*(mode.from_tensor(t) for t in (x, w, r, nw)), 7)
        assert (tuple(out.shape), tuple(xw.shape), tuple(stats.shape)) == ((4, 1, 48), (4, 1, 48), (4, 7))
    out, xw, stats = fused_linear_publish(x, w, r, nw, 3)
    assert torch.equal(out, fused_linear_reference(x, w, None, 0.0, r))
    want_xw, want = _published_norm(out, nw, 3)
    assert torch.equal(xw, want_xw) and torch.equal(stats, want) and stats.shape == (4, 3)
    blocks = out.double().view(4, 3, 16)
    assert torch.allclose(stats.double(), (blocks * blocks).sum(dim=-1), rtol=2.0 ** -20, atol=0.0)


def test_head_logits_block_off_cuda_and_its_op_are_the_masked_widened_head():
    """The step's head (``head_logits_block``): off CUDA the canonical head widened, inactive rows zero, whatever
    ``out`` (the caller stores it); ``flare::fused_linear_logits_``'s CPU path writes the reference so into ``out``
    and checks ``active``."""
    from ignition.components.fused_linear import fused_linear_logits_, head_block, head_logits_block
    from ignition.components.norms import RMSNorm
    from ignition.components.projections import UnquantizedProjection

    hidden, vocab = 96, 300
    torch.manual_seed(3)
    norm = RMSNorm(nn.Parameter((torch.rand(hidden) + 0.5).to(torch.bfloat16), requires_grad=False), EPS)
    head = UnquantizedProjection(hidden, vocab)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden) / hidden ** 0.5)
    x = torch.randn(2, hidden).to(torch.bfloat16)
    active = torch.tensor([True, False])
    want = head.forward(norm(x)).float()
    want[1] = 0.0
    out = torch.full((2, vocab), 7.0)
    got = head_logits_block(x, head, norm, active, out)
    assert got is not out and torch.equal(got, want) and torch.equal(head_block(x, head, norm).float()[0], want[0])
    assert (out == 7.0).all()
    ref = fused_linear_reference(x, head.plain_weight(), norm.weight, EPS, None, False).float()
    ref[1] = 0.0
    assert fused_linear_logits_(x, head.plain_weight(), norm.weight, EPS, active, out) is None
    assert torch.equal(out, ref)
    with pytest.raises(ValueError, match="active must be a"):
        fused_linear_logits_(x, head.plain_weight(), norm.weight, EPS, active.int(), out)
