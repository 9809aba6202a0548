"""The gemma4 recipe (frontend part): Gemma 4 E2B/E4B and 12B/26B-A4B/31B."""

from pathlib import Path

from ignition.recipes.base import FrontendSpec, Recipe, TemplateVariant

from .examples import CHECKPOINTS

RECIPE = Recipe(
    name="gemma4",
    architectures=("Gemma4ForConditionalGeneration",),
    frontend=FrontendSpec(
        # The template iterates typed items: "{%- for item in message['content'] -%}" with
        # "{%- elif item.get('type') in ['image', 'image_url'] -%}{{- '<|image|>' -}}".
        content_format="blocks",
        # Only a *first* developer message joins the preamble ("messages[0]['role'] in ['system', 'developer']");
        # anywhere else it would open "<|turn>developer", a role the card does not name. Lowered to system.
        developer_role=False,
        # "{%- set enable_thinking = enable_thinking | default(false) -%}" (E2B/E4B: "enable_thinking is defined
        # and enable_thinking"): off unless asked; on, "<|think|>\n" opens the system turn.
        thinking_kwarg="enable_thinking",
        default_thinking=False,
        image_token="<|image|>",  # special id 258880 in tokenizer.json
        # "{%- set thinking_text = message.get('reasoning') or message.get('reasoning_content') -%}"
        reasoning_field="reasoning",
    ),
    variants=(
        # google/gemma-4-E4B-it@ee0ef602 chat_template.jinja (E2B's is byte-identical)
        TemplateVariant("google-e2b-e4b", "chat_template.google-e2b-e4b.patch.json", hidden_sizes=(1536, 2560)),
        # google/gemma-4-26B-A4B-it@4d7ae498 chat_template.jinja (31B@842da379 is byte-identical)
        TemplateVariant("google", "chat_template.google.patch.json", hidden_sizes=(2816, 3840, 5376)),
    ),
    checkpoints=CHECKPOINTS,
    tool_call_format="gemma",  # how replies carry tool calls (helios/frontend/tool_calls.py)
    capacities=(1, 4),
    assets_dir=Path(__file__).parent / "assets",
    notes=(
        "Marks: after the preamble (<|think|>, a first system/developer message, tool declarations, closing "
        "'<turn|>\\n'); after each role:tool message's '<|tool_response>…<tool_response|>' block and its media "
        "placeholders, which the template renders inside the preceding assistant turn (so tool endpoints come "
        "before that assistant message's own endpoint); after every other message's closing ('<turn|>\\n', an "
        "open '<|tool_response>' after unanswered tool calls, or nothing when the model turn continues into a "
        "following assistant message). The legacy assistant 'tool_responses' field is never produced by "
        "lowering and is not marked. "
        "Thinking disabled: the google (12B/26B-A4B/31B) template's generation prompt is "
        "'<|turn>model\\n<|channel>thought\\n<channel|>' (an empty thought channel); E2B/E4B's is '<|turn>model\\n'. "
        "After tool results there is no '<|turn>model\\n' header: thinking off adds nothing, thinking on adds "
        "'<|channel>thought\\n'; if the tool-calling assistant message has content, that content follows the "
        "results and the turn is closed with '<turn|>\\n', so the prompt ends after a closed turn (with thinking on, "
        "followed by '<|channel>thought\\n' outside any turn). "
        "Behaviours that break prefix reuse: reasoning is rendered only for assistant messages after the last "
        "user message (or with preserve_thinking=true and tool calls), so a new user message drops earlier "
        "thought channels; the empty thought channel of the google generation prompt is absent when that turn "
        "is rendered as history; an assistant message's content moves from after its tool calls to after the "
        "tool results once they arrive; an assistant message directly followed by another assistant message "
        "loses its '<turn|>\\n'. Content is trimmed (user/system) or passed through strip_thinking (assistant). "
        "Tool messages not preceded by an assistant message with tool calls are dropped by the template. "
        "Typed-block lowering renders each system text block as trimmed text plus one space before '<turn|>'."
    ),
)
