"""Helpers for the qwen3 preparation tests: tiny checkpoints, the canonical reference, a host-side driver.

The reference is transformers' own ``Qwen3ForCausalLM.from_pretrained`` with the eager attention path
and a ``DynamicCache``, stepped token by token -- never the code under test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from ignition.components.attention import slot_mapping_for

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=512,
            tie_word_embeddings=False)
BF16_EPS = 2.0 ** -8  # bf16 unit roundoff (8 significant bits)
BOUND_FACTOR = 4


def logit_bound(reference_logits: list[torch.Tensor]) -> float:
    """``BOUND_FACTOR * 2^-8 * max |reference logit|``: a few bf16 roundings of the largest logit."""
    return BOUND_FACTOR * BF16_EPS * max(float(l.abs().max()) for l in reference_logits)


def make_model(seed: int = 0, **overrides) -> Qwen3ForCausalLM:
    """A seeded canonical model; norm weights randomized so that swapped or skipped norms are visible."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**{**TINY, **overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.25)
    return model.to(torch.bfloat16).eval()


def make_checkpoint(path: Path, seed: int = 0, max_shard_size=None, **overrides) -> Path:
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    make_model(seed, **overrides).save_pretrained(path, **kw)
    return Path(path)


def quantize_fp8_block(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Test-side FP8 e4m3 block quantizer (amax / 448 per 128x128 block) -> (weight, weight_scale_inv)."""
    n, k = w.shape
    w = w.float()
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    s = torch.empty(math.ceil(n / block), math.ceil(k / block), dtype=torch.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            scale = blk.abs().max().clamp(min=1e-12) / 448.0
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = (blk / scale).to(torch.float8_e4m3fn)
            s[i, j] = scale
    return q, s


def dequantize_fp8_block(q: torch.Tensor, s: torch.Tensor, block: int = 128) -> torch.Tensor:
    """Independent reference: explicit loop over blocks, fp32 product, one rounding to bf16."""
    w = torch.empty(q.shape, dtype=torch.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            sl = (slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block))
            w[sl] = q[sl].float() * s[i, j]
    return w.to(torch.bfloat16)


def write_fp8_checkpoint(model: Qwen3ForCausalLM, fp8_dir: Path, dequant_dir: Path) -> None:
    """An FP8 block-scaled checkpoint of ``model``'s decoder projections, and its dequantized twin."""
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    fp8, deq = dict(state), dict(state)
    for name, w in state.items():
        if ".layers." in name and name.endswith("_proj.weight"):
            q, s = quantize_fp8_block(w)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            deq[name] = dequantize_fp8_block(q, s)
    model.load_state_dict(deq)
    model.save_pretrained(dequant_dir)
    fp8_dir.mkdir(parents=True, exist_ok=True)
    save_file(fp8, str(fp8_dir / "model.safetensors"))
    config = json.loads((dequant_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    (fp8_dir / "config.json").write_text(json.dumps(config, indent=2))


@torch.no_grad()
def canonical_greedy(path: Path, prompt: list[int], steps: int, device="cpu") -> tuple[list[int], list[torch.Tensor]]:
    """Prefill then ``steps`` greedy decodes; returns generated tokens and fp32 logits (on CPU) of each step."""
    ref = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="eager").to(device).eval()
    cache = DynamicCache(config=ref.config)  # passed positionally: past_key_values/cache renamed in 5.2x
    ids = lambda t: torch.tensor(t, device=device)  # noqa: E731
    logits = ref(ids([prompt]), None, None, cache, use_cache=True).logits[0, -1].float().cpu()
    tokens, all_logits = [], [logits]
    for _ in range(steps):
        tokens.append(int(logits.argmax()))
        logits = ref(ids([[tokens[-1]]]), None, None, cache, use_cache=True).logits[0, -1].float().cpu()
        all_logits.append(logits)
    return tokens, all_logits[:steps]


class Row:
    """Host-side state of one request: its pages and context length (what a scheduler would hold)."""

    def __init__(self, pages: list[int], page_size: int):
        self.pages, self.page_size, self.length = pages, page_size, 0

    def block_table(self, width: int) -> torch.Tensor:
        return torch.tensor(self.pages + [0] * (width - len(self.pages)), dtype=torch.int32)

    def inputs(self, tokens: list[int], width: int) -> dict[str, torch.Tensor]:
        bt = self.block_table(width)[None]
        pos = torch.arange(self.length, self.length + len(tokens))[None]
        self.length += len(tokens)
        return {"input_ids": torch.tensor([tokens]), "positions": pos,
                "slot_mapping": slot_mapping_for(bt, pos, torch.ones_like(pos, dtype=torch.bool), self.page_size),
                "block_tables": bt, "seq_lens": torch.tensor([self.length]), "active_rows": torch.tensor([True])}


def prefill(graphs, row: Row, prompt: list[int], chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = graphs.steps[0].max_pages
    for start in range(0, len(prompt), chunk):
        part = prompt[start:start + chunk]
        logits, tokens = graphs.step("prefill", 1, len(part)).run(**row.inputs(part, width))
    return logits[0].cpu().clone(), tokens[0].cpu().clone()


def prepared_greedy(graphs, row: Row, prompt: list[int], steps: int, chunk: int):
    """Prefill in chunks of ``chunk`` tokens, then ``steps`` greedy decodes of one row."""
    logits, token = prefill(graphs, row, prompt, chunk)
    width = graphs.steps[0].max_pages
    tokens, all_logits = [], [logits]
    for _ in range(steps):
        tokens.append(int(token))
        out_logits, out_tokens = graphs.step("decode", 1).run(**row.inputs([tokens[-1]], width))
        logits, token = out_logits[0].cpu().clone(), out_tokens[0].cpu().clone()
        all_logits.append(logits)
    return tokens, all_logits[:steps]


def batched_greedy(graphs, prompts: list[list[int] | None], steps: int, page_size: int, chunk: int,
                   pages_per_row: int = 8):
    """Rows prefilled one by one, then decoded together at one capacity; ``None`` marks an inactive row.
    Returns the decode logits ``[B, V]`` of each step (the tokens fed back are each row's own greedy)."""
    width = graphs.steps[0].max_pages
    rows = [Row(list(range(i * pages_per_row, (i + 1) * pages_per_row)), page_size) if p else None
            for i, p in enumerate(prompts)]
    nxt = [int(prefill(graphs, r, p, chunk)[1]) if r else 0 for r, p in zip(rows, prompts)]
    step = graphs.step("decode", len(prompts))
    out = []
    for _ in range(steps):
        parts = []
        for r, t in zip(rows, nxt):
            if r is None:
                parts.append({"input_ids": torch.tensor([[0]]), "positions": torch.tensor([[0]]),
                              "slot_mapping": torch.tensor([[-1]]),
                              "block_tables": torch.zeros(1, width, dtype=torch.int32),
                              "seq_lens": torch.tensor([0]), "active_rows": torch.tensor([False])})
            else:
                parts.append(r.inputs([t], width))
        logits, tokens = step.run(**{k: torch.cat([p[k] for p in parts]) for k in parts[0]})
        out.append(logits.cpu().clone())
        nxt = [int(t) for t in tokens.cpu()]
    return out


def stores_its_outputs(step) -> bool:
    """Whether a compiled step's head and sampler regions hand back the step's static ``(logits, tokens)`` themselves
    (their last kernels store there; no copy kernel after the regions).  Runs the step once on its static inputs."""
    with torch.no_grad():
        logits, tokens = step.fn(*(step.inputs[k] for k in step.names), out=(step.logits, step.tokens))
    return logits.data_ptr() == step.logits.data_ptr() and tokens.data_ptr() == step.tokens.data_ptr()
