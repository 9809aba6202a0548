"""``flare run --embedding-table-storage ram|disk``: the token-embedding rows are gathered on the host and
passed to the step as ``input_embeds``; served output equals the device table's token for token, and an
untied model keeps no device copy of the table."""

from __future__ import annotations

import shutil

import openai
import pytest
import torch

from helios.runtime.engine import EngineConfig, load_engine

MODEL = "flare/embedded-default"
ARGS = ("--max-context", "512", "--kv-tokens", "8192")
PROMPTS = ["Tell me about the lamps.", "Request 2: " + "the boxes and the lamps, " * 20]


def _served(server, **sampling) -> list[str]:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    return [client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=16,
                                           seed=11, **sampling).choices[0].message.content for p in PROMPTS]


@pytest.fixture(scope="module")
def servers(server_factory, ranged_core):
    return {s: server_factory(*ARGS, "--embedding-table-storage", s, core=ranged_core, in_process=True)
            for s in ("device", "ram", "disk")}


@pytest.mark.parametrize("storage", ["ram", "disk"])
def test_served_output_with_host_embeddings_equals_device_storage(servers, storage):
    for sampling in (dict(temperature=0.0), dict(temperature=0.6)):  # greedy, and seeded sampling
        assert _served(servers[storage], **sampling) == _served(servers["device"], **sampling)


def _logits(engine) -> list[torch.Tensor]:
    """Prefill one prompt and decode three tokens; the fp32 logits of each step."""
    d, pages = engine.driver, list(range(4))
    prompt = [(i * 37 + 5) % 4000 + 10 for i in range(40)]
    token = d.prefill(pages, 0, prompt, {"temperature": 0.0}, prompt, 0, False)
    out = [d.graphs.step("prefill", 1, 256).logits[0].clone()]
    for i in range(3):
        token = d.decode([(pages, len(prompt) + i, token)])[0]
        out.append(d.graphs.step("decode", 1).logits[0].clone())
    return out


@pytest.fixture(scope="module")
def untied_core(tmp_path_factory):
    """The embedded default geometry with an untied lm_head (seeded weights), exported to a core."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ignition.checkpoints import embedded_default_checkpoint
    from ignition.preparation import export

    embedded = embedded_default_checkpoint()
    root = tmp_path_factory.mktemp("untied")
    config = Qwen3Config.from_pretrained(embedded)
    config.tie_word_embeddings = False
    torch.manual_seed(3)
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(root / "ckpt")
    for name in ("tokenizer.json", "tokenizer_config.json", "flare-synth.json"):
        shutil.copy(embedded / name, root / "ckpt" / name)
    export(str(root / "ckpt"), str(root / "core"), decode=(1, 2), prefill=(256,), device="cpu", compile=False,
           progress=False)
    return root / "core"


def test_untied_host_embeddings_leave_no_device_table_and_match_bitwise(untied_core):
    config = dict(kv_tokens=1024, max_context=512)
    device = load_engine(untied_core, EngineConfig(**config))
    assert not device.driver.model.hf.model.embed_tokens.weight.is_meta
    expected = _logits(device)
    for storage in ("ram", "disk"):
        engine = load_engine(untied_core, EngineConfig(**config, embedding_table_storage=storage))
        model = engine.driver.model
        assert not model.config.tie_word_embeddings
        assert model.hf.model.embed_tokens.weight.is_meta  # never allocated on the device
        assert all("input_embeds" in s.inputs for s in engine.driver.graphs.steps)
        assert any("no device copy" in line for line in engine.description)
        got = _logits(engine)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), storage


def test_tied_host_embeddings_keep_a_device_copy_for_the_head_only(ranged_core):
    engine = load_engine(ranged_core, EngineConfig(kv_tokens=1024, max_context=512, embedding_table_storage="ram"))
    model = engine.driver.model
    assert model.config.tie_word_embeddings and not model.hf.model.embed_tokens.weight.is_meta
    assert model.takes_input_embeds and engine.driver.embeddings is not None
    assert any("tied lm_head" in line for line in engine.description)
