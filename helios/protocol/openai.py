"""OpenAI Chat Completions requests -> the normalized conversation."""

from __future__ import annotations

import json
from typing import Any

from helios.frontend.conversation import (
    ROLES, Block, Conversation, FrontendError, Message, Options, TextBlock, ToolCall,
)

from .common import (
    Images, at, check_function_tool, expect_bool, expect_dict, expect_list, expect_str, order_tool_results,
    pick_sampling, reject_unknown, require,
)

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "seed")
#: Serving fields accepted here and handled (or ignored) by the serving layer.
SERVING = ("model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "stop", "n", "user",
           "logprobs", "top_logprobs", "parallel_tool_calls", "metadata", "store")
CONVERSATION = ("messages", "tools", "tool_choice", "chat_template_kwargs", "continue_final_message",
                "add_generation_prompt")
MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning",
                  "refusal", "function_call", "audio")
_NULL_ONLY = ("refusal", "function_call", "audio")  # accepted only when null
_TOOL_CHOICES = ("none", "auto", "required")


def decode_chat_request(request: dict) -> Conversation:
    request = expect_dict(request, "request")
    reject_unknown(request, CONVERSATION + SAMPLING + SERVING)
    _check_serving(request)
    images = Images()
    raw = expect_list(require(request, "messages", ""), "messages", nonempty=True)
    messages = [_message(m, f"messages[{i}]", images) for i, m in enumerate(raw)]
    return Conversation(order_tool_results(messages), _options(request), pick_sampling(request, SAMPLING))


def _check_serving(request: dict) -> None:
    if request.get("n") not in (None, 1):
        raise FrontendError("n", "only n=1 is supported")
    if request.get("logprobs") not in (None, False):
        raise FrontendError("logprobs", "is not supported")
    if request.get("top_logprobs") not in (None, 0):
        raise FrontendError("top_logprobs", "is not supported")


def _message(m: Any, path: str, images: Images) -> Message:
    m = expect_dict(m, path)
    reject_unknown(m, MESSAGE_FIELDS, path)
    role = expect_str(require(m, "role", path), at(path, "role"))
    if role not in ROLES:
        raise FrontendError(at(path, "role"), f"unknown role {role!r} (one of {', '.join(ROLES)})")
    for key in _NULL_ONLY:
        if m.get(key) is not None:
            raise FrontendError(at(path, key), "is not supported")
    _only_for(m, path, role, "tool_calls", "assistant")
    _only_for(m, path, role, "reasoning_content", "assistant")
    _only_for(m, path, role, "reasoning", "assistant")
    _only_for(m, path, role, "tool_call_id", "tool")
    if "content" not in m and role != "assistant":
        raise FrontendError(at(path, "content"), "is required")
    msg = Message(role, _content(m.get("content"), at(path, "content"), role, images))
    if m.get("name") is not None:
        msg.name = expect_str(m["name"], at(path, "name"))
    if role == "assistant":
        for key in ("reasoning_content", "reasoning"):  # reasoning_content wins when both are set
            if m.get(key) is not None:
                msg.reasoning = expect_str(m[key], at(path, key))
                break
        if m.get("tool_calls") is not None:
            calls = expect_list(m["tool_calls"], at(path, "tool_calls"))
            msg.tool_calls = [_tool_call(c, at(at(path, "tool_calls"), i)) for i, c in enumerate(calls)]
    if role == "tool":
        msg.tool_call_id = expect_str(require(m, "tool_call_id", path), at(path, "tool_call_id"))
    return msg


def _only_for(m: dict, path: str, role: str, key: str, allowed: str) -> None:
    if m.get(key) is not None and role != allowed:
        raise FrontendError(at(path, key), f"is only allowed in {allowed} messages, not {role}")


def _content(content: Any, path: str, role: str, images: Images) -> list[Block]:
    if content is None:
        if role != "assistant":
            raise FrontendError(path, "must be a string or a list of content parts, got null")
        return []
    if isinstance(content, str):
        return [TextBlock(content)]
    parts = expect_list(content, path)
    out: list[Block] = []
    for i, part in enumerate(parts):
        p = at(path, i)
        part = expect_dict(part, p)
        kind = expect_str(require(part, "type", p), at(p, "type"))
        if kind == "text":
            out.append(TextBlock(expect_str(require(part, "text", p), at(p, "text"))))
        elif kind == "image_url":
            if role != "user":
                raise FrontendError(at(p, "type"), f"images are only allowed in user messages, not {role}")
            image = require(part, "image_url", p)
            if isinstance(image, dict):
                out.append(images.from_url(require(image, "url", at(p, "image_url")), at(at(p, "image_url"), "url")))
            else:
                out.append(images.from_url(image, at(p, "image_url")))
        else:
            raise FrontendError(at(p, "type"), f"unsupported content part type {kind!r} (text or image_url)")
    return out


