"""The Triton kernels behind the opaque ops, run by Triton's CPU interpreter (``TRITON_INTERPRET=1``) against
their PyTorch references.  Skipped where Triton is not installed (the CPU CI image has no Triton: these run
on the GPU image and wherever Triton is importable); the GPU conformance matrix runs them compiled."""

from __future__ import annotations

import os

import pytest
import torch

if torch.cuda.is_available():  # the interpreter would also take over Inductor's kernels in this process
    pytest.skip("interpreter tests run on CPU machines; the GPU matrix runs the compiled kernels",
                allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first import of triton
pytest.importorskip("triton", reason="Triton is not installed here")

from ignition.components.norms import rms_norm_reference  # noqa: E402


@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 4, 128), (1, 1, 4096), (7, 1000)])
def test_rms_norm_triton_matches_the_reference_within_one_bf16_rounding(shape):
    from ignition.components.triton_kernels import rms_norm_triton

    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen) * 3).to(torch.bfloat16)
    w = (torch.rand(shape[-1], generator=gen) + 0.5).to(torch.bfloat16)
    got, ref = rms_norm_triton(x, w, 1e-6), rms_norm_reference(x, w, 1e-6)
    assert got.shape == ref.shape and got.dtype == ref.dtype and got.is_contiguous()
    # the fp32 sum order differs: the normalized value may round to the neighbouring bf16 (then the weight
    # product may too): at most 2 bf16 ulps of the result.  (Triton 3.6's interpreter converts fp32 -> bf16 by
    # truncation, not round-to-nearest-even as the GPU does, so bit identity is not asserted here.)
    ulp = 2.0 ** -7 * ref.float().abs().clamp(min=2.0 ** -126)
    assert ((got.float() - ref.float()).abs() <= 2 * ulp).all()


def test_rms_norm_triton_reads_strided_rows():
    from ignition.components.triton_kernels import rms_norm_triton

    base = torch.randn(4, 3 * 128).to(torch.bfloat16)
    x = base[:, 128:256].view(4, 1, 128)  # a slice of a fused projection's output (row stride 384)
    w = torch.ones(128, dtype=torch.bfloat16)
    assert torch.equal(rms_norm_triton(x, w, 1e-6), rms_norm_triton(x.contiguous(), w, 1e-6))
