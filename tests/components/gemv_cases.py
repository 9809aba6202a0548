"""Inputs and error bound of the decode projection kernels' tests, shared by the interpreter tests
(``test_triton_kernels.py``, skipped as a module on GPU machines) and the GPU tests (``test_components_gpu.py``)."""

from __future__ import annotations

import torch


def _gemv_inputs(m, n, k, *, norm, gated, residual, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=gen) * 2).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(torch.bfloat16)
    nw = (torch.rand(k, generator=gen) + 0.5).to(torch.bfloat16) if norm else None
    n_out = n // 2 if gated else n
    r = torch.randn(m, n_out, generator=gen).to(torch.bfloat16) if residual else None
    return x, w, nw, r


def _gemv_tolerance(x, w, nw, gated, ref):
    """2 bf16 ulps of the result (|ref| * 2^-7 each: one for the fp32 summation order moving the value across
    a rounding boundary, one for the interpreter truncating where the GPU rounds to nearest), plus an absolute
    term for cancellation: a reordered fp32 sum differs by a few fp32 ulps of sum_k |x_k w_k|, which is more
    than a bf16 ulp of a result near zero (2^-20 of that sum: 16 fp32 ulps).

    Looser where the kernel's bf16 intermediates can differ from the reference's: the norm prologue's xn
    (interpreter truncation vs round-to-nearest: up to one ulp, 2^-7 relative, in about half the elements, and
    rarely a neighbouring value from the fp32 statistics) perturbs the sum by a random walk of those per-term
    errors -- bounded by 6 sigma of it, 2^-7 * 6 * sqrt(sum_k (xn_k w_k)^2) / sqrt(3) (uniform errors); the gated
    epilogue's gate, up and silu roundings propagate through the product (``reorder_bound``'s local slope), and its
    final rounding is the same two ulps."""
    from ignition.components.fused_linear import reorder_bound
    from ignition.components.norms import rms_norm_reference

    xn = rms_norm_reference(x, nw, 1e-6) if nw is not None else x
    tol_abs = reorder_bound(xn, w, norm=nw is not None, gated=gated)
    return 2 * 2.0 ** -7 * ref.float().abs() + tol_abs


def _gated_input_tolerance(x, w, ref):
    """The bound of a gated-input projection (``x``: the packed ``[gate; up]`` of ``2 * K`` columns) against its
    reference ``ref`` without the residual: 2 bf16 ulps of the result plus the reordered sums of the activation
    ``silu(gate) * up``, whose bf16 rounding perturbs them like a norm prologue's."""
    import torch.nn.functional as F

    from ignition.components.fused_linear import reorder_bound

    k = w.shape[1]
    act = F.silu(x[:, :k]) * x[:, k:]
    return 2 * 2.0 ** -7 * ref.float().abs() + reorder_bound(act, w, norm=True, gated=False)