def _tool_call(call: Any, path: str) -> ToolCall:
    call = expect_dict(call, path)
    if call.get("type") not in (None, "function"):
        raise FrontendError(at(path, "type"), f"unsupported tool call type {call['type']!r} (function)")
    fn_path = at(path, "function")
    fn = expect_dict(require(call, "function", path), fn_path)
    name = expect_str(require(fn, "name", fn_path), at(fn_path, "name"), nonempty=True)
    return ToolCall(name, _arguments(require(fn, "arguments", fn_path), at(fn_path, "arguments")),
                    None if call.get("id") is None else expect_str(call["id"], at(path, "id")))


def _arguments(arguments: Any, path: str) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    text = expect_str(arguments, path)
    if not text.strip():
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FrontendError(path, f"is not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(parsed, dict):
        raise FrontendError(path, f"must encode a JSON object, got {type(parsed).__name__}")
    return parsed


def _options(request: dict) -> Options:
    opts = Options()
    if request.get("continue_final_message") is not None:
        opts.continue_final_message = expect_bool(request["continue_final_message"], "continue_final_message")
        # Continuing means no generation prompt unless the request insists (lowering then reports the conflict).
        opts.add_generation_prompt = not opts.continue_final_message
    if request.get("add_generation_prompt") is not None:
        opts.add_generation_prompt = expect_bool(request["add_generation_prompt"], "add_generation_prompt")
    if request.get("tools") is not None:
        tools = expect_list(request["tools"], "tools")
        for i, tool in enumerate(tools):
            p = f"tools[{i}]"
            tool = expect_dict(tool, p)
            if require(tool, "type", p) != "function":
                raise FrontendError(at(p, "type"), f"unsupported tool type {tool['type']!r} (function)")
            check_function_tool(require(tool, "function", p), at(p, "function"))
        opts.tools = tools
    if request.get("tool_choice") is not None:
        opts.tool_choice = _tool_choice(request["tool_choice"])
    if request.get("chat_template_kwargs") is not None:
        kwargs = dict(expect_dict(request["chat_template_kwargs"], "chat_template_kwargs"))
        thinking = kwargs.pop("enable_thinking", None)
        if thinking is not None:
            opts.enable_thinking = expect_bool(thinking, "chat_template_kwargs.enable_thinking")
        opts.extra = kwargs
    return opts


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICES:
            raise FrontendError("tool_choice", f"unknown tool_choice {choice!r} (one of {', '.join(_TOOL_CHOICES)})")
        return choice
    choice = expect_dict(choice, "tool_choice")
    if require(choice, "type", "tool_choice") != "function":
        raise FrontendError("tool_choice.type", f"unsupported tool_choice type {choice['type']!r} (function)")
    fn = expect_dict(require(choice, "function", "tool_choice"), "tool_choice.function")
    expect_str(require(fn, "name", "tool_choice.function"), "tool_choice.function.name", nonempty=True)
    return choice


# -- legacy completions -----------------------------------------------------------------------------
COMPLETION_SERVING = ("model", "prompt", "stream", "stream_options", "max_tokens", "stop", "n", "best_of", "user",
                      "logprobs", "echo", "suffix", "logit_bias")


def decode_completion_request(request: dict, vocab_size: int) -> tuple[str | list[int], dict[str, Any]]:
    """``POST /v1/completions``: ``(prompt, sampling)`` where ``prompt`` is text (tokenized without a
    template) or token IDs checked against ``vocab_size``; one prompt per request."""
    request = expect_dict(request, "request")
    reject_unknown(request, COMPLETION_SERVING + SAMPLING)
    _check_serving(request)
    if request.get("best_of") not in (None, 1):
        raise FrontendError("best_of", "only best_of=1 is supported")
    if request.get("echo") not in (None, False):
        raise FrontendError("echo", "is not supported")
    if request.get("suffix") is not None:
        raise FrontendError("suffix", "is not supported")
    if request.get("logit_bias") not in (None, {}):
        raise FrontendError("logit_bias", "is not supported")
    prompt = require(request, "prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise FrontendError("prompt", "must not be empty")
    elif isinstance(prompt, list):
        if not prompt:
            raise FrontendError("prompt", "must not be empty")
        for i, t in enumerate(prompt):
            if isinstance(t, bool) or not isinstance(t, int):
                raise FrontendError("prompt", f"token {i} must be an integer token ID, got {t!r}")
            if not 0 <= t < vocab_size:
                raise FrontendError("prompt", f"token {i} ({t}) is outside the vocabulary (0..{vocab_size - 1})")
    else:
        raise FrontendError("prompt", "must be a string or a list of token IDs (one prompt per request)")
    return prompt, pick_sampling(request, SAMPLING)
