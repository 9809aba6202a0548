"""``flare::sampler_front`` (``ignition/components/sampling.py``, kernels ``kernels/sampler_front.py``): the sampler's
penalties, temperature, greedy token and min-p mask in two launches.

- Interpreter (CPU machines with Triton): the kernels' ``(greedy, scaled)`` against the traced reference
  (:func:`sampler_front_reference`: ``apply_penalties``, ``apply_temperature``, ``apply_min_p``, ``argmax_last``) bit
  for bit -- bf16 and float32 logits, with and without the penalty state, greedy and sampled rows, min-p off and on,
  a NaN, -inf values, ties of the maximum, chunks that do not divide the row; the row tickets back at zero.
- CPU: the op's reference is ``filter_cut``'s front; ``sample`` with the switch (CUDA only) unchanged off CUDA;
  arguments checked by name.
- The vocabulary-sized rows on the H200: ``test_components_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from ignition.components.sampling import (SamplingTensors, argmax_last, filter_cut, sample, sampler_front_op,
                                          sampler_front_reference)
from test_triton_attention import interpreter  # sets TRITON_INTERPRET on CPU machines before triton is imported


def front_case(v: int, dtype=torch.bfloat16, seed: int = 0):
    """``(logits, counts, prompt_mask, repetition, frequency, presence, temperature, min_p)`` of six rows: sampled
    and greedy, min-p on and off, repetition above and below 1, a row with a NaN, one with -inf values and a tie of its
    maximum."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(6, v, generator=gen) * 4).to(dtype)
    logits[3, v // 2] = float("nan")
    logits[4, : v // 3] = float("-inf")
    logits[5, 7] = logits[5, v - 2] = logits[5].float().max() + 1  # a tie of the maximum: the first wins
    counts = torch.randint(0, 3, (6, v), generator=gen, dtype=torch.int32) * (torch.rand(6, v, generator=gen) < 0.01)
    prompt = torch.rand(6, v, generator=gen) < 0.02
    f = lambda *x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    return (logits, counts.to(torch.int32), prompt, f(1.1, 1.0, 0.8, 1.3, 1.0, 1.2), f(0.1, 0.0, 0.5, -0.2, 0.0, 0.3),
            f(0.4, 0.0, -0.5, 0.2, 0.0, 1.0), f(0.7, 0.0, 1.3, 1.0, 0.0, 2.0), f(0.05, 0.0, 0.1, 0.0, 0.3, 0.0))


def _bits(a, b):
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


@interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("penalties", [True, False])
@pytest.mark.parametrize("v,chunk", [(5000, 1024), (4096, 4096), (3000, 256)])
def test_kernels_equal_the_reference_bit_for_bit(dtype, penalties, v, chunk):
    from ignition.components import sampling
    from ignition.components.kernels import launch, sampler_front

    case = list(front_case(v, dtype, seed=v + penalties))
    if not penalties:
        case[1] = case[2] = None
    want_greedy, want_scaled = sampler_front_reference(*case)
    greedy, scaled = sampler_front.sampler_front_triton(*case, sampling.GREEDY_EPS, chunk=chunk)
    assert torch.equal(greedy, want_greedy), (greedy, want_greedy)
    assert _bits(scaled, want_scaled)
    assert int(greedy[3]) == v // 2 and int(greedy[5]) == 7  # the NaN, the first of the tied maxima
    assert (scaled[4, : v // 3] == float("-inf")).all() and (scaled[2] == float("-inf")).any()  # min-p cut row 2
    assert not sampler_front._COUNTS[launch.device_key(scaled.device)].any()


def test_op_off_cuda_is_filter_cut_s_front_and_checks_its_arguments(monkeypatch):
    v = 777
    case = front_case(v, torch.float32)
    rows = [{"temperature": t, "min_p": m, "repetition_penalty": r, "frequency_penalty": f, "presence_penalty": p,
             "seed": i} for i, (t, m, r, f, p) in enumerate(zip(*(x.tolist() for x in (case[6], case[7], case[3],
                                                                                    case[4], case[5]))))]
    rows = [{k: (max(x, 1e-3) if k == "repetition_penalty" else x) for k, x in r.items()} for r in rows]
    params = SamplingTensors.from_resolved(rows, 6, vocab_size=v)
    params.output_counts.copy_(case[1]), params.prompt_mask.copy_(case[2])
    x, y, _ = filter_cut(case[0], params)
    greedy, scaled = sampler_front_op(case[0], params.output_counts, params.prompt_mask, params.repetition_penalty,
                                      params.frequency_penalty, params.presence_penalty, params.temperature,
                                      params.min_p)
    assert torch.equal(greedy, argmax_last(x)) and _bits(scaled, y)
    monkeypatch.setenv("FLARE_SAMPLER_FRONT_KERNEL", "1")  # CUDA only: the CPU sampler is unchanged
    tokens = sample(case[0], params)
    monkeypatch.setenv("FLARE_SAMPLER_FRONT_KERNEL", "0")
    assert torch.equal(tokens, sample(case[0], params))
    with pytest.raises(ValueError, match="logits"):
        sampler_front_op(case[0].int(), *case[1:])
    with pytest.raises(ValueError, match="come together"):
        sampler_front_op(case[0], case[1], None, *case[3:])
    with pytest.raises(ValueError, match="counts"):
        sampler_front_op(case[0], case[1].long(), *case[2:])
    with pytest.raises(ValueError, match="min_p"):
        sampler_front_op(*case[:7], case[7][:2])
