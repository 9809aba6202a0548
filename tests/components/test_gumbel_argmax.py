"""``flare::gumbel_argmax`` (``ignition/components/sampling.py``, kernel ``kernels/gumbel.py``): the sampler's
Gumbel-max draw in one launch.

- Interpreter (CPU machines with Triton): the kernel's tokens against the traced reference
  (:func:`gumbel_argmax_reference`: ``uniform_noise``'s torch hash, the logs, the two-stage argmax) over rows kept
  whole, cut to a few values by -inf, to one value, dropped entirely, with a NaN, negative and 64-bit seeds, steps
  past 2**32, chunks that do not divide the row; the noise's bits themselves; the row counts back at zero.
- CPU: the op's reference is the sampler's draw (the switch changes nothing off CUDA); arguments checked by name.
- The vocabulary-sized rows on the H200: ``test_components_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from ignition.components import sampling
from ignition.components.sampling import gumbel_argmax_op, gumbel_argmax_reference, uniform_noise
from test_triton_attention import interpreter  # sets TRITON_INTERPRET on CPU machines before triton is imported


def _rows(v: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Six rows of ``v`` values: whole, a few kept (-inf elsewhere), one kept, none kept, one NaN, large values; with
    seeds of both signs and steps past 2**32."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(6, v, generator=gen) * 3
    y[1, torch.randperm(v, generator=gen)[: v - 7]] = float("-inf")
    y[2] = float("-inf")
    y[2, v // 2 + 1] = 0.5
    y[3] = float("-inf")
    y[4, v // 3] = float("nan")
    y[5] = y[5] * 1e3
    seeds = torch.tensor([0, -1, 1 << 62, -(1 << 63), 123456789, 42], dtype=torch.int64)
    steps = torch.tensor([0, 1, (1 << 32) + 5, 7, 1 << 40, 99], dtype=torch.int64)
    return y, seeds, steps


@interpreter
@pytest.mark.parametrize("v,chunk", [(10_000, 1024), (4096, 4096), (5000, 256), (151_936, 4096)])
def test_kernel_draws_the_reference_token(v, chunk):
    from ignition.components.kernels import gumbel, launch

    y, seeds, steps = _rows(v, seed=v)
    want = gumbel_argmax_reference(y, seeds, steps)
    got = gumbel.gumbel_argmax_triton(y, seeds, steps, chunk=chunk)
    assert got.dtype == torch.int64 and torch.equal(got, want), (got, want)
    assert int(got[3]) == 0 and int(got[4]) == v // 3 and int(got[2]) == v // 2 + 1
    assert not gumbel._COUNTS[launch.device_key(y.device)].any()
    # many draws of one row: the tokens follow its probabilities' support and change with the step
    row = torch.full((1, v), float("-inf"))
    row[0, :5] = torch.tensor([0.0, 1.0, 2.0, 0.5, -1.0])
    tokens = {int(gumbel.gumbel_argmax_triton(row, seeds[:1], torch.tensor([s]), chunk=chunk)) for s in range(40)}
    assert tokens <= set(range(5)) and len(tokens) >= 3


@interpreter
def test_kernel_noise_is_the_reference_noise_bit_for_bit():
    """The kernel's hash in uint32 lanes against ``uniform_noise``'s int64 one: a row of zeros draws the index of the
    largest ``-log(-log u)``, i.e. of the largest ``u`` -- compared over many (seed, step) pairs, and the noise itself
    through a row that keeps exactly the indices where the reference's ``u`` tops a threshold."""
    from ignition.components.kernels import gumbel

    v = 3000
    seeds = torch.tensor([5, -7, 1 << 50, -(1 << 40)], dtype=torch.int64)
    for step in (0, 3, (1 << 33) + 1):
        steps = torch.full((4,), step, dtype=torch.int64)
        u = uniform_noise(seeds, steps, v)
        got = gumbel.gumbel_argmax_triton(torch.zeros(4, v), seeds, steps, chunk=512)
        assert torch.equal(got, u.argmax(dim=-1))


def test_op_off_cuda_is_the_reference_and_checks_its_arguments(monkeypatch):
    y, seeds, steps = _rows(777)
    assert torch.equal(gumbel_argmax_op(y, seeds, steps), gumbel_argmax_reference(y, seeds, steps))
    monkeypatch.setenv("FLARE_GUMBEL_KERNEL", "1")  # CUDA only: the CPU sampler keeps the traced draw
    assert torch.equal(sampling.gumbel_argmax(y, seeds, steps), gumbel_argmax_reference(y, seeds, steps))
    with pytest.raises(ValueError, match="filtered"):
        gumbel_argmax_op(y.double(), seeds, steps)
    with pytest.raises(ValueError, match="seed"):
        gumbel_argmax_op(y, seeds.int(), steps)
    with pytest.raises(ValueError, match="step"):
        gumbel_argmax_op(y, seeds, steps[:3])
