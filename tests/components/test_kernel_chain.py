"""``scripts/bench_kernel_chain.py``: the chain of dependent kernels computes ``initial + links`` (checked before
anything is timed, here in the Triton interpreter), the check catches a chain that skips a link, and the command
refuses bad arguments (the timing itself needs a GPU: ``h200_run.sh`` stage ``chain``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from test_triton_attention import interpreter  # sets TRITON_INTERPRET on CPU machines before triton is imported

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("bench_kernel_chain", ROOT / "scripts" / "bench_kernel_chain.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@interpreter
@pytest.mark.parametrize("variant", ["plain", "pdl", "early"])
def test_the_chain_adds_one_per_link(variant):
    chain = _script()
    chain.check(3000, 5, variant, 1024, "cpu")  # 3 programs, the last one masked
    a = torch.arange(10, dtype=torch.float32)
    out = chain.run_chain((a.clone(), torch.zeros_like(a)), 4, variant, 16)
    assert torch.equal(out, a + 4)


@interpreter
def test_the_check_catches_a_missing_link(monkeypatch):
    chain = _script()
    real = chain.run_chain
    monkeypatch.setattr(chain, "run_chain", lambda bufs, links, variant, block: real(bufs, links - 2, variant, block))
    with pytest.raises(AssertionError, match="values wrong after 5 links"):
        chain.check(100, 5, "plain", 64, "cpu")


def test_bad_arguments_are_refused(capsys):
    pytest.importorskip("triton", reason="Triton is not installed here")
    chain = _script()
    for bad in (["--links", "1"], ["--block", "1000"], ["--sizes", "0"], ["--samples", "0"]):
        with pytest.raises(SystemExit):
            chain.main(bad)
    if not torch.cuda.is_available():
        assert chain.main(["--links", "2"]) == 2 and "no CUDA device" in capsys.readouterr().err
