"""``qualify.fixed_memory`` off the GPU: the KV capacity in tokens from the measured memory (the arithmetic the report
states), and the CLI's refusals, which come before any core is loaded."""

from __future__ import annotations

import pytest
import torch

from qualify import fixed_memory

GiB = 1 << 30


def test_kv_capacity_counts_whole_pages_beside_everything_measured():
    # Qwen3-8B: K and V of 36 layers x 8 KV heads x 128 dims in bf16 = 144 KiB per token, 2.25 MiB per 16-token page.
    # A 100 GiB device with 40 GiB free, 1 GiB of the 60 in use the measurement's own KV pool: at 0.9 the budget is
    # 90 - (60 - 1) = 31 GiB = 31 x 1024 / 2.25 = 14,108.4 pages of 2.25 MiB -> 14,108 whole pages, one of them the
    # sink.
    page = 2 * 36 * 16 * 8 * 128 * 2
    got = fixed_memory.kv_capacity(40 * GiB, 100 * GiB, 1 * GiB, page, 16, 0.9)
    assert got["bytes_per_token"] == 144 * 1024 and got["budget_bytes"] == 31 * GiB
    assert got["pages"] == 14_107 and got["tokens"] == 14_107 * 16
    # a device already past the budget holds no page (not a negative count)
    assert fixed_memory.kv_capacity(5 * GiB, 100 * GiB, 0, page, 16, 0.9)["pages"] == 0
    with pytest.raises(ValueError, match="fraction in"):
        fixed_memory.kv_capacity(40 * GiB, 100 * GiB, 0, page, 16, 1.5)


@pytest.mark.parametrize("argv,needle", [(["--kv-pages", "0"], "--kv-pages 0"),
                                         (["--capacities", "1,x"], "--capacities '1,x'"),
                                         (["--prefill", "0"], "--prefill '0'")])
def test_cli_refuses_bad_sizes_by_name(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        fixed_memory.main(["no-such-core", *argv])
    assert exc.value.code == 2 and needle in capsys.readouterr().err


def test_module_bytes_splits_parameters_from_buffers_and_counts_tied_storage_once():
    """By hand: an embedding of 10 x 4 fp32 tied to the head (160 bytes, once), a 4-element bf16 norm weight (8), and
    a rotary table buffer of 6 fp32 (24)."""
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.Module()
    model.emb, model.head = emb, head
    model.norm = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    model.register_buffer("inv_freq", torch.zeros(6))
    assert fixed_memory.module_bytes(model) == {"parameters": 160 + 8, "buffers": 24}
