import base64

import pytest

from helios.frontend.conversation import FrontendError, ImageBlock, TextBlock, ToolCall
from helios.protocol import decode_request
from helios.protocol.openai import decode_chat_request

PNG = b"\x89PNG\r\n\x1a\nfake-png"
JPEG = b"\xff\xd8\xff\xe0fake-jpeg"


def data_url(raw=PNG, media="image/png"):
    return f"data:{media};base64,{base64.b64encode(raw).decode()}"


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def decode(messages, **kw):
    return decode_chat_request({"messages": messages, **kw})


def field_of(request):
    with pytest.raises(FrontendError) as exc:
        decode_chat_request(request)
    return exc.value.field


def test_roles_and_string_content():
    conv = decode([{"role": "system", "content": "s1"}, {"role": "system", "content": "s2"},
                   {"role": "developer", "content": "d"}, {"role": "user", "content": "hi", "name": "bob"}])
    assert [m.role for m in conv.messages] == ["system", "system", "developer", "user"]  # not merged
    assert conv.messages[3].content == [TextBlock("hi")] and conv.messages[3].name == "bob"
    assert conv.options.add_generation_prompt and not conv.options.continue_final_message
    assert conv.sampling == {}


def test_text_parts_and_images_in_request_order():
    conv = decode([
        {"role": "user", "content": [{"type": "text", "text": "a"}, image_part(data_url())]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [image_part(data_url(JPEG, "image/jpg")), {"type": "image_url",
                                                                              "image_url": data_url()}]},
    ])
    first, _, last = conv.messages
    assert first.content[0] == TextBlock("a")
    assert first.content[1] == ImageBlock("image/png", PNG, 0)
    assert last.content[0] == ImageBlock("image/jpeg", JPEG, 1)  # image/jpg normalized
    assert [b.image_index for b in conv.images()] == [0, 1, 2]


def test_assistant_tool_calls_and_reasoning():
    conv = decode([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "reasoning_content": "think",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get", "arguments": '{"city": "Paris"}'}},
                        {"id": "c2", "type": "function", "function": {"name": "noargs", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
    ])
    a, t = conv.messages[1], conv.messages[2]
    assert a.content == [] and a.reasoning == "think"
    assert a.tool_calls == [ToolCall("get", {"city": "Paris"}, "c1"), ToolCall("noargs", {}, "c2")]
    assert t.role == "tool" and t.tool_call_id == "c1" and t.text() == "sunny"


def test_reasoning_alias():
    conv = decode([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "r"}])
    assert conv.messages[1].reasoning == "r"


def test_tool_results_reordered_to_call_order_with_images():
    calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ("a", "b")]
    conv = decode([
        {"role": "user", "content": [image_part(data_url())]},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "zz", "content": "orphan"},
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "user", "content": [image_part(data_url(JPEG, "image/jpeg"))]},
    ])
    assert [m.tool_call_id for m in conv.messages[2:5]] == ["a", "b", "zz"]
    assert [b.image_index for b in conv.images()] == [0, 1]


def test_options_and_sampling():
    conv = decode([{"role": "user", "content": "x"}], model="m", stream=True, max_tokens=5, n=1, stop=["x"],
                  logprobs=False, temperature=0.7, top_k=20, seed=3, min_p=None,
                  tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                  tool_choice={"type": "function", "function": {"name": "f"}},
                  chat_template_kwargs={"enable_thinking": False, "foo": 1})
    assert conv.sampling == {"temperature": 0.7, "top_k": 20, "seed": 3}
    o = conv.options
    assert o.tools[0]["function"]["name"] == "f" and o.tool_choice["function"]["name"] == "f"
    assert o.enable_thinking is False and o.extra == {"foo": 1}


@pytest.mark.parametrize("extra, add_gen, cont", [
    ({}, True, False),
    ({"continue_final_message": True}, False, True),
    ({"continue_final_message": True, "add_generation_prompt": True}, True, True),
    ({"add_generation_prompt": False}, False, False),
])
def test_generation_flags(extra, add_gen, cont):
    o = decode([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], **extra).options
    assert (o.add_generation_prompt, o.continue_final_message) == (add_gen, cont)


def test_dispatch():
    assert decode_request("openai", {"messages": [{"role": "user", "content": "x"}]}).messages[0].text() == "x"


@pytest.mark.parametrize("url, problem", [
    ("https://example.com/cat.png", "not fetched"),
    ("http://example.com/cat.png", "not fetched"),
    ("file:///etc/passwd", "data:image"),
    ("data:image/png,rawbytes", "base64"),
    ("data:image/bmp;base64,AAAA", "unsupported image type"),
    ("data:image/png;base64,@@@", "not valid base64"),
])
def test_bad_image_urls(url, problem):
    with pytest.raises(FrontendError) as exc:
        decode([{"role": "user", "content": [{"type": "text", "text": "x"}, image_part(url)]}])
    assert exc.value.field == "messages[0].content[1].image_url.url" and problem in exc.value.problem


USER = {"role": "user", "content": "x"}


def with_call(arguments):
    return {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]}]}


@pytest.mark.parametrize("request_, field", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}]},
     "messages[0].content[1].type"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "system", "content": [image_part(data_url())]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "tool", "content": "r"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "user", "content": "x", "mood": "happy"}]}, "messages[0].mood"),
    ({"messages": [{"role": "assistant", "content": "x", "function_call": {"name": "f"}}]},
     "messages[0].function_call"),
    (with_call("{not json"), "messages[1].tool_calls[0].function.arguments"),
    (with_call("[1, 2]"), "messages[1].tool_calls[0].function.arguments"),
    (with_call(7), "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}]},
     "messages[1].tool_calls[0].function.name"),
    ({"messages": [USER], "frequency_penaltyy": 1}, "frequency_penaltyy"),
    ({"messages": [USER], "n": 2}, "n"),
    ({"messages": [USER], "logprobs": True}, "logprobs"),
    ({"messages": [USER], "tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"messages": [USER], "tools": [{"type": "function", "function": {"description": "d"}}]},
     "tools[0].function.name"),
    ({"messages": [USER], "tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "tools[0].function.parameters"),
    ({"messages": [USER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": [USER], "tool_choice": {"type": "function", "function": {}}}, "tool_choice.function.name"),
    ({"messages": [USER], "chat_template_kwargs": []}, "chat_template_kwargs"),
    ({"messages": [USER], "chat_template_kwargs": {"enable_thinking": "yes"}}, "chat_template_kwargs.enable_thinking"),
    ({"messages": [USER], "add_generation_prompt": "no"}, "add_generation_prompt"),
])
def test_malformed_requests_name_the_field(request_, field):
    assert field_of(request_) == field
