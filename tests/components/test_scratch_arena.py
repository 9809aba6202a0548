"""ScratchArena: serial reuse, parallel disjointness, resize/refresh/stale detection, poison."""

import json

import pytest
import torch

from ignition.components.scratch import (ScratchArena, ScratchError, ScratchPlan, ScratchRequest,
                                         StaleBindingError, contains_poison)


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_serial_plans_reuse_one_storage():
    arena = ScratchArena(name="t")
    a = arena.register(ScratchPlan("layer.a", x=((64,), torch.float32), y=((8, 8), torch.bfloat16)))
    b = arena.register(ScratchPlan("layer.b", w=1000))
    assert arena.peak_bytes == max(a.nbytes, b.nbytes) and arena.declared_bytes == a.nbytes + b.nbytes
    ba, bb = arena.bind(a), arena.bind(b)
    base = arena.describe()
    assert [p["offset"] for p in base["plans"]] == [0, 0]
    # Same first byte: the serial plans share storage.
    assert ba["x"].data_ptr() == bb["w"].data_ptr()
    # Entries inside one plan are live together: disjoint.
    assert not _overlap(_byte_range(ba["x"]), _byte_range(ba["y"]))
    assert ba["y"].shape == (8, 8) and ba["y"].dtype == torch.bfloat16 and bb["w"].dtype == torch.uint8
    assert arena.capacity_bytes == arena.peak_bytes


def test_parallel_plans_get_disjoint_aligned_regions():
    arena = ScratchArena()
    plans = arena.register_parallel(
        ScratchPlan("branch.main", h=((3, 5), torch.float32)),
        ScratchPlan("branch.side", [ScratchRequest.tensor("h", (7,), torch.float16, alignment=1024)]),
        ScratchPlan("branch.idx", ids=((9,), torch.int32), raw=33))
    arena.register(ScratchPlan("serial", big=((100,), torch.float32)))
    views = [t for p in plans for t in arena.bind(p).tensors.values()]
    ranges = [_byte_range(t) for t in views]
    for i in range(len(ranges)):
        for j in range(i + 1, len(ranges)):
            assert not _overlap(ranges[i], ranges[j]), (i, j)
    side = arena.bind("branch.side")["h"]
    assert side.data_ptr() % 1024 == 0
    assert all(t.data_ptr() % 256 == 0 for t in views)
    # The parallel group is the peak: its regions are summed; the serial plan overlaps them.
    group_end = max(p["offset"] + p["nbytes"] for p in arena.describe()["plans"] if p["group"] == 0)
    assert arena.peak_bytes == max(group_end, 400)
    # Writing one branch leaves the others intact.
    b = arena.bind("branch.main")["h"]
    for t in views:
        t.view(torch.uint8).fill_(7) if t.dtype == torch.uint8 else t.fill_(7)
    b.fill_(-1.0)
    assert (side == 7).all() and (arena.bind("branch.idx")["ids"] == 7).all()


def test_resize_invalidates_bindings_and_refresh_rebinds():
    arena = ScratchArena()
    small = arena.register(ScratchPlan("small", x=((16,), torch.float32)))
    binding = arena.bind(small)
    escaped = binding["x"]
    escaped.fill_(1.0)
    gen = arena.generation
    arena.register(ScratchPlan("large", y=((4096,), torch.float32)))
    with pytest.raises(ScratchError, match="call resize"):
        arena.bind("large")
    arena.resize()
    assert arena.generation == gen + 1
    with pytest.raises(StaleBindingError, match="generation"):
        binding["x"]
    with pytest.raises(StaleBindingError):
        arena.check_view(escaped)
    # A stale raw view that slips past the checks reads invalidated bytes, not the old values.
    assert torch.isnan(escaped).all()
    binding.refresh()
    arena.check_view(binding["x"])
    assert binding["x"].data_ptr() == arena.bind("large")["y"].data_ptr()
    # arena.refresh() re-binds every live binding at once.
    other = arena.bind("large")
    arena.resize(arena.peak_bytes * 2, refresh=True)
    assert not binding.stale and not other.stale
    arena.check_view(other["y"])


