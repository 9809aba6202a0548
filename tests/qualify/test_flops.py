"""``qualify.flops.prefill_flops`` against independent counts: projection parameters counted from transformers'
canonical Qwen3 module, visible keys summed query by query."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import Qwen3Config, Qwen3ForCausalLM

from qualify.flops import measured_matmul_tflops, prefill_flops

GEO = dict(hidden_size=64, num_layers=3, num_attention_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96,
           vocab_size=300)


def test_prefill_flops_match_independent_counts():
    cfg = Qwen3Config(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      intermediate_size=96, vocab_size=300)
    model = Qwen3ForCausalLM(cfg)
    linear = sum(p.numel() for n, p in model.model.layers.named_parameters() if n.endswith("proj.weight"))
    tokens, context = 37, 11
    got = prefill_flops(SimpleNamespace(**GEO), tokens, context)
    assert got["projection_flops"] == 2 * tokens * linear
    keys = sum(context + i + 1 for i in range(tokens))
    assert got["attention_flops"] == 2 * 2 * 4 * 16 * keys * 3
    assert got["head_flops"] == 2 * 64 * 300
    assert got["total_flops"] == got["projection_flops"] + got["attention_flops"] + got["head_flops"]


def test_matmul_reference_needs_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        measured_matmul_tflops()


def test_matmul_reference_is_the_best_trial():
    """The reference is the fastest trial's median (every trial kept), so a slow trial never lowers it."""
    from qualify.flops import best_of_trials

    n = 8192
    slow, fast = [2e-3, 2.2e-3, 2.1e-3], [1.4e-3, 1.5e-3, 1.45e-3]
    ref = best_of_trials(n, [slow, fast])
    assert ref["median_ms"] == pytest.approx(1.45) and ref["trial_median_ms"] == pytest.approx([2.1, 1.45])
    assert ref["tflops"] == pytest.approx(2 * n ** 3 / 1.45e-3 / 1e12)
    assert ref["tflops"] == max(ref["trial_tflops"]) and ref["samples_s"] == [slow, fast]
    with pytest.raises(ValueError, match="every trial needs samples"):
        best_of_trials(n, [slow, []])
