import base64

import pytest

from helios.frontend.conversation import FrontendError, ImageBlock, TextBlock, ToolCall
from helios.protocol import decode_request
from helios.protocol.anthropic import decode_messages_request

PNG = b"\x89PNG\r\n\x1a\nfake-png"
GIF = b"GIF89afake-gif"
CC = {"type": "ephemeral"}


def image(raw=PNG, media="image/png", **kw):
    return {"type": "image", "source": {"type": "base64", "media_type": media,
                                        "data": base64.b64encode(raw).decode()}, **kw}


def text(t, **kw):
    return {"type": "text", "text": t, **kw}


def decode(messages, **kw):
    return decode_messages_request({"model": "m", "max_tokens": 16, "messages": messages, **kw})


def test_system_string_and_blocks_with_cache_control():
    conv = decode([{"role": "user", "content": "hi"}], system="sys")
    assert [(m.role, m.text()) for m in conv.messages] == [("system", "sys"), ("user", "hi")]
    conv = decode([{"role": "user", "content": "hi"}], system=[text("a", cache_control=CC), text("b")])
    assert conv.messages[0].content == [TextBlock("a", hint=True), TextBlock("b")]
    assert conv.has_hints()
    assert decode([{"role": "user", "content": "hi"}]).messages[0].role == "user"  # no system


def test_text_and_image_blocks():
    conv = decode([{"role": "user", "content": [text("look", cache_control=CC), image(GIF, "image/gif"),
                                                image(cache_control=CC)]}])
    assert conv.messages[0].content == [TextBlock("look", hint=True), ImageBlock("image/gif", GIF, 0),
                                        ImageBlock("image/png", PNG, 1, hint=True)]
    assert conv.options.add_generation_prompt and not conv.options.continue_final_message


def test_tool_use_thinking_and_tool_results():
    conv = decode([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "first", "signature": "s"},
            {"type": "redacted_thinking", "data": "opaque"},
            text("checking"),
            {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Paris"}},
            {"type": "thinking", "thinking": "second", "signature": "s"},
            {"type": "tool_use", "id": "t2", "name": "get", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "sunny", "cache_control": CC},
            {"type": "tool_result", "tool_use_id": "t2", "is_error": True,
             "content": [text("boom"), image()]},
            text("thanks")]},
    ])
    roles = [m.role for m in conv.messages]
    assert roles == ["user", "assistant", "tool", "tool", "user"]
    a = conv.messages[1]
    assert a.reasoning == "first\n\nsecond" and a.text() == "checking"
    assert a.tool_calls == [ToolCall("get", {"city": "Paris"}, "t1"), ToolCall("get", {}, "t2")]
    t1, t2, u = conv.messages[2:]
    assert (t1.tool_call_id, t1.text(), t1.hint) == ("t1", "sunny", True)
    assert t2.tool_call_id == "t2" and t2.content[1] == ImageBlock("image/png", PNG, 0) and not t2.hint
    assert u.content == [TextBlock("thanks")]


def test_only_tool_results_make_no_user_message():
    conv = decode([{"role": "user", "content": "q"},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}])
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool"]
    assert conv.messages[2].content == []


def test_tool_results_reordered_images_keep_request_index():
    use = [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in ("a", "b")]
    conv = decode([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": use},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "b", "content": [image(GIF, "image/gif")]},
            {"type": "tool_result", "tool_use_id": "a", "content": [image()]},
            image(GIF, "image/gif")]},
    ])
    assert [m.tool_call_id for m in conv.messages[2:4]] == ["a", "b"]
    assert conv.messages[2].content[0].data == PNG and conv.messages[3].content[0].data == GIF
    assert [b.image_index for b in conv.images()] == [1, 0, 2]  # rendered order, request indices