def test_reserve_envelope_then_trim_to_selected_peak():
    arena = ScratchArena()
    arena.register(ScratchPlan("mlp", h=((256,), torch.float32)))
    cand_big = arena.register(ScratchPlan("tune.split_k=8", ws=1 << 16))
    arena.register(ScratchPlan("tune.split_k=1", ws=1 << 10))
    arena.reserve(1 << 18)  # the complete candidate envelope during tuning
    assert arena.capacity_bytes == 1 << 18
    b = arena.bind("mlp")
    arena.unregister(cand_big)  # the tuner selected split_k=1
    arena.trim()
    assert arena.capacity_bytes == arena.peak_bytes == 1024
    assert not b.stale and b["h"].numel() == 256
    with pytest.raises(ScratchError, match="no plan"):
        arena.bind("tune.split_k=8")


def test_declaration_errors():
    arena = ScratchArena()
    arena.register(ScratchPlan("p", a=8))
    with pytest.raises(ScratchError, match="already registered"):
        arena.register(ScratchPlan("p", a=8))
    with pytest.raises(ScratchError, match="duplicate"):
        ScratchPlan("q", [ScratchRequest.bytes("a", 4)], a=4)
    with pytest.raises(ScratchError, match="power of two"):
        ScratchRequest.bytes("a", 4, alignment=48)
    with pytest.raises(ScratchError, match="below the declared peak"):
        arena.resize(4)


def _previous_layer(arena):
    """A plan that leaves plausible finite values in the shared storage."""
    arena.bind("prev")["buf"].copy_(torch.linspace(0.5, 1.5, 64))


def _good_consumer(ws: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ws.copy_(x * 2)  # writes its scratch first
    return (ws + 1).sum()


def _defective_consumer(ws: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    acc = ws + x  # planted defect: reads scratch it never wrote (an accumulate that forgot to zero)
    ws.copy_(acc)
    return ws.sum()


def _arena_with_consumer():
    arena = ScratchArena()
    arena.register(ScratchPlan("prev", buf=((64,), torch.float32)))
    arena.register(ScratchPlan("consumer", ws=((64,), torch.float32), ids=((16,), torch.int32)))
    return arena


def test_poison_catches_read_before_write():
    x = torch.ones(64)
    arena = _arena_with_consumer()
    # Without poison the defect is invisible: the reused bytes are plausible finite numbers.
    _previous_layer(arena)
    assert torch.isfinite(_defective_consumer(arena.bind("consumer")["ws"], x))
    # Poison the shared storage after the previous plan's last permitted use.
    _previous_layer(arena)
    arena.poison("prev")
    assert bool(contains_poison(arena.bind("consumer")["ws"]))
    assert torch.isnan(_defective_consumer(arena.bind("consumer")["ws"], x))
    _previous_layer(arena)
    arena.poison("prev")
    assert _good_consumer(arena.bind("consumer")["ws"], x).item() == 64 * 3


def test_poison_patterns_by_dtype_and_selection():
    arena = ScratchArena()
    plan = arena.register(ScratchPlan("p", f=((8,), torch.bfloat16), h=((8,), torch.float16),
                                      i=((8,), torch.int32), raw=16))
    b = arena.bind(plan)
    for t in b.tensors.values():
        t.zero_()
    arena.poison(plan, names=["i"])
    assert bool(contains_poison(b["i"])) and not bool(contains_poison(b["f"]))
    assert (b["i"] == int.from_bytes(b"\xa5" * 4, "little", signed=True)).all()
    arena.poison(plan)
    assert torch.isnan(b["f"].float()).all() and torch.isnan(b["h"].float()).all()
    assert (b["raw"] == 0xA5).all() and bool(contains_poison(b["raw"]))
    with pytest.raises(ScratchError, match="declares no scratch"):
        arena.poison(plan, names=["nope"])


def test_describe_is_a_memory_report():
    arena = ScratchArena(name="decode")
    arena.register_parallel(ScratchPlan("a", x=((10,), torch.float32)), ScratchPlan("b", y=100))
    arena.register(ScratchPlan("c", z=((1000,), torch.float16)))
    arena.bind("c")
    d = json.loads(json.dumps(arena.describe()))
    assert d["arena"] == "decode" and d["peak_bytes"] == arena.peak_bytes == 2000
    assert d["declared_bytes"] == 40 + 100 + 2000 and d["capacity_bytes"] == 2000
    assert d["allocated_bytes"] >= d["capacity_bytes"]
    assert {p["plan"]: p["parallel"] for p in d["plans"]} == {"a": True, "b": True, "c": False}
    assert d["plans"][2]["entries"][0] == {"name": "z", "offset": 0, "nbytes": 2000, "alignment": 256,
                                           "shape": [1000], "dtype": "float16"}
    assert "peak=2000 B" in repr(arena)
