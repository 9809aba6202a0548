"""The one explicit registry: recipe name -> module, architecture -> recipe (lazy imports).

A broken recipe module raises on import; nothing is silently dropped.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

from .base import Recipe

RECIPES: dict[str, str] = {
    "qwen3": "ignition.recipes.qwen3.recipe",
    "qwen3_5": "ignition.recipes.qwen3_5.recipe",
    "gemma4": "ignition.recipes.gemma4.recipe",
    "deepseek_v3": "ignition.recipes.deepseek_v3.recipe",
}

ARCHITECTURES: dict[str, str] = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Gemma4ForConditionalGeneration": "gemma4",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}


@lru_cache(maxsize=None)
def load_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise KeyError(f"unknown recipe {name!r}; registered: {', '.join(sorted(RECIPES))}")
    recipe = importlib.import_module(RECIPES[name]).RECIPE
    if recipe.name != name:
        raise ValueError(f"{RECIPES[name]} declares recipe {recipe.name!r}, registered as {name!r}")
    return recipe


def recipe_for_architecture(architecture: str) -> Recipe:
    if architecture not in ARCHITECTURES:
        raise KeyError(f"no recipe serves architecture {architecture!r}; supported: {', '.join(sorted(ARCHITECTURES))}")
    return load_recipe(ARCHITECTURES[architecture])


def all_recipes() -> list[Recipe]:
    return [load_recipe(name) for name in RECIPES]
