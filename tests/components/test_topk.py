"""``flare::topk_values`` (``ignition/components/topk.py``): each row's ``k`` largest values, descending.

- CPU (everywhere): the op is ``torch.topk``'s values; shapes and ``k`` are checked naming the bad value; the
  bounded sampler through it samples what the sorting sampler samples (``test_sampling_graph.py`` covers that path).
- Interpreter (``TRITON_INTERPRET=1``, CPU machines with Triton): the two-pass Triton kernel against ``torch.topk``
  -- equal value for value (the values are selected, never computed) on rows with ties, ``-inf`` (min-p masks),
  fewer real entries than a chunk, ``k`` not a power of two and ``k`` equal to the row length.
- The H200 half is ``test_components_gpu.py`` (the vocabulary-sized row, compiled).
"""

from __future__ import annotations

import pytest
import torch

from ignition.components.topk import topk_values, topk_values_reference
from test_triton_attention import interpreter  # sets TRITON_INTERPRET on CPU machines before triton is imported


def _rows(b, v, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, v, generator=gen) * 4
    x[:, ::7] = x[:, 3:4]  # ties: every 7th entry repeats one value
    x[0, : v // 3] = float("-inf")  # a row partly masked (min-p)
    if b > 1:
        x[1] = torch.round(x[1])  # many ties
    return x


def test_cpu_op_is_torch_topk_and_names_bad_arguments():
    x = _rows(3, 1000, 0)
    for k in (1, 20, 64, 1000):
        assert torch.equal(topk_values(x, k), torch.topk(x, k).values)
    with pytest.raises(ValueError, match="k=0"):
        topk_values(x, 0)
    with pytest.raises(ValueError, match="k=1001"):
        topk_values(x, 1001)
    with pytest.raises(ValueError, match="float32"):
        topk_values(x.to(torch.bfloat16), 4)
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        topk_values(x[0], 4)


def test_compiled_op_equals_eager():
    x = _rows(2, 3000, 1)
    fn = torch.compile(lambda t: topk_values(t, 24) * 2.0, backend="aot_eager", fullgraph=True)
    assert torch.equal(fn(x), topk_values(x, 24) * 2.0)


@interpreter
@pytest.mark.parametrize("b,v,k", [(3, 5000, 64), (1, 9000, 32), (3, 1000, 20), (1, 40, 40), (2, 900, 1)])
def test_triton_kernel_equals_torch_topk(b, v, k):
    from ignition.components.kernels.topk import topk_values_triton

    x = _rows(b, v, v + k)
    got = topk_values_triton(x, k)
    assert got.shape == (b, k)
    assert torch.equal(got, topk_values_reference(x, k))
