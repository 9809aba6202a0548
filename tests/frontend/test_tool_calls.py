"""Tool-call parsing of completed replies, per recipe format (helios/frontend/tool_calls.py)."""

from __future__ import annotations

import pytest

from helios.frontend.tool_calls import TOOL_CALL_FORMATS, ToolCall, opening, parse_tool_calls
from ignition.recipes.registry import all_recipes, load_recipe

W = ToolCall("get_weather", {"city": "Paris", "days": 3})
T = ToolCall("get_time", {"tz": "UTC", "opts": {"precise": True, "fields": [1, 2.5, None]}})


def test_each_recipe_declares_a_known_format():
    assert {r.name: r.tool_call_format for r in all_recipes()} == {
        "qwen3": "qwen", "qwen3_5": "qwen", "gemma4": "gemma", "deepseek_v3": "deepseek"}
    assert all(r.tool_call_format in TOOL_CALL_FORMATS for r in all_recipes())
    assert load_recipe("qwen3").variant("flare-default")  # the embedded default is served by qwen3


def test_no_format_or_no_call_is_plain_text():
    assert parse_tool_calls(None, '<tool_call>{"name": "x", "arguments": {}}</tool_call>') is None
    for fmt in TOOL_CALL_FORMATS:
        assert parse_tool_calls(fmt, "just words") is None
    with pytest.raises(ValueError):
        opening("xml")


# -- qwen -------------------------------------------------------------------------------------------
Q1 = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
Q2 = ('<tool_call>{"name": "get_time", "arguments": {"tz": "UTC", "opts": {"precise": true, '
      '"fields": [1, 2.5, null]}}}</tool_call>')


@pytest.mark.parametrize("text,expected", [
    (Q1, ("", [W])),
    (f"Let me check.\n\n{Q1}\n", ("Let me check.", [W])),
    (f"{Q1}\n{Q2}", ("", [W, T])),
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', ("", [ToolCall("f", {"a": 1})])),
    ('<tool_call>{"name": "f"}</tool_call>', ("", [ToolCall("f", {})])),
])
def test_qwen_valid(text, expected):
    assert parse_tool_calls("qwen", text) == expected


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>',  # broken JSON
    '<tool_call>{"name": "f", "arguments": {}}',  # unterminated
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',  # arguments not an object
    '<tool_call>{"name": "f", "arguments": {}, "x": 1}</tool_call>',  # unknown key
    f"{Q1} and then some text",  # text after the calls
    f"{Q1} words {Q2}",  # text between calls
])
def test_qwen_malformed_stays_text(text):
    assert parse_tool_calls("qwen", "Intro " + text) is None


# -- gemma ------------------------------------------------------------------------------------------
G1 = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>'
G2 = '<|tool_call>call:get_time{opts:{fields:[1,2.5,null],precise:true},tz:<|"|>UTC<|"|>}<tool_call|>'


@pytest.mark.parametrize("text,expected", [
    (G1, ("", [W])),
    (f"Checking now. {G1}", ("Checking now.", [W])),
    (G1 + G2, ("", [W, T])),
    ('<|tool_call>call:say{text:<|"|>a "quoted", {braced}: text<|"|>,n:-1.5e3}<tool_call|>',
     ("", [ToolCall("say", {"text": 'a "quoted", {braced}: text', "n": -1500.0})])),
    ('<|tool_call>call:noargs{}<tool_call|>', ("", [ToolCall("noargs", {})])),
    ('<|tool_call>call:q{<|"|>odd key<|"|>:false,list:[]}<tool_call|>',
     ("", [ToolCall("q", {"odd key": False, "list": []})])),
])
def test_gemma_valid(text, expected):
    assert parse_tool_calls("gemma", text) == expected


@pytest.mark.parametrize("text", [
    '<|tool_call>call:f{a:<|"|>unterminated}<tool_call|>',
    '<|tool_call>call:f{a:1<tool_call|>',
    '<|tool_call>call:f{a:1}',
    '<|tool_call>call:{a:1}<tool_call|>',
    '<|tool_call>call:f{a:bare}<tool_call|>',
    G1 + " trailing words",
])
def test_gemma_malformed_stays_text(text):
    assert parse_tool_calls("gemma", text) is None


# -- deepseek ---------------------------------------------------------------------------------------
def _ds(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"


D1 = _ds("get_weather", '{"city": "Paris", "days": 3}')
D2 = _ds("get_time", '{"tz": "UTC", "opts": {"precise": true, "fields": [1, 2.5, null]}}')


@pytest.mark.parametrize("text,expected", [
    (f"<｜tool▁calls▁begin｜>{D1}<｜tool▁calls▁end｜>", ("", [W])),
    (f"Sure.\n<｜tool▁calls▁begin｜>{D1}\n{D2}<｜tool▁calls▁end｜>", ("Sure.", [W, T])),
    (D1, ("", [W])),
])
def test_deepseek_valid(text, expected):
    assert parse_tool_calls("deepseek", text) == expected


@pytest.mark.parametrize("text", [
    f"<｜tool▁calls▁begin｜>{D1}",  # section never closed
    "<｜tool▁calls▁begin｜>" + _ds("f", '{"a": }') + "<｜tool▁calls▁end｜>",
    "<｜tool▁calls▁begin｜>" + _ds("f", "[1]") + "<｜tool▁calls▁end｜>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    D1 + " more",
])
def test_deepseek_malformed_stays_text(text):
    assert parse_tool_calls("deepseek", text) is None
