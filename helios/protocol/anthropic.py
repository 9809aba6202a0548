"""Anthropic Messages requests -> the normalized conversation."""

from __future__ import annotations

from typing import Any

from helios.frontend.conversation import Block, Conversation, FrontendError, Message, Options, TextBlock, ToolCall

from .common import (
    Images, at, check_function_tool, expect_bool, expect_dict, expect_list, expect_str, order_tool_results,
    pick_sampling, reject_unknown, require,
)

SAMPLING = ("temperature", "top_p", "top_k")
SERVING = ("model", "max_tokens", "stream", "stop_sequences", "metadata")
CONVERSATION = ("messages", "system", "tools", "tool_choice", "thinking")
MESSAGE_FIELDS = ("role", "content")
_BLOCKS = {"user": ("text", "image", "tool_result"), "assistant": ("text", "tool_use", "thinking", "redacted_thinking")}
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def decode_messages_request(request: dict) -> Conversation:
    request = expect_dict(request, "request")
    reject_unknown(request, CONVERSATION + SAMPLING + SERVING)
    if request.get("max_tokens") is not None:
        mt = request["max_tokens"]
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            raise FrontendError("max_tokens", f"must be a positive integer, got {mt!r}")
    images = Images()
    messages = _system(request.get("system"))
    raw = expect_list(require(request, "messages", ""), "messages", nonempty=True)
    for i, m in enumerate(raw):
        messages.extend(_message(m, f"messages[{i}]", images))
    return Conversation(order_tool_results(messages), _options(request, raw), pick_sampling(request, SAMPLING))


def _hint(block: dict, path: str) -> bool:
    """``cache_control`` ({"type": "ephemeral", ...}) marks an advisory cache breakpoint."""
    cc = block.get("cache_control")
    if cc is None:
        return False
    cc = expect_dict(cc, at(path, "cache_control"))
    if cc.get("type") != "ephemeral":
        raise FrontendError(at(path, "cache_control.type"),
                            f"unsupported cache_control type {cc.get('type')!r} (ephemeral)")
    return True


def _block_type(block: Any, path: str) -> tuple[dict, str]:
    block = expect_dict(block, path)
    return block, expect_str(require(block, "type", path), at(path, "type"))


def _text(block: dict, path: str) -> TextBlock:
    return TextBlock(expect_str(require(block, "text", path), at(path, "text")), _hint(block, path))


def _system(system: Any) -> list[Message]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [Message("system", [TextBlock(system)])]
    blocks = []
    for i, block in enumerate(expect_list(system, "system")):
        block, kind = _block_type(block, f"system[{i}]")
        if kind != "text":
            raise FrontendError(f"system[{i}].type", f"unsupported system block type {kind!r} (text)")
        blocks.append(_text(block, f"system[{i}]"))
    return [Message("system", blocks)] if blocks else []


def _message(m: Any, path: str, images: Images) -> list[Message]:
    """One request message -> normalized messages (a user turn's tool results come out as tool messages)."""
    m = expect_dict(m, path)
    reject_unknown(m, MESSAGE_FIELDS, path)
    role = expect_str(require(m, "role", path), at(path, "role"))
    if role not in _BLOCKS:
        raise FrontendError(at(path, "role"), f"unknown role {role!r} (user or assistant)")
    content = require(m, "content", path)
    if isinstance(content, str):
        return [Message(role, [TextBlock(content)])]
    msg = Message(role)
    tools: list[Message] = []
    thinking: list[str] = []
    for i, block in enumerate(expect_list(content, at(path, "content"))):
        p = at(at(path, "content"), i)
        block, kind = _block_type(block, p)
        if kind not in _BLOCKS[role]:
            raise FrontendError(at(p, "type"), f"unsupported block type {kind!r} in a {role} message "
                                               f"({', '.join(_BLOCKS[role])})")
        if kind == "text":
            msg.content.append(_text(block, p))
        elif kind == "image":
            msg.content.append(_image(block, p, images))
        elif kind == "tool_result":
            tools.append(_tool_result(block, p, images))
        elif kind == "tool_use":
            msg.hint = _hint(block, p) or msg.hint
            name = expect_str(require(block, "name", p), at(p, "name"), nonempty=True)
            args = expect_dict(require(block, "input", p), at(p, "input"))
            msg.tool_calls.append(ToolCall(name, args, expect_str(require(block, "id", p), at(p, "id"))))
        elif kind == "thinking":
            thinking.append(expect_str(require(block, "thinking", p), at(p, "thinking")))
        # redacted_thinking: opaque to a template; accepted and dropped.
    if thinking:
        msg.reasoning = "\n\n".join(thinking)
    if tools and not msg.content:
        return tools
    return tools + [msg]


