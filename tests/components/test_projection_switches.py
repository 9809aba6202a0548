"""The projection and rotary switches no measurement test reaches: each one's routing and its refusal of a bad value
(read where the launch or the trace reads them)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


def test_gated_fused_max_elements_decides_the_one_row_gated_launch(monkeypatch):
    from ignition.components import fused_linear

    w = torch.zeros(2 * 96, 64, dtype=torch.bfloat16)  # 12,288 elements
    monkeypatch.setenv("FLARE_GATED_FUSED_MAX_ELEMENTS", "10000")
    assert not fused_linear.prefers_fused(1, w, True)  # above the limit: cuBLAS streams it
    assert fused_linear.prefers_fused(1, w, False)  # ungated: the limit does not apply
    monkeypatch.setenv("FLARE_GATED_FUSED_MAX_ELEMENTS", "20000")
    assert fused_linear.prefers_fused(1, w, True)
    monkeypatch.setenv("FLARE_GATED_FUSED_MAX_ELEMENTS", "many")
    with pytest.raises(ValueError, match="FLARE_GATED_FUSED_MAX_ELEMENTS"):
        fused_linear.prefers_fused(1, w, True)


def test_gemv_prefetch_mb_sets_the_whole_weight_budget(monkeypatch):
    pytest.importorskip("triton", reason="Triton is not installed here")
    from ignition.components.kernels import linear

    w = torch.zeros(1024, 4096, dtype=torch.bfloat16)  # 8 MiB, 4 tiles of 1024 columns
    monkeypatch.setenv("FLARE_GEMV_PREFETCH_MB", "8")
    assert linear.gemv_prefetch_tiles(w, 1024) == 4  # fits: every tile
    monkeypatch.setenv("FLARE_GEMV_PREFETCH_MB", "0")
    assert linear.gemv_prefetch_tiles(w, 1024) == min(linear.GEMV_PREFETCH_TILES, 4)  # the first tiles only
    monkeypatch.setenv("FLARE_GEMV_PREFETCH_MB", "-1")
    with pytest.raises(ValueError, match="FLARE_GEMV_PREFETCH_MB"):
        linear.gemv_prefetch_tiles(w, 1024)


def test_gemv_early_switch_under_pdl(monkeypatch):
    pytest.importorskip("triton", reason="Triton is not installed here")
    from ignition.components.kernels import linear

    monkeypatch.setattr(linear, "pdl_enabled", lambda device: True)  # as on sm90
    monkeypatch.delenv("FLARE_GEMV_EARLY", raising=False)
    assert linear.gemv_early_enabled(torch.device("cpu"), 1) is linear.GEMV_EARLY
    assert not linear.gemv_early_enabled(torch.device("cpu"), 64)  # beyond the early rows
    monkeypatch.setenv("FLARE_GEMV_EARLY", "0")
    assert not linear.gemv_early_enabled(torch.device("cpu"), 1)
    monkeypatch.setattr(linear, "pdl_enabled", lambda device: False)
    monkeypatch.setenv("FLARE_GEMV_EARLY", "1")
    assert not linear.gemv_early_enabled(torch.device("cpu"), 1)  # no PDL, no early launch


def test_gemv_preload_is_a_whole_number_of_at_most_four_tiles(monkeypatch):
    pytest.importorskip("triton", reason="Triton is not installed here")
    from ignition.components.kernels import linear

    monkeypatch.setenv("FLARE_GEMV_PRELOAD", "2")
    assert linear.gemv_preload_tiles(1, 4096, 1024, True) == 2
    for bad, needle in (("2.5", "whole number"), ("-3", "whole number"), ("9", "at most 4")):
        monkeypatch.setenv("FLARE_GEMV_PRELOAD", bad)
        with pytest.raises(ValueError, match=needle):
            linear.gemv_preload_tiles(1, 4096, 1024, True)


def test_fused_rotary_switch_routes_cuda_steps(monkeypatch):
    """On CUDA the op computes cos/sin where it reproduces the module, unless ``FLARE_FUSED_ROTARY=0`` (then the
    module itself); off CUDA always the module.  (A CUDA input stood in by ``is_cuda``: the routing alone.)"""
    from ignition.components import rotary

    calls = []
    monkeypatch.setattr(rotary, "rotary_cos_sin", lambda *a: calls.append("op") or "op")

    class Rotary:  # a module the op reproduces (fixed fp32 frequencies): called when the op is not
        inv_freq, attention_scaling, rope_type = torch.ones(4), 1.0, "default"

        def __call__(self, x, positions):
            calls.append("module")
            return "module"

    rot, pos = Rotary(), torch.arange(3)
    cuda_x, cpu_x = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)
    monkeypatch.delenv("FLARE_FUSED_ROTARY", raising=False)
    assert rotary.position_embeddings(rot, cuda_x, pos) == "op"
    assert rotary.position_embeddings(rot, cpu_x, pos) == "module"
    monkeypatch.setenv("FLARE_FUSED_ROTARY", "0")
    assert rotary.position_embeddings(rot, cuda_x, pos) == "module"
    assert calls == ["op", "module", "module"]


def test_mlp_handoff_takes_the_fitting_forms_and_warns_where_asked_for_and_not_taken(monkeypatch):
    """``FLARE_GEMV_HANDOFF`` (``fused_linear.mlp_handoff``; one row on CUDA): Qwen3-8B's packed MLP takes it at the
    table configs, and so does the gated form (the table names down's preload 0) -- not once down preloads tiles
    (``FLARE_GEMV_CONFIG``'s fifth field): asked for and not taken, a warning names the shapes; off, neither form and
    no warning."""
    pytest.importorskip("triton", reason="Triton is not installed here")
    import warnings

    from ignition.components import fused_linear

    gu_w = SimpleNamespace(is_cuda=True)  # the rule reads the device and down's shape only
    down_w = torch.empty(4096, 12288, device="meta")
    monkeypatch.delenv("FLARE_GEMV_CONFIG", raising=False)
    monkeypatch.setenv("FLARE_GEMV_HANDOFF", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not fused_linear.mlp_handoff(1, gu_w, down_w) and not fused_linear.mlp_handoff(1, gu_w, down_w, True)
    monkeypatch.setenv("FLARE_GEMV_HANDOFF", "1")
    assert fused_linear.mlp_handoff(1, gu_w, down_w) and not fused_linear.mlp_handoff(4, gu_w, down_w)
    assert not fused_linear.mlp_handoff(1, SimpleNamespace(is_cuda=False), down_w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fused_linear.mlp_handoff(1, gu_w, down_w, True)  # the table's down preloads nothing
    monkeypatch.setenv("FLARE_GEMV_CONFIG", "1x4096x12288=8/1024/4/2/2")
    with pytest.warns(UserWarning, match="gated MLP of hidden=4096, intermediate=12288 does not take the handoff"):
        assert not fused_linear.mlp_handoff(1, gu_w, down_w, True)  # a plain down preloading 2 tiles
    monkeypatch.setenv("FLARE_GEMV_CONFIG", "1x24576x4096g=2/1024/4/2;1x4096x12288=8/1024/4/2/0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fused_linear.mlp_handoff(1, gu_w, down_w, True) and fused_linear.mlp_handoff(1, gu_w, down_w)
