"""Independent references: transformers' ``apply_chat_template`` with the upstream (unannotated)
template, and the checkpoint tokenizer loaded by transformers."""

from __future__ import annotations

import inspect
import json
from functools import lru_cache
from pathlib import Path

from ignition.recipes.registry import load_recipe
from ignition.templates.patch import TemplatePatch, TemplateSourceMissing, hub_file, read_source_text


class AssetMissing(Exception):
    """A file the case needs is absent from the hub cache (the case is skipped, naming it)."""


def _plain(value):
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@lru_cache(maxsize=None)
def reference_tokenizer(recipe: str, checkpoint: str, hub_cache: str | None):
    import transformers

    decl = load_recipe(recipe).checkpoint(checkpoint)
    if checkpoint.startswith("flare/"):
        from ignition.embedded import materialize_default

        return transformers.AutoTokenizer.from_pretrained(str(materialize_default()))
    try:
        hub_file(checkpoint, "tokenizer.json", None, hub_cache)
    except TemplateSourceMissing as exc:
        raise AssetMissing(str(exc)) from exc
    cls = transformers.GemmaTokenizer if decl.tokenizer_class == "gemma" else transformers.AutoTokenizer
    try:
        return cls.from_pretrained(checkpoint, cache_dir=hub_cache, local_files_only=True)
    except OSError as exc:  # e.g. DeepSeek-R1: tokenizer.json only, no tokenizer_config.json
        raise AssetMissing(f"{checkpoint}: transformers cannot load its tokenizer offline ({exc.__class__.__name__}: "
                           f"{str(exc).splitlines()[0][:160]})") from exc


@lru_cache(maxsize=None)
def upstream_template(recipe: str, checkpoint: str, variant: str, hub_cache: str | None) -> str:
    """The authoritative template bytes of the checkpoint (never the annotated one)."""
    r = load_recipe(recipe)
    patch = TemplatePatch.load(r.patch_path(variant))
    if patch.source.embedded:
        return read_source_text(patch.source)
    try:
        path = hub_file(checkpoint, patch.source.filename, None, hub_cache)
    except TemplateSourceMissing as exc:
        raise AssetMissing(str(exc)) from exc
    raw = Path(path).read_bytes()
    if patch.source.json_key:
        value = json.loads(raw).get(patch.source.json_key)
        if value is None:
            raise AssetMissing(f"{path} has no {patch.source.json_key}")
        return value
    return raw.decode("utf-8")


def supports_sanitize(tok) -> bool:
    return "sanitize_control_tokens" in inspect.signature(tok.apply_chat_template).parameters


def _has_none(messages) -> bool:
    return any(v is None for m in messages for v in m.values())


def reference_render(tok, template: str, messages, variables: dict, conv_options) -> str:
    kwargs = {k: v for k, v in variables.items()
              if k not in ("messages", "tools", "documents", "add_generation_prompt") and not k.endswith("_token")}
    if _has_none(messages):
        # apply_chat_template drops None-valued keys (transformers >= 5.2x), which makes templates that
        # branch on `content is none` (DeepSeek-V3 tool-call turns) undefined; render with transformers'
        # own renderer and the tokenizer's special tokens instead.
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template(
            conversations=[_plain(messages)], tools=_plain(variables.get("tools")), chat_template=template,
            add_generation_prompt=conv_options.add_generation_prompt,
            continue_final_message=conv_options.continue_final_message,
            **{**tok.special_tokens_map, **_plain(kwargs)},
        )
        return rendered[0]
    return tok.apply_chat_template(
        _plain(messages), tools=_plain(variables.get("tools")), chat_template=template, tokenize=False,
        add_generation_prompt=conv_options.add_generation_prompt,
        continue_final_message=conv_options.continue_final_message, **_plain(kwargs),
    )


def reference_ids(tok, prompt: str) -> list[int]:
    return list(tok(prompt, add_special_tokens=False)["input_ids"])


def reference_sanitized_ids(tok, template, messages, variables, conv_options) -> list[int]:
    kwargs = {k: v for k, v in variables.items()
              if k not in ("messages", "tools", "documents", "add_generation_prompt") and not k.endswith("_token")}
    out = tok.apply_chat_template(
        _plain(messages), tools=_plain(variables.get("tools")), chat_template=template, tokenize=True,
        sanitize_control_tokens=True, add_generation_prompt=conv_options.add_generation_prompt,
        continue_final_message=conv_options.continue_final_message, return_dict=False, **_plain(kwargs),
    )
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


# -- the reference's own reading of a request ------------------------------------------------------------------
# The messages and template variables the upstream template is rendered with, read from the raw request JSON by the
# protocols' documents and the recipe's FrontendSpec -- not from helios' decoding or lowering, so that a defect
# there shows as a difference instead of on both sides.  It covers the corpus (fixtures/conversations): OpenAI chat
# messages (string or text / image_url parts, reasoning, tool calls and results) and Anthropic messages (system,
# text / image / tool_use / tool_result / thinking blocks); anything else raises, naming it.


