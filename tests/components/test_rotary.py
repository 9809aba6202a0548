"""``flare::rotary_cos_sin`` against transformers' ``Qwen3RotaryEmbedding`` (the independent reference): the CPU
op and the wrapper bit for bit, the Triton kernel in the interpreter (the compiled kernel is compared bit for bit on
the GPU in ``test_components_gpu.py``), the rule for which modules it takes, and its errors."""

import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from ignition.components.rotary import (fused_rotary_applies, position_embeddings, rotary_cos_sin,
                                        rotary_cos_sin_reference)
from test_triton_attention import interpreter  # sets TRITON_INTERPRET on CPU machines before triton is imported


def qwen3_rotary(head_dim=128, theta=1_000_000.0, rope_parameters=None) -> Qwen3RotaryEmbedding:
    """Qwen3's rotary module for a head size (Qwen3-0.6B and -8B: 128, theta 1e6, 40960 positions)."""
    params = {"rope_type": "default", "rope_theta": theta, **(rope_parameters or {})}
    cfg = Qwen3Config(head_dim=head_dim, hidden_size=1024, num_attention_heads=16, max_position_embeddings=40960,
                      rope_parameters=params)
    return Qwen3RotaryEmbedding(cfg)


def positions_case(shape=(3, 37), seed=0, hi=40960) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, hi, shape, generator=g)
    ends = torch.tensor([0, 1, hi - 1])  # the ends of the range
    n = min(3, pos.numel())
    pos.view(-1)[:n] = ends[:n]
    return pos


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1), (4, 1), (2, 33)])
def test_cpu_op_and_wrapper_equal_the_module_bitwise(dtype, shape):
    rot = qwen3_rotary()
    pos = positions_case(shape, seed=len(shape) + shape[-1])
    x = torch.zeros(2, dtype=dtype)
    want = rot(x, pos)
    for got in (rotary_cos_sin(pos, rot.inv_freq, rot.attention_scaling, x), position_embeddings(rot, x, pos)):
        assert all(g.dtype == dtype and g.shape == (*shape, 128) for g in got)
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_which_modules_the_op_takes(monkeypatch):
    """Fixed frequencies only: a dynamic rope type rewrites ``inv_freq`` as positions grow -- the module runs
    there; the switch turns the op off (on CPU the wrapper always runs the module)."""
    assert fused_rotary_applies(qwen3_rotary())
    yarn = qwen3_rotary(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert fused_rotary_applies(yarn) and yarn.attention_scaling != 1.0
    dynamic = qwen3_rotary(rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    assert not fused_rotary_applies(dynamic)

    class NoBuffer(torch.nn.Module):
        attention_scaling = 1.0

    assert not fused_rotary_applies(NoBuffer())
    rot = qwen3_rotary()
    rot.inv_freq = rot.inv_freq.double()
    assert not fused_rotary_applies(rot)


def test_yarn_scaling_on_cpu_equals_the_module():
    rot = qwen3_rotary(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    pos, x = positions_case((2, 9), seed=3), torch.zeros(1, dtype=torch.bfloat16)
    assert all(torch.equal(g, w) for g, w in zip(rotary_cos_sin(pos, rot.inv_freq, rot.attention_scaling, x),
                                                 rot(x, pos)))


def test_errors_name_the_bad_input():
    rot, x = qwen3_rotary(), torch.zeros(1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="positions must be integers"):
        rotary_cos_sin_reference(torch.zeros(2, 1), rot.inv_freq, 1.0, x)
    with pytest.raises(ValueError, match="inv_freq must be a non-empty 1-D float32"):
        rotary_cos_sin_reference(torch.zeros(2, 1, dtype=torch.long), rot.inv_freq.double(), 1.0, x)
    with pytest.raises(ValueError, match="inv_freq must be a non-empty 1-D float32"):
        rotary_cos_sin_reference(torch.zeros(2, 1, dtype=torch.long), rot.inv_freq[None], 1.0, x)


def _bf16_truncated(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 by truncation (what Triton 3.6's interpreter does where the GPU rounds to nearest even)."""
    return (x.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)


@interpreter
@pytest.mark.parametrize("head_dim,shape,scaling", [(128, (3, 37), 1.0), (64, (5, 1), 0.5), (96, (1, 20), 1.0)])
def test_triton_kernel_in_the_interpreter(head_dim, shape, scaling):
    """The kernel's fp32 cos/sin within one fp32 ulp of the module's (the interpreter's NumPy cos against torch's:
    different libms), both halves filled, the rows past a program's block (37 = 2 x 16 + 5) and a head size whose
    half is no power of two (96) masked right; its bf16 output is its own fp32 result rounded the interpreter's way
    (truncation), within one bf16 spacing of the module's."""
    from ignition.components.kernels.rotary import rotary_cos_sin_triton

    rot = qwen3_rotary(head_dim=head_dim)
    pos = positions_case(shape, seed=head_dim)
    got32 = rotary_cos_sin_triton(pos, rot.inv_freq, scaling, torch.float32)
    want32 = [w * scaling for w in rot(torch.zeros(1), pos)]
    got16 = rotary_cos_sin_triton(pos, rot.inv_freq, scaling, torch.bfloat16)
    for g32, w32, g16 in zip(got32, want32, got16):
        assert g32.shape == w32.shape == (*shape, head_dim)
        ulp = torch.finfo(torch.float32).eps * w32.abs().clamp_min(torch.finfo(torch.float32).tiny)
        assert ((g32 - w32).abs() <= ulp).all()
        assert (g32 != w32).float().mean() < 0.5  # most values equal: the same product, cos and scaling
        assert torch.equal(g16, _bf16_truncated(g32))
        assert ((g16.float() - w32).abs() <= 2.0 ** -7 * w32.abs() + 1e-30).all()
        half = head_dim // 2
        assert torch.equal(g32[..., :half], g32[..., half:])


def _embedding(vocab=1000, hidden=96, dtype=torch.bfloat16, seed=0) -> torch.nn.Embedding:
    """A token embedding as Qwen3's (``nn.Embedding`` with a padding index), random rows."""
    emb = torch.nn.Embedding(vocab, hidden, padding_idx=vocab - 1, dtype=dtype)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed)))
    return emb


def test_embed_rotary_cpu_op_and_wrapper_equal_the_modules_bitwise():
    """``flare::embed_rotary`` off CUDA, and the step's entry point, against ``nn.Embedding`` and the rotary module;
    mismatched shapes name themselves."""
    from ignition.components.rotary import embed_position_embeddings, embed_rotary

    rot, emb = qwen3_rotary(), _embedding()
    pos = positions_case((2, 7), seed=5)
    ids = torch.randint(0, 1000, (2, 7), generator=torch.Generator().manual_seed(6))
    want_h = emb(ids)
    want_pe = rot(want_h, pos)
    hidden, cos, sin = embed_rotary(ids, emb.weight, pos, rot.inv_freq, rot.attention_scaling)
    assert torch.equal(hidden, want_h) and torch.equal(cos, want_pe[0]) and torch.equal(sin, want_pe[1])
    hidden, (cos, sin) = embed_position_embeddings(emb, rot, ids, pos)
    assert torch.equal(hidden, want_h) and torch.equal(cos, want_pe[0]) and torch.equal(sin, want_pe[1])
    with pytest.raises(ValueError, match="embed_rotary: input_ids"):
        embed_rotary(ids[:, :3], emb.weight, pos, rot.inv_freq, 1.0)


@interpreter
@pytest.mark.parametrize("shape,hidden", [((1, 1), 4096), ((3, 37), 96), ((1, 20), 1000)])
def test_embed_rotary_kernel_in_the_interpreter(shape, hidden):
    """The embedding rows copied by the rotary launch: exactly ``table[ids]`` (a decode row of Qwen3-8B's 4096
    columns over 8 programs, rows past a program's block, a width no multiple of the column block), and the cos / sin
    the same bits as the rotary kernel alone."""
    from ignition.components.kernels.rotary import embed_rotary_triton, rotary_cos_sin_triton

    rot, emb = qwen3_rotary(), _embedding(hidden=hidden, seed=hidden)
    pos = positions_case(shape, seed=len(shape))
    ids = torch.randint(0, 1000, shape, generator=torch.Generator().manual_seed(hidden))
    got_h, cos, sin = embed_rotary_triton(ids, emb.weight, pos, rot.inv_freq, 1.0)
    assert got_h.shape == (*shape, hidden) and torch.equal(got_h, emb.weight[ids])
    want_cos, want_sin = rotary_cos_sin_triton(pos, rot.inv_freq, 1.0, torch.bfloat16)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)


def batch_case(shape, seed=0, sink=999, max_len=64):
    """A step's attention-batch inputs of ``[B, T]`` tokens: slots with padding (-1), the last row inactive (when
    there are two or more), lengths past both ends of ``[0, max_len]``."""
    b, t = shape
    g = torch.Generator().manual_seed(seed)
    slot_mapping = torch.randint(0, sink, shape, generator=g)
    slot_mapping[torch.rand(shape, generator=g) < 0.3] = -1
    active = torch.ones(b, dtype=torch.bool)
    if b > 1:
        active[-1] = False
    seq_lens = torch.randint(-3, max_len + 5, (b,), generator=g)
    seq_lens[0] = max_len + 7  # clamped
    return slot_mapping, active, seq_lens, sink, max_len


def batch_expected(slot_mapping, active, seq_lens, sink, max_len):
    """The attention batch's slots, valid and lengths by their definition, element by element (not the code under
    test): a token is valid where its slot is >= 0 and its row active, else it writes the sink; a length is clamped to
    [0, max_len], 0 for an inactive row."""
    b, t = slot_mapping.shape
    valid = torch.tensor([[bool(slot_mapping[r, i] >= 0 and active[r]) for i in range(t)] for r in range(b)])
    slots = torch.tensor([int(slot_mapping[r, i]) if valid[r, i] else sink for r in range(b) for i in range(t)])
    lens = torch.tensor([min(max(int(seq_lens[r]), 0), max_len) if active[r] else 0 for r in range(b)])
    return slots, valid.view(b, t), lens


def test_embed_rotary_batch_cpu_op_equals_the_modules_and_the_batch_definition():
    """``flare::embed_rotary_batch`` off CUDA: the embedding and the rotary module's bits, the batch's slots, valid
    and lengths by their definition (and :func:`attention.batch_tensors`' -- the metadata region it replaces); bad
    batch arguments name themselves."""
    from ignition.components.attention import batch_tensors
    from ignition.components.rotary import embed_rotary_batch

    rot, emb = qwen3_rotary(), _embedding()
    shape = (4, 5)
    pos = positions_case(shape, seed=7)
    ids = torch.randint(0, 1000, shape, generator=torch.Generator().manual_seed(8))
    case = batch_case(shape, seed=9)
    got = embed_rotary_batch(ids, emb.weight, pos, rot.inv_freq, rot.attention_scaling, *case)
    want_h = emb(ids)
    want = (want_h, *rot(want_h, pos), *batch_expected(*case))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)
    slot_mapping, active, seq_lens, sink, max_len = case
    slots, _, valid, _, lens, _ = batch_tensors(pos, slot_mapping, torch.zeros(4, max_len // 8), seq_lens, active,
                                                sink, 8, with_visible=False)
    assert torch.equal(slots, got[3]) and torch.equal(valid, got[4]) and torch.equal(lens, got[5])
    # the op's fake (what a compiled step traces) and its schema: torch.library's checks, and a compiled call's bits
    with torch.no_grad():
        torch.library.opcheck(torch.ops.flare.embed_rotary_batch.default,
                              (ids, emb.weight, pos, rot.inv_freq, rot.attention_scaling, *case))
        compiled = torch.compile(embed_rotary_batch, fullgraph=True)(
            ids, emb.weight, pos, rot.inv_freq, rot.attention_scaling, *case)
    for g, w in zip(compiled, got, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)
    args = (ids, emb.weight, pos, rot.inv_freq, 1.0)
    for bad, name in (((slot_mapping.int(), active, seq_lens), "slot_mapping"),
                      ((slot_mapping, active.long(), seq_lens), "active"),
                      ((slot_mapping, active, seq_lens.float()), "seq_lens"),
                      ((slot_mapping[:3], active, seq_lens), "slot_mapping")):
        with pytest.raises(ValueError, match=f"embed_rotary_batch: {name}"):
            embed_rotary_batch(*args, *bad, sink, max_len)


@interpreter
@pytest.mark.parametrize("shape", [(1, 1), (4, 1), (3, 37), (20, 1)])
def test_embed_rotary_batch_kernel_in_the_interpreter(shape):
    """The rotary launch writing the attention batch too: its slots, valid and lengths by their definition (decode
    rows, a prefill chunk whose rows' first tokens fall in different programs, more rows than one program's block),
    the embedding rows and cos / sin the same bits as the launch without them."""
    from ignition.components.kernels.rotary import embed_rotary_batch_triton, embed_rotary_triton

    rot, emb = qwen3_rotary(), _embedding(hidden=96, seed=shape[0])
    pos = positions_case(shape, seed=shape[1])
    ids = torch.randint(0, 1000, shape, generator=torch.Generator().manual_seed(shape[0]))
    case = batch_case(shape, seed=sum(shape))
    got = embed_rotary_batch_triton(ids, emb.weight, pos, rot.inv_freq, 1.0, *case)
    want = (*embed_rotary_triton(ids, emb.weight, pos, rot.inv_freq, 1.0), *batch_expected(*case))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
