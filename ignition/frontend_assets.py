"""Preparing a recipe's frontend assets from a checkpoint: annotated template, tokenizer, variables."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ignition.recipes.base import Checkpoint, Recipe
from ignition.recipes.registry import load_recipe
from ignition.templates.patch import TemplatePatch, TemplateSourceMismatch, hub_file, read_source_text, sha256


@dataclass
class FrontendAssets:
    recipe: Recipe
    checkpoint: Checkpoint
    variant: str
    annotated_template: str
    tokenizer_path: Path
    variables: dict[str, Any]  # special-token template variables


def special_token_variables(tokenizer_config: dict) -> dict[str, str]:
    """The special-token strings a template sees (``bos_token``, ``eos_token``, …)."""
    out = {}
    items = list(tokenizer_config.items()) + list((tokenizer_config.get("extra_special_tokens") or {}).items()
                                                   if isinstance(tokenizer_config.get("extra_special_tokens"), dict) else [])
    for key, value in items:
        if not key.endswith("_token") or key.startswith("add_"):
            continue
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def _checkpoint_file(checkpoint: str, filename: str, hub_cache) -> Path:
    if os.path.isdir(checkpoint):
        path = Path(checkpoint) / filename
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found")
        return path
    return hub_file(checkpoint, filename, None, hub_cache)


def checkpoint_template_source(patch: TemplatePatch, checkpoint: str, hub_cache: str | None) -> str:
    """The checkpoint's own template bytes (its folder, or its repository's ``refs/main`` in the hub
    cache); the patch's pinned hash decides whether the annotations apply to them."""
    if patch.source.embedded:
        return read_source_text(patch.source)
    if os.path.isdir(checkpoint):
        return read_source_text(patch.source, checkpoint_dir=checkpoint)
    return read_source_text(replace(patch.source, repo_id=checkpoint, revision=None), hub_cache=hub_cache)


def prepare_frontend_assets(recipe_name: str, checkpoint: str, variant: str | None = None,
                            hub_cache: str | None = None, annotated: str | None = None) -> FrontendAssets:
    """Verify and annotate the checkpoint's template (or check a prepared ``annotated`` text against
    the patch's result hash) and locate its tokenizer."""
    recipe = load_recipe(recipe_name)
    decl = _declared_checkpoint(recipe, checkpoint, hub_cache)
    variant = variant or decl.variant
    patch = TemplatePatch.load(recipe.patch_path(variant))
    if annotated is None:
        annotated = patch.apply(checkpoint_template_source(patch, checkpoint, hub_cache))
    elif sha256(annotated) != patch.result_sha256:
        raise TemplateSourceMismatch(f"prepared annotated template for {recipe_name}/{variant}",
                                     patch.result_sha256, sha256(annotated))
    if _is_embedded(decl):
        from ignition.embedded import materialize_default

        folder = materialize_default()
        tok_path, cfg_path = folder / "tokenizer.json", folder / "tokenizer_config.json"
    else:
        tok_path = _checkpoint_file(checkpoint, "tokenizer.json", hub_cache)
        cfg_path = _checkpoint_file(checkpoint, "tokenizer_config.json", hub_cache)
    variables = special_token_variables(json.loads(Path(cfg_path).read_text()))
    return FrontendAssets(recipe, decl, variant, annotated, Path(tok_path), variables)


def _is_embedded(decl: Checkpoint) -> bool:
    return decl.repo_id.startswith("flare/")


def _declared_checkpoint(recipe: Recipe, checkpoint: str, hub_cache) -> Checkpoint:
    if not os.path.isdir(checkpoint):
        return recipe.checkpoint(checkpoint)
    config = Path(checkpoint) / "config.json"
    hidden = None
    if config.is_file():
        cfg = json.loads(config.read_text())
        hidden = cfg.get("hidden_size") or (cfg.get("text_config") or {}).get("hidden_size")
    for c in recipe.checkpoints:
        if hidden is not None and c.hidden_size == hidden:
            return c
    return recipe.checkpoints[0]


def load_frontend(recipe_name: str, checkpoint: str, variant: str | None = None, hub_cache: str | None = None,
                  annotated: str | None = None):
    from helios.frontend.frontend import Frontend
    from helios.frontend.tokens import PromptTokenizer

    a = prepare_frontend_assets(recipe_name, checkpoint, variant, hub_cache, annotated)
    return Frontend(a.annotated_template, PromptTokenizer.from_file(a.tokenizer_path), a.variables,
                    a.recipe.frontend, a.checkpoint.sampling)
