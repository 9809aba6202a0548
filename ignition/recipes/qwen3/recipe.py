"""The qwen3 recipe (frontend part): Qwen3 dense models and the embedded default."""

from pathlib import Path

from ignition.recipes.base import FrontendSpec, Recipe, TemplateVariant

from .examples import CHECKPOINTS

RECIPE = Recipe(
    name="qwen3",
    architectures=("Qwen3ForCausalLM",),
    frontend=FrontendSpec(
        content_format="string",  # the template renders '' for non-string content
        thinking_kwarg="enable_thinking",
        default_thinking=True,
    ),
    variants=(
        TemplateVariant("qwen3", "chat_template.qwen3.patch.json", hidden_sizes=(1024, 4096)),
        TemplateVariant("flare-default", "chat_template.flare-default.patch.json", hidden_sizes=(64,)),
    ),
    checkpoints=CHECKPOINTS,
    tool_call_format="qwen",  # how replies carry tool calls (helios/frontend/tool_calls.py)
    capacities=(1, 2, 4, 8, 16, 32, 64),  # decode graph capacities (rows), = DECODE_CAPACITIES
    assets_dir=Path(__file__).parent / "assets",
    notes="Reasoning of assistant turns before the last user query is dropped from history by the template.",
)

# Model side (issue 3): the prepared model and its graph catalog (imported lazily: no torch for the frontend).
MODEL = "ignition.recipes.qwen3.model:PreparedQwen3"
DECODE_CAPACITIES = (1, 2, 4, 8, 16, 32, 64)  # rows per decode graph
PREFILL_CHUNKS = (256, 1024, 4096)  # tokens per prefill graph
SPECULATIVE_WIDTHS = (1, 2, 4, 8)  # verification round widths W (pending token + W-1 proposals), beside DECODE_CAPACITIES


def graph_catalog():
    from ignition.graphs.catalog import GraphCatalog

    return GraphCatalog(decode_capacities=DECODE_CAPACITIES, prefill_chunks=PREFILL_CHUNKS)