def test_final_assistant_is_a_prefill():
    conv = decode([{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is"}])
    assert conv.options.continue_final_message and not conv.options.add_generation_prompt


def test_options_tools_and_sampling():
    conv = decode([{"role": "user", "content": "q"}], temperature=0.5, top_k=10, stream=True,
                  stop_sequences=["x"], metadata={"user_id": "u"}, thinking={"type": "enabled", "budget_tokens": 1024},
                  tools=[{"name": "f", "description": "does f", "input_schema": {"type": "object"},
                          "cache_control": CC}],
                  tool_choice={"type": "tool", "name": "f"})
    o = conv.options
    assert o.tools == [{"type": "function", "function": {"name": "f", "description": "does f",
                                                         "parameters": {"type": "object"}}}]
    assert o.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert o.enable_thinking is True and conv.sampling == {"temperature": 0.5, "top_k": 10}


@pytest.mark.parametrize("choice, expected", [
    ({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "auto", "disable_parallel_tool_use": True}, "auto"),
])
def test_tool_choice(choice, expected):
    assert decode([{"role": "user", "content": "q"}], tool_choice=choice).options.tool_choice == expected


@pytest.mark.parametrize("kind, expected", [("enabled", True), ("disabled", False)])
def test_thinking_option(kind, expected):
    assert decode([{"role": "user", "content": "q"}], thinking={"type": kind}).options.enable_thinking is expected


def test_dispatch_and_max_tokens_optional():
    conv = decode_request("anthropic", {"messages": [{"role": "user", "content": "x"}]})
    assert conv.messages[0].text() == "x"


USER = {"role": "user", "content": "x"}


def req(**kw):
    return {"max_tokens": 8, "messages": [USER], **kw}


def msgs(*content, role="user"):
    return {"max_tokens": 8, "messages": [{"role": role, "content": list(content)}]}


@pytest.mark.parametrize("request_, field", [
    ({"max_tokens": 8}, "messages"),
    ({"messages": []}, "messages"),
    (req(max_tokens=0), "max_tokens"),
    (req(top_n=3), "top_n"),
    (req(system=5), "system"),
    (req(system=[image()]), "system[0].type"),
    (req(system=[text("a", cache_control={"type": "forever"})]), "system[0].cache_control.type"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}]}, "messages[0].name"),
    (msgs(text("a"), {"text": "b"}), "messages[0].content[1].type"),
    (msgs({"type": "document", "source": {}}), "messages[0].content[0].type"),
    (msgs({"type": "tool_use", "id": "t", "name": "f", "input": {}}), "messages[0].content[0].type"),
    ({"messages": [USER, {"role": "assistant", "content": [image()]}]}, "messages[1].content[0].type"),
    (msgs({"type": "image", "source": {"type": "url", "url": "https://x/cat.png"}}),
     "messages[0].content[0].source.type"),
    (msgs(image(media="image/tiff")), "messages[0].content[0].source.media_type"),
    (msgs({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "!!"}}),
     "messages[0].content[0].source.data"),
    (msgs({"type": "tool_result"}), "messages[0].content[0].tool_use_id"),
    (msgs({"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}), "messages[0].content[0].is_error"),
    (msgs({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "tool_use"}]}),
     "messages[0].content[0].content[0].type"),
    (msgs({"type": "tool_use", "id": "t", "name": "f", "input": "{}"}, role="assistant"),
     "messages[0].content[0].input"),
    (msgs({"type": "thinking"}, role="assistant"), "messages[0].content[0].thinking"),
    (req(tools=[{"name": "f"}]), "tools[0].input_schema"),
    (req(tools=[{"input_schema": {}}]), "tools[0].name"),
    (req(tools=[{"type": "bash_20250124", "name": "bash"}]), "tools[0].type"),
    (req(tool_choice="auto"), "tool_choice"),
    (req(tool_choice={"type": "tool"}), "tool_choice.name"),
    (req(tool_choice={"type": "maybe"}), "tool_choice.type"),
    (req(thinking={"type": "adaptive"}), "thinking.type"),
])
def test_malformed_requests_name_the_field(request_, field):
    with pytest.raises(FrontendError) as exc:
        decode_messages_request(request_)
    assert exc.value.field == field
