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
