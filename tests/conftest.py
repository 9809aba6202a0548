import os

import pytest
import torch

from ignition.hub import default_hub_cache

# Triton's interpreter on machines without CUDA, set before any test module imports triton.  The test modules that
# set it themselves did so too late when another imported triton first: `pytest tests/components/test_fused_linear.py
# tests/components/test_triton_kernels.py` failed 41 tests ("Cannot call @triton.jit'd outside of the scope of a
# kernel"), the kernels compiled for a GPU that is not there.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def hub_cache():
    return default_hub_cache()
