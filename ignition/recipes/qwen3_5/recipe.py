"""The qwen3_5 recipe (frontend part): Qwen3.5 image-text models."""

from pathlib import Path

from ignition.recipes.base import FrontendSpec, Recipe, TemplateVariant

from .examples import CHECKPOINTS

RECIPE = Recipe(
    name="qwen3_5",
    architectures=("Qwen3_5ForConditionalGeneration",),
    frontend=FrontendSpec(
        # render_content iterates typed items: text items are concatenated without a separator, each
        # image item becomes '<|vision_start|><|image_pad|><|vision_end|>' (one placeholder token).
        content_format="blocks",
        image_token="<|image_pad|>",
        thinking_kwarg="enable_thinking",  # '<think>\n' opens the generation unless enable_thinking is false
        default_thinking=True,
        developer_role=False,  # any role but system/user/assistant/tool raises 'Unexpected message role.'
        reasoning_field="reasoning_content",
    ),
    variants=(TemplateVariant("qwen3_5", "chat_template.qwen3_5.patch.json", hidden_sizes=(2560,)),),
    checkpoints=CHECKPOINTS,
    tool_call_format="qwen",  # how replies carry tool calls (helios/frontend/tool_calls.py)
    capacities=(1, 4),
    assets_dir=Path(__file__).parent / "assets",
    notes=(
        "Template behaviours that break prefix reuse: assistant reasoning is rendered ('<think>\\n…\\n</think>\\n\\n', "
        "even when empty) only for assistant turns after the last real user query, so a new user message "
        "re-renders the previous tool round without its reasoning; every message's content and reasoning is "
        "trimmed; '<think>…</think>' embedded in assistant content is split out when no reasoning_content is given; "
        "consecutive tool messages share one user turn and only the last of a run is closed by '<|im_end|>\\n' "
        "(a tool endpoint followed by another tool ends after '</tool_response>'). A system message is allowed "
        "only first (the template raises otherwise) and may not hold images. Content passes through the "
        "render_content macro, so tracked spans (block hints, literal special-token spellings) do not survive it."
    ),
)
