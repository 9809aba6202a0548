"""Lowering a normalized conversation into the message dicts chat templates read.

Tracked strings are created only where positions are needed: hinted blocks, the block a
continuation extends, and content that spells a special token.
"""

from __future__ import annotations

from typing import Any, Callable

from .conversation import Conversation, FrontendError, ImageBlock, Message, TextBlock
from .tracked import TrackedStr

LITERAL = "literal"
CONTINUE = "continue"


def _tracked(text: str, keys: list, literal_spans) -> str:
    spans = [(k, 0, len(text)) for k in keys] + [(LITERAL, s, e) for s, e in literal_spans]
    return TrackedStr(text, tuple(spans)) if spans else text


def lower(conv: Conversation, spec, special_spans: Callable[[str], list]) -> tuple[list[dict], bool]:
    """Return ``(messages, tracking)``; ``tracking`` says whether any string is tracked."""
    msgs = conv.messages
    if not msgs:
        raise FrontendError("messages", "must hold at least one message")
    cont = conv.options.continue_final_message
    if cont:
        if conv.options.add_generation_prompt:
            raise FrontendError("continue_final_message", "cannot be combined with add_generation_prompt")
        if msgs[-1].role != "assistant":
            raise FrontendError("continue_final_message", "the final message must be an assistant message")
        if not any(isinstance(b, TextBlock) for b in msgs[-1].content):
            raise FrontendError(f"messages[{len(msgs) - 1}].content", "holds no text to continue")
    tracking = False
    out = []
    for i, m in enumerate(msgs):
        last_text = max((j for j, b in enumerate(m.content) if isinstance(b, TextBlock)), default=-1)
        pieces: list[Any] = []
        for j, b in enumerate(m.content):
            if isinstance(b, TextBlock):
                keys = []
                if b.hint:
                    keys.append(("hint", i, j))
                if m.hint:
                    keys.append(("message", i))
                if cont and i == len(msgs) - 1 and j == last_text:
                    keys.append(CONTINUE)
                text = _tracked(b.text, keys, special_spans(b.text))
                tracking = tracking or type(text) is TrackedStr
                pieces.append(text)
            elif isinstance(b, ImageBlock):
                if spec.content_format != "blocks" or spec.image_token is None:
                    raise FrontendError(f"messages[{i}].content[{j}]", "this recipe's template does not accept images")
                pieces.append(b)
            else:
                raise FrontendError(f"messages[{i}].content[{j}]", f"unsupported block {type(b).__name__}")
        d: dict[str, Any] = {"role": _role(m, spec, i)}
        if spec.content_format == "string":
            d["content"] = _join(pieces, spec.text_joiner)
        else:
            d["content"] = [
                {"type": "image"} if isinstance(p, ImageBlock) else {"type": "text", "text": p} for p in pieces
            ]
        if m.reasoning is not None:
            reasoning = _tracked(m.reasoning, [], special_spans(m.reasoning))
            tracking = tracking or type(reasoning) is TrackedStr
            d[spec.reasoning_field] = reasoning
        if m.tool_calls:
            d["tool_calls"] = [
                {"type": "function", **({"id": c.id} if c.id else {}),
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ]
        if m.role == "tool":
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            if m.name is not None:
                d["name"] = m.name
        out.append(d)
    return out, tracking


def _role(m: Message, spec, i: int) -> str:
    if m.role == "developer" and not spec.developer_role:
        return "system"
    return m.role


def _join(pieces: list, joiner: str) -> str:
    if not pieces:
        return ""
    text = pieces[0]
    for p in pieces[1:]:
        text = text + joiner + p
    return text
