"""The CPU-checkable parts of ``qualify.timeline`` (the profiles themselves need CUDA): the round ranges are
installed and removed cleanly, and :func:`difference` reports what one attributed run spends beyond another."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from qualify import timeline as tl


def _result(capacity, width, elapsed_ms, per_range, per_operator):
    return {"capacity": capacity, "width": width, "graph_elapsed": {"median_ms": elapsed_ms},
            "attributed": {"per_range": per_range, "per_operator": per_operator}}


def test_difference_by_region_and_kernel():
    decode = _result(1, None, 5.0, {"layer.0": {"kernels": 10, "us": 100.0}, "layer.1": {"kernels": 10, "us": 100.0},
                                    "head": {"kernels": 4, "us": 280.0}, "sampler": {"kernels": 20, "us": 80.0}},
                     {"gemv": {"kernels": 6, "us": 150.0}, "sort": {"kernels": 4, "us": 35.0}})
    round1 = _result(1, 1, 5.5, {"layer.0": {"kernels": 10, "us": 100.0}, "layer.1": {"kernels": 10, "us": 101.0},
                                 "head": {"kernels": 4, "us": 281.0}, "acceptance": {"kernels": 60, "us": 400.0},
                                 "sampling-state advance": {"kernels": 3, "us": 9.0}},
                     {"gemv": {"kernels": 6, "us": 150.0}, "sort": {"kernels": 8, "us": 70.0},
                      "elementwise": {"kernels": 40, "us": 120.0}})
    d = tl.difference(decode, round1)
    assert abs(d["graph_elapsed_us"] - 500.0) < 1e-6 and d["difference"] == ["B=1 W=1", "B=1"]
    regions = {r["name"]: r for r in d["per_region"]}
    assert regions["acceptance"] == {"name": "acceptance", "kernels": 60, "us": 400.0}
    assert regions["sampler"]["us"] == -80.0 and regions["layers (all)"]["us"] == 1.0
    assert d["per_region"][0]["name"] == "acceptance"  # largest first
    ops = {r["name"]: r for r in d["per_operator"]}
    assert "gemv" not in ops and ops["elementwise"]["kernels"] == 40 and ops["sort"]["us"] == 35.0
    assert "graph elapsed +500.0 us" in d["table"] and "acceptance" in d["table"]


def test_round_ranges_name_the_round_tail_and_restore_everything():
    from ignition.components import speculative
    from ignition.graphs import rounds

    class Model:
        def head_all(self, x):
            return x + 1

    model = Model()
    before = (rounds.head_logits, speculative.accept, speculative.advance_accepted)
    with tl._round_ranges(model):
        assert rounds.head_logits is not before[0] and speculative.accept is not before[1]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            assert int(model.head_all(torch.zeros(1))) == 1
        assert any(e.name == "head" for e in prof.events())
    assert (rounds.head_logits, speculative.accept, speculative.advance_accepted) == before
    assert "head_all" not in vars(model) and int(model.head_all(torch.zeros(1))) == 1
    with tl._round_ranges(None):  # decode: nothing patched
        assert (rounds.head_logits, speculative.accept, speculative.advance_accepted) == before


def test_attributed_run_keeps_a_compiled_tail_as_the_head_range():
    """A step whose tail is its own compiled region (``catalog.compile``'s ``tail_fn``: a round's head, acceptance and
    sampling-state advance) keeps that same callable in the attributed run -- one ``head`` range around it -- so the
    attributed run launches the kernels the graph replays (runs 172-173 took the eager tail: "not in the attributed
    run"); and the round ranges are not patched in around it.  A step without one passes no ``tail_fn``."""
    import functools
    from types import SimpleNamespace

    from ignition.graphs.catalog import step_head

    calls = []

    def forward(*inputs, layer_fn=None, head_fn=None, batch_fn=None, tail_fn=None):
        calls.append(("forward", tail_fn is not None))
        return tail_fn(inputs[0]) if tail_fn is not None else inputs[0]

    def compiled_tail(x):
        calls.append("tail")
        return x + 1

    head = functools.partial(step_head, logits_fn=lambda *a: None, sample_fn=lambda *a: None, hook_fn=lambda *a: None)
    with_tail = SimpleNamespace(fn=functools.partial(forward, layer_fn=lambda *a: None, head_fn=head, batch_fn=None,
                                                     tail_fn=compiled_tail))
    assert tl._compiled_tail(with_tail)
    fn = tl._attributed_fn(with_tail)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert int(fn(torch.zeros(1))) == 1
    assert calls == [("forward", True), "tail"], "the attributed run dropped the compiled tail"
    assert any(e.name == "head" for e in prof.events())
    without = SimpleNamespace(fn=functools.partial(forward, layer_fn=lambda *a: None, head_fn=head, batch_fn=None))
    assert not tl._compiled_tail(without) and "tail_fn" not in tl._attributed_fn(without).keywords
