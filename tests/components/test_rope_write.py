"""``flare::rope_write_``: q/k norms + rotary + paged K/V write as one op.

CPU: bit for bit the canonical modules (transformers' ``Qwen3RMSNorm`` and ``apply_rotary_pos_emb``, the
``index_put_`` write), on views of a packed QKV output.  The Triton kernel (interpreter:
``test_triton_kernels.py``; compiled: ``test_components_gpu.py``) is held to :func:`check_triton`: within a derived
bound of that reference, values copied exactly, no slot written but the step's own.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

from ignition.components.custom_ops import op_effects
from ignition.components.rope_write import rope_write_, rope_write_reference

EPS = 1e-6


def make_case(b, t, heads, kv_heads, d, *, pages=6, page=4, norms=True, seed=0, device="cpu"):
    """Packed QKV output ``[B, T, (H + 2 KV) * D]`` and its q/k/v views, norm weights, cos/sin as the canonical
    rotary embedding makes them (bf16), zero pools with a sink page, slots (padding of the last row -> sink)."""
    gen = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(b, t, (heads + 2 * kv_heads) * d, generator=gen) * 3).to(torch.bfloat16)
    q, k, v = (x.view(b, t, -1, d) for x in qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1))
    qw = (torch.rand(d, generator=gen) + 0.5).to(torch.bfloat16) if norms else None
    kw = (torch.rand(d, generator=gen) + 0.5).to(torch.bfloat16) if norms else None
    pos = torch.arange(t)[None, :] + 7 * torch.arange(b)[:, None]
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2).float() / d))
    ang = pos[..., None].float() * inv
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
    pool = torch.zeros(pages + 1, page, kv_heads, d, dtype=torch.bfloat16)
    perm = torch.randperm(pages * page, generator=gen)[: b * t]
    slots = perm.clone()
    slots[-1] = pages * page  # a padding token: the sink slot
    out = [q, k, v, qw, kw, cos, sin, pool.clone(), pool.clone(), slots]
    return [x.to(device) if x is not None else None for x in out]


def canonical(q, k, v, qw, kw, cos, sin, k_pool, v_pool, slots):
    """transformers' own modules: Qwen3RMSNorm per head, apply_rotary_pos_emb, then the index_put_ scatter."""
    d = q.shape[-1]
    if qw is not None:
        qn, kn = Qwen3RMSNorm(d, eps=EPS).to(torch.bfloat16), Qwen3RMSNorm(d, eps=EPS).to(torch.bfloat16)
        with torch.no_grad():
            qn.weight.copy_(qw), kn.weight.copy_(kw)
            q, k = qn(q), kn(k)
    q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    kp, vp = k_pool.clone(), v_pool.clone()
    kvh = k.shape[2]
    kp.view(-1, kvh, d).index_put_((slots,), k.reshape(-1, kvh, d))
    vp.view(-1, kvh, d).index_put_((slots,), v.reshape(-1, kvh, d))
    return q, kp, vp


