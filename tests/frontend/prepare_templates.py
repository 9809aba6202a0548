#!/usr/bin/env python3
"""Prepare annotated chat templates for the frontend tests.

    python tests/frontend/prepare_templates.py [--hub-cache PATH] --output DIR [--recipe NAME]
    export FLARE_TEST_TEMPLATE_DIR=DIR

Each recipe variant whose pinned source is in the hub cache is verified against its patch asset,
annotated, and written to ``DIR/<recipe>/chat_template.<variant>.jinja``.  Tests read that folder
when ``FLARE_TEST_TEMPLATE_DIR`` is set and otherwise prepare from the hub cache in ../shared/hub.
No model weights are read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ignition.hub import default_hub_cache  # noqa: E402
from ignition.recipes.registry import RECIPES, load_recipe  # noqa: E402
from ignition.templates.patch import TemplatePatch, TemplateSourceMissing, read_source_text  # noqa: E402


def annotated_path(root: Path, recipe: str, variant: str) -> Path:
    return Path(root) / recipe / f"chat_template.{variant}.jinja"


def prepare(output: Path, hub_cache: str | None, recipes: list[str]) -> int:
    missing = 0
    for name in recipes:
        recipe = load_recipe(name)
        for v in recipe.variants:
            patch = TemplatePatch.load(recipe.patch_path(v.name))
            try:
                text = patch.apply(read_source_text(patch.source, hub_cache=hub_cache))
            except TemplateSourceMissing as exc:
                print(f"skip {name}/{v.name}: {exc}")
                missing += 1
                continue
            path = annotated_path(output, name, v.name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"prepared {name}/{v.name}: {path} ({len(patch.insertions)} marks, {patch.source.describe()})")
    return missing


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hub-cache", default=None, help="HF hub cache (default: ../shared/hub, materialized)")
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--recipe", action="append", choices=sorted(RECIPES), help="only these recipes")
    args = p.parse_args(argv)
    hub = args.hub_cache or default_hub_cache()
    if hub is None:
        print("error: no hub cache (pass --hub-cache or unpack ../shared/hub)", file=sys.stderr)
        return 2
    prepare(args.output, hub, args.recipe or sorted(RECIPES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
