"""FLOPs of a prefill chunk and the measured bf16 matmul throughput it is compared with (issue 4 §6).

``prefill_flops(geometry, tokens, context)`` counts the multiply-adds x 2 of one chunk of ``tokens`` tokens at
positions ``context .. context + tokens - 1`` of a Qwen3-layout model:

- every decoder layer's projections (fused Q/K/V, O, fused gate/up, down): ``2 x tokens x parameters``;
- attention: ``QK^T`` and ``PV`` over the keys each query actually sees (causal, ``context + i + 1`` keys for
  query ``i``): ``2 x 2 x heads x head_dim x sum_i (context + i + 1)`` per layer;
- the vocabulary projection of the last token only (the step samples one token): ``2 x hidden x vocab``.

Norms, rotary, activations and sampling are not counted (bandwidth-bound, a rounding error in FLOPs).

``measured_matmul_tflops(n=8192)`` times a captured ``n x n x n`` bf16 matmul (cuBLAS) by CUDA events: the
reference the prefill targets are stated against ("% of the measured bf16 matmul throughput").  One process's
measurement moved between 710 and 799 TFLOP/s on the H200 (runs 10, 12, 16, 24 in ``results/``), so the reference is
the **best** of ``trials`` separately timed trials (each the median of its samples), every trial kept: the highest
throughput the card showed, so a share of it is never flattered by a slow measurement.  CUDA only.
"""

from __future__ import annotations

import functools


def prefill_flops(g, tokens: int, context: int = 0) -> dict:
    """``g``: a core manifest's ``geometry`` (or any object with its field names)."""
    h, layers, heads, kv, d = g.hidden_size, g.num_layers, g.num_attention_heads, g.num_kv_heads, g.head_dim
    inter, vocab = g.intermediate_size, g.vocab_size
    layer_params = h * (heads + 2 * kv) * d + heads * d * h + 2 * h * inter + inter * h
    projections = 2 * tokens * layer_params * layers
    keys = tokens * context + tokens * (tokens + 1) // 2
    attention = 4 * heads * d * keys * layers
    head = 2 * h * vocab
    return {"tokens": tokens, "context": context, "projection_flops": projections, "attention_flops": attention,
            "head_flops": head, "total_flops": projections + attention + head,
            "rule": "2 x tokens x layer parameters + 4 x heads x head_dim x visible keys per layer + last-token "
                    "vocabulary projection"}


def best_of_trials(n: int, trials: list[list[float]]) -> dict:
    """The reference from per-trial sample lists (seconds): each trial's median, the best (fastest) of them."""
    from qualify.timing import summarize

    if not trials or not all(trials):
        raise ValueError("best_of_trials: every trial needs samples")
    medians = [summarize(t)["median_ms"] for t in trials]
    best = min(medians)
    flops = 2 * n ** 3
    return {"n": n, "trials": len(trials), "samples_s": trials, "trial_median_ms": medians,
            "trial_tflops": [flops / (m / 1e3) / 1e12 for m in medians], "median_ms": best,
            "tflops": flops / (best / 1e3) / 1e12, "rule": "best of the trials' medians"}


def measured_matmul_tflops(n: int = 8192, samples: int = 30, warmup: int = 5, trials: int = 3) -> dict:
    import torch

    from qualify.timing import captured, time_samples

    if not torch.cuda.is_available():
        raise RuntimeError("the matmul throughput reference needs a CUDA GPU")
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    graph = captured(functools.partial(torch.matmul, a, b, out=out), warmup=1)
    runs = [time_samples(graph.replay, samples=samples, warmup=warmup, device="cuda") for _ in range(trials)]
    del graph, a, b, out
    torch.cuda.empty_cache()
    return best_of_trials(n, runs)