def _bits(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("b,t,heads,kv_heads,d,norms", [(1, 1, 4, 2, 16, True), (3, 2, 8, 2, 32, True),
                                                        (2, 5, 2, 2, 8, False), (4, 1, 32, 8, 128, True)])
def test_cpu_path_equals_the_canonical_modules_bitwise(b, t, heads, kv_heads, d, norms):
    case = make_case(b, t, heads, kv_heads, d, norms=norms, seed=b * 10 + t)
    want_q, want_k, want_v = canonical(*case)
    q, k, v, qw, kw, cos, sin, kp, vp, slots = case
    got = rope_write_(q, k, v, qw, kw, EPS, cos, sin, kp, vp, slots)
    assert got.is_contiguous() and _bits(got, want_q)
    assert _bits(kp, want_k) and _bits(vp, want_v)  # written in place, nothing else touched


def test_op_declares_the_pools_it_writes_and_rejects_bad_shapes():
    eff = op_effects(torch.ops.flare.rope_write_)
    assert eff["writes"] == ["k_pool", "v_pool"]
    q, k, v, qw, kw, cos, sin, kp, vp, slots = make_case(2, 1, 4, 2, 16)
    with pytest.raises(ValueError, match="slots"):
        rope_write_reference(q, k, v, qw, kw, EPS, cos, sin, kp, vp, slots[:1])
    with pytest.raises(ValueError, match="cos"):
        rope_write_reference(q, k, v, qw, kw, EPS, cos[:, :, :8], sin, kp, vp, slots)


def test_compiled_equals_eager_bitwise():
    def step(q, k, v, qw, kw, cos, sin, kp, vp, slots):
        out = rope_write_(q * 1.0, k, v, qw, kw, EPS, cos, sin, kp, vp, slots)
        return out + 1.0

    case = make_case(2, 3, 8, 2, 32, seed=3)
    eager_case = [x.clone() if isinstance(x, torch.Tensor) else x for x in case]
    eager = step(*eager_case)
    compiled = torch.compile(step, fullgraph=True)(*case)
    assert _bits(eager, compiled) and _bits(eager_case[7], case[7]) and _bits(eager_case[8], case[8])


# ---------------------------------------------------------------------------------------- the Triton kernel

def check_rope_without_norms_bitwise(monkeypatch, device, heads, kv_heads, d, t, seq_lens, width):
    """Without the per-head norms every rounding of the rotation is transformers' (``apply_rotary_pos_emb``: each
    product rounded, then the sum): ``rope_write_triton`` on ``len(seq_lens)`` rows of ``t`` tokens -- its queries and
    pools -- and the fused decode kernel's pools at every ``FLARE_DECODE_V_FIRST`` (rows of ``seq_lens`` keys in a
    ``width``-page block table) equal the canonical modules bit for bit, run on ``device``."""
    from test_decode_attention import make_decode_case

    from ignition.components.kernels import fused_decode
    from ignition.components.kernels.rope_write import rope_write_triton

    b = len(seq_lens)
    case = make_case(b, t, heads, kv_heads, d, pages=40, page=16, norms=False, seed=heads + t)
    want_q, want_kp, want_vp = canonical(*case)
    q, k, v, _, _, cos, sin, kp, vp, slots = [x.to(device) if isinstance(x, torch.Tensor) else x for x in case]
    got = rope_write_triton(q, k, v, None, None, EPS, cos, sin, kp, vp, slots)
    assert _bits(got.cpu(), want_q), "rope write: the queries"
    assert _bits(kp.cpu(), want_kp) and _bits(vp.cpu(), want_vp), "rope write: the pools"
    cpu_case = make_decode_case(heads, kv_heads, d, seq_lens, norms=False, width=width, seed=heads + b)
    _, want_kp, want_vp = canonical(*cpu_case[:10])
    q, k, v, _, _, cos, sin, kp, vp, slots, bt, lens = [x.to(device) if isinstance(x, torch.Tensor) else x
                                                        for x in cpu_case]
    for level in ("0", "1", "2"):
        monkeypatch.setenv("FLARE_DECODE_V_FIRST", level)
        kp1, vp1 = kp.clone(), vp.clone()
        fused_decode.rope_decode_attention_triton(q, k, v, None, None, EPS, cos, sin, kp1, vp1, slots, bt, lens,
                                                  d ** -0.5)
        assert _bits(kp1.cpu(), want_kp) and _bits(vp1.cpu(), want_vp), f"fused decode, V_FIRST={level}: the pools"


def check_triton(got_q, kp, vp, case, rel=2.0 ** -6):
    """Bound against the CPU reference: each output element within ``rel`` of its head's largest magnitude
    (compiled, round to nearest: the statistics' fp32 order may move the normed value by an ulp, and with it the
    weight product, the two rotary products and their sum, half an ulp (2^-8 relative) each -- 2^-6 covers
    them; the interpreter truncates at each of those five roundings, always toward zero, up to a whole ulp
    (2^-7) each: 2^-4.  A wrong head, half, sign, position or norm is off by O(1) of that scale); values
    copied bit for bit; every slot but the step's own untouched."""
    q, k, v, qw, kw, cos, sin, kp0, vp0, slots = (x.cpu() if isinstance(x, torch.Tensor) else x for x in case)
    want_q, want_k, want_v = canonical(q, k, v, qw, kw, cos, sin, kp0, vp0, slots)
    for got, want in ((got_q.cpu(), want_q), (kp.cpu(), want_k)):
        scale = want.float().abs().amax(dim=-1, keepdim=True)
        err = (got.float() - want.float()).abs()
        assert (err <= rel * scale).all(), f"max excess {(err - rel * scale).max().item()}"
    assert _bits(vp.cpu(), want_v)
    kvh, d = k.shape[2], k.shape[3]
    written = torch.zeros(kp0.shape[0] * kp0.shape[1], dtype=torch.bool)
    written[slots] = True
    untouched = ~written
    assert _bits(kp.cpu().view(-1, kvh, d)[untouched], kp0.view(-1, kvh, d)[untouched])
