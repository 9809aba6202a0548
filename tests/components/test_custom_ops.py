"""Opaque kernels as custom ops: declared effects, and ordering under torch.compile(fullgraph=True)."""

import pytest
import torch

from ignition.components.custom_ops import SENTINEL_BYTE, op_effects, opaque_op, poison_pattern, scratch_fill_

NAN32, WIDTH32 = poison_pattern(torch.float32)


def test_scratch_fill_declares_its_write():
    eff = op_effects(scratch_fill_)
    assert eff["name"] == "flare::scratch_fill_"
    assert eff["reads"] == ["buf"] and eff["writes"] == ["buf"] and eff["returns"] == []
    assert list(eff["aliases"]) == ["buf"] and eff["aliases"]["buf"].endswith("!")  # Tensor(a0!)
    assert op_effects(torch.ops.flare.scratch_fill_) == eff


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64,
                                   torch.float8_e4m3fn, torch.float8_e5m2])
def test_poison_pattern_is_nan_for_floats(dtype):
    value, width = poison_pattern(dtype)
    buf = torch.zeros(16, dtype=dtype)
    scratch_fill_(buf, 0, 16 * dtype.itemsize, value, width)
    assert width == dtype.itemsize and torch.isnan(buf.float()).all()


def test_scratch_fill_bounds_and_sentinel():
    buf = torch.zeros(8, dtype=torch.int32)
    assert poison_pattern(torch.int32) == (SENTINEL_BYTE, 1)
    scratch_fill_(buf, 4, 8, SENTINEL_BYTE, 1)
    assert buf.tolist()[:4] == [0, -1515870811, -1515870811, 0]
    with pytest.raises(ValueError, match="outside"):
        scratch_fill_(buf, 16, 32, 0, 1)
    with pytest.raises(ValueError, match="multiples"):
        scratch_fill_(buf, 2, 8, 0, 4)


def test_opaque_op_refuses_vague_declarations():
    with pytest.raises(ValueError, match="explicitly"):
        opaque_op("vague", mutates_args="unknown", namespace="flare_test")
    with pytest.raises(ValueError, match="names no parameter"):
        @opaque_op("typo", mutates_args=("outt",), namespace="flare_test")
        def typo(x: torch.Tensor, out: torch.Tensor) -> None:
            out.copy_(x)


@opaque_op("scale_into", mutates_args=("out",), namespace="flare_test")
def scale_into(x: torch.Tensor, out: torch.Tensor, factor: float) -> None:
    """An opaque kernel with a caller-owned output (out= style), auto fake."""
    torch.mul(x, factor, out=out)


# Planted defect: the same fill, but the registration lies (declares no mutation).
@opaque_op("fill_undeclared", mutates_args=(), namespace="flare_test")
def fill_undeclared(buf: torch.Tensor, offset: int, nbytes: int, value: int, width: int) -> None:
    buf.reshape(-1).view(torch.uint8)[offset:offset + nbytes].view(torch.int32).fill_(value)


def _read_poison_read(fill):
    def step(x, ws):
        before = x * 2 + ws  # read ws before the fill
        fill(ws, 0, ws.numel() * 4, NAN32, WIDTH32)  # poison ws after its last permitted use
        scale_into(x, ws, 3.0)  # opaque writer
        after = ws + 1  # read after the writer
        return before, after
    return step


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _run(fn, compiled: bool):
    x, ws = torch.arange(8, dtype=torch.float32), torch.full((8,), 0.5)
    f = torch.compile(fn, fullgraph=True, backend="inductor") if compiled else fn
    before, after = f(x, ws)
    return before, after, ws


def test_compile_keeps_mutations_ordered_relative_to_reads():
    torch._dynamo.reset()
    eager = _run(_read_poison_read(scratch_fill_), compiled=False)
    compiled = _run(_read_poison_read(scratch_fill_), compiled=True)
    assert torch.equal(eager[0], torch.arange(8) * 2 + 0.5)  # read before the fill saw the old data
    assert torch.equal(eager[1], torch.arange(8) * 3.0 + 1)  # read after the writer saw its output
    for e, c in zip(eager, compiled):
        assert _same(e, c)  # bytewise, including the caller's buffer


def test_compile_with_poison_left_in_place_is_visible():
    def step(x, ws):
        before = ws.sum()
        scratch_fill_(ws, 0, ws.numel() * 4, NAN32, WIDTH32)
        return before, ws * x  # a reader after the poison must see NaN

    torch._dynamo.reset()
    ws = torch.ones(8)
    before, after = torch.compile(step, fullgraph=True)(torch.ones(8), ws)
    assert before.item() == 8 and torch.isnan(after).all() and torch.isnan(ws).all()


def test_planted_undeclared_mutation_is_caught():
    """An op that hides its write is dead code to the compiler: compiled != eager, which the check catches."""
    torch._dynamo.reset()
    fn = _read_poison_read(lambda ws, *a: fill_undeclared(ws, *a))
    eager = _run(fn, compiled=False)
    compiled = _run(fn, compiled=True)
    assert _same(eager[1], compiled[1]) and _same(eager[2], compiled[2])  # scale_into overwrote ws anyway

    def poison_only(x, ws):
        fill_undeclared(ws, 0, ws.numel() * 4, NAN32, WIDTH32)
        return ws + x

    e_ws, c_ws = torch.full((8,), 0.5), torch.full((8,), 0.5)
    e = poison_only(torch.ones(8), e_ws)
    c = torch.compile(poison_only, fullgraph=True)(torch.ones(8), c_ws)
    assert torch.isnan(e).all()
    assert not torch.isnan(c).any(), "the undeclared write was eliminated, so the plant is visible"
    assert not _same(e, c)
