"""The deepseek_v3 recipe (frontend part): DeepSeek-V3 architecture checkpoints."""

from pathlib import Path

from ignition.recipes.base import FrontendSpec, Recipe, TemplateVariant

from .examples import CHECKPOINTS

RECIPE = Recipe(
    name="deepseek_v3",
    architectures=("DeepseekV3ForCausalLM",),
    frontend=FrontendSpec(
        content_format="string",  # message['content'] is concatenated as a string
        developer_role=False,  # the template renders no 'developer' role (it would vanish); lowered to system
        thinking_kwarg=None,  # no reasoning switch in the V3 template
        default_thinking=None,
        reasoning_field="reasoning_content",  # the V3 template ignores reasoning
        tool_arguments="json",  # arguments are concatenated as text into a ```json fence
        assistant_null_content=True,  # tool calls render only when content is none
        renders_tools=False,  # the V3 template never renders tool definitions: reject them rather than drop them
    ),
    variants=(TemplateVariant("deepseek_v3", "chat_template.deepseek_v3.patch.json", hidden_sizes=(7168,)),),
    checkpoints=CHECKPOINTS,
    tool_call_format="deepseek",  # how replies carry tool calls (helios/frontend/tool_calls.py)
    capacities=(1, 4),
    assets_dir=Path(__file__).parent / "assets",
    notes=(
        "Template behaviours: every system message, wherever it stands, is hoisted into the preamble "
        "(bos + system prompts joined by blank lines), so adding or changing one changes the whole prompt from "
        "byte 1. tools are not rendered at all; reasoning is ignored; an assistant message with content renders "
        "no tool calls (tool calls render only for content null). The namespace flags is_first and "
        "is_output_first are never reset: only the conversation's first tool-calling message gets "
        "'<｜Assistant｜><｜tool▁calls▁begin｜>', the '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' closer follows every "
        "later call but never the conversation's first one, and only the first tool output gets "
        "'<｜tool▁outputs▁begin｜>'. An assistant reply after tool outputs starts with '<｜tool▁outputs▁end｜>' instead "
        "of '<｜Assistant｜>'; a conversation ending in tool outputs gets '<｜tool▁outputs▁end｜>' and no generation "
        "header, and a user message after tool outputs gets no closer, so the tool endpoint is placed after "
        "'<｜tool▁output▁end｜>'. User turns have no closing wrapper. Tool-call arguments are re-serialized from the "
        "normalized object (json.dumps, ensure_ascii=False), which may differ from the bytes the model emitted."
    ),
)