def _image(block: dict, path: str, images: Images) -> Block:
    src_path = at(path, "source")
    source = expect_dict(require(block, "source", path), src_path)
    kind = source.get("type")
    if kind == "url":
        raise FrontendError(at(src_path, "type"), "remote image URLs are not fetched; send a base64 source")
    if kind != "base64":
        raise FrontendError(at(src_path, "type"), f"unsupported image source type {kind!r} (base64)")
    return images.from_base64(require(source, "media_type", src_path), require(source, "data", src_path),
                              src_path, hint=_hint(block, path))


def _tool_result(block: dict, path: str, images: Images) -> Message:
    msg = Message("tool", tool_call_id=expect_str(require(block, "tool_use_id", path), at(path, "tool_use_id")),
                  hint=_hint(block, path))
    if block.get("is_error") is not None:
        expect_bool(block["is_error"], at(path, "is_error"))  # accepted; templates have no error slot
    content = block.get("content")
    if isinstance(content, str):
        msg.content.append(TextBlock(content))
    elif content is not None:
        for i, part in enumerate(expect_list(content, at(path, "content"))):
            p = at(at(path, "content"), i)
            part, kind = _block_type(part, p)
            if kind == "text":
                msg.content.append(_text(part, p))
            elif kind == "image":
                msg.content.append(_image(part, p, images))
            else:
                raise FrontendError(at(p, "type"), f"unsupported tool_result block type {kind!r} (text or image)")
    return msg


def _options(request: dict, raw_messages: list) -> Options:
    opts = Options()
    # A final assistant message is a prefill: the reply continues it.
    if raw_messages[-1].get("role") == "assistant":
        opts.continue_final_message, opts.add_generation_prompt = True, False
    if request.get("tools") is not None:
        opts.tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(expect_list(request["tools"], "tools"))]
    if request.get("tool_choice") is not None:
        opts.tool_choice = _tool_choice(request["tool_choice"])
    if request.get("thinking") is not None:
        thinking = expect_dict(request["thinking"], "thinking")
        kind = require(thinking, "type", "thinking")
        if kind not in ("enabled", "disabled"):
            raise FrontendError("thinking.type", f"unknown thinking type {kind!r} (enabled or disabled)")
        opts.enable_thinking = kind == "enabled"
    return opts


def _tool(tool: Any, path: str) -> dict:
    """An Anthropic custom tool -> the OpenAI-style function dict chat templates read."""
    if expect_dict(tool, path).get("type") not in (None, "custom"):
        raise FrontendError(at(path, "type"), f"unsupported tool type {tool['type']!r} (custom tools only)")
    tool = check_function_tool(tool, path, schema="input_schema", schema_required=True)
    _hint(tool, path)  # validated; a breakpoint inside the tool list has no place in the rendered prompt
    function = {"name": tool["name"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool["input_schema"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    choice = expect_dict(choice, "tool_choice")
    kind = require(choice, "type", "tool_choice")
    if kind in _TOOL_CHOICES:
        return _TOOL_CHOICES[kind]
    if kind == "tool":
        name = expect_str(require(choice, "name", "tool_choice"), "tool_choice.name", nonempty=True)
        return {"type": "function", "function": {"name": name}}
    raise FrontendError("tool_choice.type", f"unknown tool_choice type {kind!r} (auto, any, tool or none)")
