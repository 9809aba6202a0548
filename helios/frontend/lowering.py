"""Lowering a normalized conversation into the message dicts chat templates read.

Tracked strings are created only where positions are needed: hinted blocks, the block a
continuation extends, and content that spells a special token.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from .conversation import Conversation, FrontendError, ImageBlock, Message, TextBlock
from .tracked import TrackedStr

LITERAL = "literal"
CONTINUE = "continue"


def _tracked(text: str, keys: list, literal_spans) -> str:
    spans = [(k, 0, len(text)) for k in keys] + [(LITERAL, s, e) for s, e in literal_spans]
    return TrackedStr(text, tuple(spans)) if spans else text


def lower(conv: Conversation, spec, special_spans: Callable[[str], list]) -> tuple[list[dict], int]:
    """Return ``(messages, literals)``: the template messages and the number of special-token
    spellings found in content (each must reach the prompt tracked)."""
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
    literals = 0
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
                found = special_spans(b.text)
                literals += len(found)
                text = _tracked(b.text, keys, found)
                pieces.append(text)
            elif isinstance(b, ImageBlock):
                if spec.content_format != "blocks" or spec.image_token is None:
                    raise FrontendError(f"messages[{i}].content[{j}]", "this recipe's template does not accept images")
                pieces.append(b)
            else:
                raise FrontendError(f"messages[{i}].content[{j}]", f"unsupported block {type(b).__name__}")
        d: dict[str, Any] = {"role": _role(m, spec, i)}
        if not pieces and m.role == "assistant" and spec.assistant_null_content:
            d["content"] = None
        elif spec.content_format == "string":
            d["content"] = _join(pieces, spec.text_joiner)
        else:
            d["content"] = [
                {"type": "image"} if isinstance(p, ImageBlock) else {"type": "text", "text": p} for p in pieces
            ]
        if m.reasoning is not None:
            found = special_spans(m.reasoning)
            literals += len(found)
            d[spec.reasoning_field] = _tracked(m.reasoning, [], found)
        if m.tool_calls:
            d["tool_calls"] = [
                {"type": "function", **({"id": c.id} if c.id else {}),
                 "function": {"name": c.name, "arguments": _arguments(c.arguments, spec)}}
                for c in m.tool_calls
            ]
        if m.role == "tool":
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            if m.name is not None:
                d["name"] = m.name
        out.append(d)
    return out, literals


def _role(m: Message, spec, i: int) -> str:
    if m.role == "developer" and not spec.developer_role:
        return "system"
    return m.role


def _arguments(arguments: dict, spec) -> Any:
    if spec.tool_arguments == "json":
        return json.dumps(arguments, ensure_ascii=False)
    if spec.tool_arguments != "object":
        raise ValueError(f"FrontendSpec.tool_arguments must be 'object' or 'json', got {spec.tool_arguments!r}")
    return arguments


def _join(pieces: list, joiner: str) -> str:
    if not pieces:
        return ""
    text = pieces[0]
    for p in pieces[1:]:
        text = text + joiner + p
    return text