def reference_conversation(protocol: str, request: dict, spec) -> tuple[list[dict], dict, object]:
    """``(messages, variables, options)`` for :func:`reference_render`: the template messages, the variables (tools,
    the thinking switch, chat_template_kwargs) and an object with ``add_generation_prompt`` and
    ``continue_final_message``."""
    from types import SimpleNamespace

    if protocol == "openai":
        messages = [_ref_openai(m, spec) for m in request["messages"]]
        cont = bool(request.get("continue_final_message", False))
        gen = request.get("add_generation_prompt", not cont)
        extra = dict(request.get("chat_template_kwargs") or {})
        thinking = extra.pop("enable_thinking", None)
        tools = request.get("tools")
    elif protocol == "anthropic":
        system = request.get("system")
        if isinstance(system, list):
            system = [b["text"] for b in system]
        messages = [_ref_message("system", [system] if isinstance(system, str) else system, spec)] if system else []
        for m in request["messages"]:
            messages += _ref_anthropic(m, spec)
        cont = request["messages"][-1]["role"] == "assistant"
        gen, extra = not cont, {}
        thinking = None if request.get("thinking") is None else request["thinking"]["type"] == "enabled"
        tools = [{"type": "function", "function": {"name": t["name"], **(
            {"description": t["description"]} if t.get("description") is not None else {}),
            "parameters": t["input_schema"]}} for t in request["tools"]] if request.get("tools") else None
    else:
        raise ValueError(f"reference_conversation: unknown protocol {protocol!r}")
    messages = _ref_results_in_call_order(messages)
    variables = {"tools": tools or None, **extra}
    if spec.thinking_kwarg is not None:
        chosen = spec.default_thinking if thinking is None else thinking
        if chosen is not None:
            variables[spec.thinking_kwarg] = chosen
    return messages, variables, SimpleNamespace(add_generation_prompt=gen, continue_final_message=cont)


def _ref_results_in_call_order(messages: list[dict]) -> list[dict]:
    """The frontend contract's tool-result sorting (seed 000: "tool-result sorting"): the tool messages right after
    an assistant turn with tool calls, in the order of those calls (by id, the first call of an id; results matching
    no call after them, in the order given)."""
    out = list(messages)
    for i, m in enumerate(messages):
        if not m.get("tool_calls"):
            continue
        calls, rank = m["tool_calls"], {}
        for n, c in enumerate(calls):
            if c.get("id") is not None:
                rank.setdefault(c["id"], n)
        end = i + 1
        while end < len(messages) and messages[end]["role"] == "tool":
            end += 1
        out[i + 1:end] = sorted(messages[i + 1:end], key=lambda r: rank.get(r.get("tool_call_id"), len(calls)))
    return out


def _ref_message(role: str, pieces: list, spec, *, reasoning=None, calls=(), **fields) -> dict:
    """One template message from its content pieces (text strings, ``None`` for an image) by ``spec``."""
    d = {"role": "system" if role == "developer" and not spec.developer_role else role}
    if not pieces and role == "assistant" and spec.assistant_null_content:
        d["content"] = None
    elif spec.content_format == "string":
        d["content"] = spec.text_joiner.join(pieces)
    else:
        d["content"] = [{"type": "image"} if p is None else {"type": "text", "text": p} for p in pieces]
    if reasoning is not None:
        d[spec.reasoning_field] = reasoning
    if calls:
        d["tool_calls"] = [{"type": "function", **({"id": i} if i else {}), "function": {"name": name, "arguments": (
            json.dumps(args, ensure_ascii=False) if spec.tool_arguments == "json" else args)}}
            for i, name, args in calls]
    return {**d, **{k: v for k, v in fields.items() if v is not None}}


def _ref_openai(m: dict, spec) -> dict:
    content = m.get("content")
    if content is None:
        pieces = []
    elif isinstance(content, str):
        pieces = [content]
    else:
        kinds = {"text": lambda p: p["text"], "image_url": lambda p: None}
        pieces = [kinds[p["type"]](p) for p in content]
    calls = []
    for c in m.get("tool_calls") or ():
        args = c["function"]["arguments"]
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        calls.append((c.get("id"), c["function"]["name"], args))
    reasoning = m.get("reasoning_content") if m.get("reasoning_content") is not None else m.get("reasoning")
    tool = m["role"] == "tool"
    return _ref_message(m["role"], pieces, spec, reasoning=reasoning, calls=calls,
                        tool_call_id=m.get("tool_call_id") if tool else None, name=m.get("name") if tool else None)


def _ref_anthropic(m: dict, spec) -> list[dict]:
    """An Anthropic message: its tool results first, as tool messages, then the message itself unless it held
    nothing else."""
    content = m["content"]
    if isinstance(content, str):
        return [_ref_message(m["role"], [content], spec)]
    pieces, calls, thinking, results = [], [], [], []
    for b in content:
        if b["type"] == "text":
            pieces.append(b["text"])
        elif b["type"] == "image":
            pieces.append(None)
        elif b["type"] == "tool_use":
            calls.append((b["id"], b["name"], b["input"]))
        elif b["type"] == "thinking":
            thinking.append(b["thinking"])
        elif b["type"] == "tool_result":
            inner = b.get("content")
            parts = [inner] if isinstance(inner, str) else [
                p["text"] if p["type"] == "text" else None for p in inner or ()]
            results.append(_ref_message("tool", parts, spec, tool_call_id=b["tool_use_id"]))
        elif b["type"] != "redacted_thinking":
            raise ValueError(f"reference_conversation: Anthropic block {b['type']!r} not covered")
    if results and not pieces and not calls and not thinking:
        return results
    return results + [_ref_message(m["role"], pieces, spec, reasoning="\n\n".join(thinking) if thinking else None,
                                   calls=calls)]
