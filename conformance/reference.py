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
