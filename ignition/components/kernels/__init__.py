"""The Triton kernels behind the opaque ops, one module per kernel family (CUDA only: each imports Triton, and the
ops import them lazily from their CUDA branch).

Validated on CPU with ``TRITON_INTERPRET=1`` (``tests/components/test_triton_kernels.py`` and the ops' tests, skipped
when Triton is not installed), offline for sm90 by ``scripts/sm90_kernel_check.py`` (ptxas: registers, spills, PTX
equality against a revision) and on the H200 by the GPU conformance matrix.

- :mod:`.launch` -- how the kernels launch: programmatic dependent launch (PDL) and what a kernel may do before its
  wait, the L2 prefetch helper, the diagnostic timing probe;
- :mod:`.rms_norm` -- the standalone RMSNorm;
- :mod:`.rope_write` -- per-head norms, rotary and the paged K/V write;
- :mod:`.paged_decode` -- the split decode attention (flash-decoding) and its reduce;
- :mod:`.decode_plan` -- the decode attention's launch plan: splits, key blocks, workspaces, prefetch, switches;
- :mod:`.fused_decode` -- norms, rotary, K/V write and decode attention in one launch;
- :mod:`.gemv` -- the decode-time projection on CUDA cores (one to a few rows);
- :mod:`.gemm_rows` -- the few-rows projection on tensor cores and its published norms;
- :mod:`.linear` -- the projections' configurations, switches and the ``flare::fused_linear`` launcher;
- :mod:`.prefill_attention` -- paged prefill attention (FlashAttention-2 forward);
- :mod:`.topk` -- top-k values per row;
- :mod:`.sampling_cut` -- the sampler's top-k / top-p cut without a sort, compacted and of sorted rows;
- :mod:`.rotary` -- the rotary embedding's cos and sin.
"""
