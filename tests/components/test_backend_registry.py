"""Backend registry: declarations, lazy probes, logged selection, explicit errors (no silent fallback)."""

import logging
import subprocess
import sys
import types

import pytest
import torch

from ignition.components import backends
from ignition.components.backends import (REGISTRY, Backend, BackendRegistry, BackendUnavailable, Requirements,
                                          select)

LOGGER = "ignition.components.backends"


@pytest.fixture
def registry():
    """A copy of the default declarations with a fresh probe cache."""
    return BackendRegistry(dict(REGISTRY.backends))


@pytest.fixture
def fake_module(monkeypatch):
    """Make ``name`` importable (an empty module) for one test."""
    def install(name):
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    return install


@pytest.fixture
def no_module(monkeypatch):
    """Make ``name`` fail to import even where it is installed (None in sys.modules)."""
    return lambda name: monkeypatch.setitem(sys.modules, name, None)


def test_import_probes_nothing():
    code = ("import sys, ignition.components, ignition.components.backends as b, ignition.components.sampling, "
            "ignition.components.scratch, ignition.components.custom_ops\n"
            "print(sorted(m for m in ('flashinfer', 'b12x') if m in sys.modules), len(b.REGISTRY._probed))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "0"]


def test_declarations():
    attention = {b.name: b for b in REGISTRY.of_kind("attention")}
    assert list(attention) == ["b12x", "flashinfer", "torch", "triton", "triton-decode", "triton-unfused"]  # priority
    assert attention["torch"].gpu_classes == set(backends.GPU_CLASSES)
    assert attention["torch"].load().__name__ == "PyTorchPagedAttention"
    # "triton" / "triton-decode": below "torch" (which qualifies wherever they do, and which the GPU matrix runs),
    # so explicit only
    assert attention["triton-decode"].priority < attention["triton"].priority < attention["torch"].priority
    assert attention["triton"].load().__name__ == "TritonPagedAttention"
    assert attention["triton-decode"].load().__name__ == "TritonDecodePagedAttention"
    assert attention["triton-decode"].load().prefill_kernel is False
    assert attention["triton"].load().fused_decode is True
    assert attention["triton-unfused"].load().fused_decode is False
    assert attention["triton-unfused"].priority < attention["triton-decode"].priority
    assert attention["triton"].gpu_classes == {"sm90", "sm100", "sm120", "sm121"}
    assert attention["flashinfer"].gpu_classes == {"sm90", "sm100"}
    assert attention["b12x"].gpu_classes == {"sm120", "sm121"}
    assert {b.name for b in REGISTRY.of_kind("sampling")} == {"torch", "flashinfer"}
    with pytest.raises(ValueError, match="kind"):
        Backend("x", "matmul", frozenset({"cpu"}), frozenset(), frozenset())
    with pytest.raises(ValueError, match="GPU classes"):
        Backend("x", "attention", frozenset({"sm75"}), frozenset(), frozenset())
    with pytest.raises(ValueError, match="already registered"):
        BackendRegistry(dict(REGISTRY.backends)).register(attention["torch"])


def test_cpu_selects_torch_and_logs_why(registry, caplog, no_module):
    for m in ("triton", "flashinfer", "b12x"):
        no_module(m)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        chosen = registry.select("attention", "cpu", {"dtype": torch.bfloat16, "features": {"paged_decode"}})
    assert chosen.name == "torch"
    [record] = [r for r in caplog.records if r.name == LOGGER]
    msg = record.getMessage()
    assert record.levelno == logging.INFO and "'torch' selected on cpu" in msg and "dtype bfloat16" in msg
    assert "skipped b12x (GPU class cpu not supported" in msg and "flashinfer (GPU class cpu not supported" in msg


def test_sampling_selects_the_in_graph_sampler(registry, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        chosen = registry.select("sampling", "cpu", {"features": {"per_row_seed", "penalties"}})
    assert chosen.name == "torch" and chosen.load().__name__ == "sample"
    assert "'torch' selected on cpu" in caplog.text


def test_preferred_unavailable_raises_naming_what_is_missing(registry, caplog, no_module):
    no_module("flashinfer")
    with caplog.at_level(logging.INFO, logger=LOGGER), pytest.raises(BackendUnavailable) as err:
        registry.select("attention", "cpu", Requirements(dtype="float32"), prefer="flashinfer")
    e = err.value
    assert e.backend == "flashinfer" and e.gpu_class == "cpu"
    text = str(e)
    assert "GPU class cpu not supported (supports sm100, sm90)" in text
    assert "dtype float32 not supported" in text and "module 'flashinfer' not importable" in text
    assert "refused" in caplog.text
    # Triton on CPU: unavailable even where triton imports.
    with pytest.raises(BackendUnavailable, match="GPU class cpu not supported"):
        registry.select("attention", "cpu", prefer="triton")


def test_no_silent_fallback_on_gpu(registry, no_module, fake_module):
    fake_module("triton")
    no_module("b12x")
    with pytest.raises(BackendUnavailable, match="module 'b12x' not importable") as err:
        registry.select("attention", "sm120", prefer="b12x")
    assert all("triton" not in m and "torch" not in m for m in err.value.missing)
    # Without a preference the choice is the best qualifying backend, and the skip is stated ("triton" ranks
    # below "torch": it serves only when asked for by name).
    assert registry.select("attention", "sm120").name == "torch"
    assert registry.select("attention", "sm120", prefer="triton").name == "triton"


def test_gpu_class_routing(registry, fake_module, no_module):
    fake_module("triton")
    fake_module("flashinfer")
    fake_module("b12x")
    assert registry.select("attention", "sm120").name == "b12x"
    assert registry.select("attention", "sm121").name == "b12x"
    assert registry.select("attention", "sm90").name == "flashinfer"
    assert registry.select("attention", "sm90", prefer="triton").name == "triton"
    # A feature only some backends have steers the choice; requirements nobody meets are an error.
    assert registry.select("attention", "sm90", {"features": {"softcap"}}).name == "flashinfer"
    assert registry.select("attention", "sm90", {"dtype": torch.float32}).name == "torch"
    with pytest.raises(BackendUnavailable, match="features not supported: softcap"):
        registry.select("attention", "sm120", {"features": {"softcap"}})  # none on SM120 has it
    no_module("b12x")  # probes are cached per registry: ask a fresh one
    fresh = BackendRegistry(dict(REGISTRY.backends))
    assert fresh.select("attention", "sm120", {"features": {"paged_decode"}}).name == "torch"
    assert fresh.select("attention", "sm120", {"features": {"paged_decode"}}, prefer="triton").name == "triton"
    with pytest.raises(BackendUnavailable, match="features not supported: mla") as err:
        registry.select("attention", "sm90", {"features": {"mla"}})
    assert err.value.backend == "<any>" and len(err.value.missing) == len(registry.of_kind("attention"))
    with pytest.raises(BackendUnavailable, match="features not supported: per_row_seed"):
        registry.select("sampling", "sm90", {"features": {"per_row_seed"}}, prefer="flashinfer")


def test_probe_is_lazy_and_cached(registry, monkeypatch):
    calls = []
    registry.register(Backend("probe_me", "sampling", frozenset({"sm90"}), frozenset({"float32"}),
                              frozenset({"greedy"}), priority=5,
                              probe=lambda gc: calls.append(gc) or "driver too old"))
    assert registry.select("sampling", "cpu").name == "torch" and calls == []  # class mismatch: no probe
    assert registry.select("sampling", "sm90").name == "torch" and calls == ["sm90"]
    with pytest.raises(BackendUnavailable, match="driver too old"):
        registry.select("sampling", "sm90", prefer="probe_me")
    assert calls == ["sm90"]


def test_broken_entry_is_unavailable_not_a_crash(registry):
    registry.register(Backend("ghost", "attention", frozenset({"cpu"}), frozenset({"float32"}), frozenset(),
                              priority=99, entry="ignition.components.no_such_module:kernel"))
    assert registry.select("attention", "cpu").name == "torch"
    with pytest.raises(BackendUnavailable, match="not loadable"):
        registry.select("attention", "cpu", prefer="ghost")


def test_unknown_names_and_default_gpu_class(registry, monkeypatch):
    with pytest.raises(BackendUnavailable, match="no such attention backend"):
        registry.select("attention", "cpu", prefer="cudnn")
    with pytest.raises(ValueError, match="kind"):
        registry.select("matmul", "cpu")
    from conformance.gpu import detect_gpu_class

    detect_gpu_class.cache_clear()
    monkeypatch.setenv("FLARE_GPU_CLASS", "cpu")
    try:
        assert select("sampling").name == "torch"  # module-level select on the detected class
    finally:
        detect_gpu_class.cache_clear()
