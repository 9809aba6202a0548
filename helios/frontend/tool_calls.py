"""Tool calls in a completed reply, by the recipe's ``tool_call_format``.

``parse_tool_calls(fmt, text)`` returns ``(content, calls)`` — the text before the first call
(trailing whitespace removed) and the calls as ``ToolCall(name, arguments)`` with ``arguments`` a
mapping — or ``None`` when the text holds no well-formed call sequence, in which case the reply stays
plain content.  Well-formed means: every call parses, the calls follow one another with only
whitespace between them, and nothing but whitespace follows the last one.

Formats (what the recipes' templates render for assistant tool calls):

- ``"qwen"`` (qwen3, qwen3_5, the embedded default):
  ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`` (whitespace around the JSON allowed).
- ``"gemma"`` (gemma4): ``<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`` where strings are
  delimited by ``<|"|>`` (no other escaping), keys are bare, and numbers/true/false/null/arrays/objects
  follow JSON otherwise.
- ``"deepseek"`` (deepseek_v3): ``<｜tool▁calls▁begin｜>`` (optional) then per call
  ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``, then
  ``<｜tool▁calls▁end｜>`` (optional).

``opening(fmt)`` is the marker that starts the call section; a streaming reply holds its text back
from there on and emits the calls once the reply is complete.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOL_CALL_FORMATS = ("qwen", "gemma", "deepseek")

_OPENINGS = {"qwen": "<tool_call>", "gemma": "<|tool_call>", "deepseek": "<｜tool▁call"}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def opening(fmt: str | None) -> str | None:
    """The text that starts the tool-call section in ``fmt`` (None: the format has no tool calls)."""
    if fmt is None:
        return None
    if fmt not in _OPENINGS:
        raise ValueError(f"unknown tool_call_format {fmt!r} (known: {TOOL_CALL_FORMATS})")
    return _OPENINGS[fmt]


def parse_tool_calls(fmt: str | None, text: str) -> tuple[str, list[ToolCall]] | None:
    start_tag = opening(fmt)
    if start_tag is None:
        return None
    start = text.find(start_tag)
    if start < 0:
        return None
    parser = {"qwen": _qwen, "gemma": _gemma, "deepseek": _deepseek}[fmt]
    try:
        calls = parser(text[start:])
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None
    if not calls:
        return None
    return text[:start].rstrip(), calls


def _call(name: Any, arguments: Any) -> ToolCall:
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        raise ValueError("a tool call needs a name and an object of arguments")
    return ToolCall(name, arguments)


# -- qwen -------------------------------------------------------------------------------------------
_QWEN = re.compile(r"\s*<tool_call>(.*?)</tool_call>", re.S)


def _qwen(text: str) -> list[ToolCall]:
    calls, pos = [], 0
    while pos < len(text.rstrip()):
        m = _QWEN.match(text, pos)
        if m is None:
            raise ValueError("text that is not a tool call follows the tool calls")
        body = json.loads(m.group(1))
        if not isinstance(body, dict) or set(body) - {"name", "arguments"}:
            raise ValueError("a tool call is an object of name and arguments")
        calls.append(_call(body.get("name"), body.get("arguments", {})))
        pos = m.end()
    return calls


# -- deepseek ---------------------------------------------------------------------------------------
_DS_BEGIN, _DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL = re.compile(r"\s*<｜tool▁call▁begin｜>function<｜tool▁sep｜>([^\n<]+)\n```json\n(.*?)\n```<｜tool▁call▁end｜>",
                      re.S)


def _deepseek(text: str) -> list[ToolCall]:
    text = text.rstrip()
    if text.startswith(_DS_BEGIN):
        text = text[len(_DS_BEGIN):]
        if not text.endswith(_DS_END):
            raise ValueError("unterminated tool-call section")
    if text.endswith(_DS_END):
        text = text[:-len(_DS_END)].rstrip()
    calls, pos = [], 0
    while pos < len(text):
        m = _DS_CALL.match(text, pos)
        if m is None:
            raise ValueError("text that is not a tool call follows the tool calls")
        calls.append(_call(m.group(1).strip(), json.loads(m.group(2))))
        pos = m.end()
    return calls


# -- gemma ------------------------------------------------------------------------------------------
_G_OPEN, _G_CLOSE, _G_QUOTE = "<|tool_call>call:", "<tool_call|>", '<|"|>'
_G_NAME = re.compile(r"[^{\s<]+")
_G_KEY = re.compile(r"[A-Za-z_$][\w.$-]*")
_G_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _gemma(text: str) -> list[ToolCall]:
    calls, pos, end = [], 0, len(text.rstrip())
    while pos < end:
        while text[pos].isspace():
            pos += 1
        if not text.startswith(_G_OPEN, pos):
            raise ValueError("text that is not a tool call follows the tool calls")
        pos += len(_G_OPEN)
        m = _G_NAME.match(text, pos)
        if m is None:
            raise ValueError("a tool call needs a name")
        arguments, pos = _g_value(text, m.end(), bare_keys=True)
        if not isinstance(arguments, dict) or not text.startswith(_G_CLOSE, pos):
            raise ValueError("unterminated tool call")
        calls.append(_call(m.group(0), arguments))
        pos += len(_G_CLOSE)
    return calls


def _g_value(text: str, pos: int, bare_keys: bool = False) -> tuple[Any, int]:
    if text.startswith(_G_QUOTE, pos):
        close = text.index(_G_QUOTE, pos + len(_G_QUOTE))
        return text[pos + len(_G_QUOTE):close], close + len(_G_QUOTE)
    c = text[pos]
    if c == "{":
        out: dict[str, Any] = {}
        pos += 1
        if text[pos] == "}":
            return out, pos + 1
        while True:
            if text.startswith(_G_QUOTE, pos):
                key, pos = _g_value(text, pos)
            else:
                m = _G_KEY.match(text, pos)
                if m is None:
                    raise ValueError("expected a key")
                key, pos = m.group(0), m.end()
            if text[pos] != ":":
                raise ValueError("expected ':'")
            out[key], pos = _g_value(text, pos + 1)
            if text[pos] == ",":
                pos += 1
            elif text[pos] == "}":
                return out, pos + 1
            else:
                raise ValueError("expected ',' or '}'")
    if c == "[":
        items: list[Any] = []
        pos += 1
        if text[pos] == "]":
            return items, pos + 1
        while True:
            item, pos = _g_value(text, pos)
            items.append(item)
            if text[pos] == ",":
                pos += 1
            elif text[pos] == "]":
                return items, pos + 1
            else:
                raise ValueError("expected ',' or ']'")
    for word, value in (("true", True), ("false", False), ("null", None)):
        if text.startswith(word, pos):
            return value, pos + len(word)
    m = _G_NUMBER.match(text, pos)
    if m is None:
        raise ValueError(f"unexpected {c!r}")
    return json.loads(m.group(0)), m.end()
