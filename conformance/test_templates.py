"""Annotated templates: marks strip to the authoritative bytes, changed sources are rejected,
and planted defects are caught."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ignition.hub import REPO_ROOT
from ignition.recipes.registry import load_recipe
from ignition.templates.marks import strip_marks
from ignition.templates.patch import (Insertion, TemplatePatch, TemplateSourceMismatch, TemplateSourceMissing,
                                      read_source_text, sha256)
from .checks import check_endpoint_invariants
from .registry import variant_cases

VARIANTS_DIR = REPO_ROOT.parent / "shared" / "variants"
VARIANT_CASES = variant_cases()
# Folder names of ../shared/variants -> recipe that serves that family.
VARIANT_FAMILY = {"qwen3": "qwen3", "qwen3.5": "qwen3_5", "deepseek-v3": "deepseek_v3", "gemma-4-31B-it": "gemma4"}


def _source(recipe, variant, hub_cache):
    patch = TemplatePatch.load(load_recipe(recipe).patch_path(variant))
    if not patch.source.embedded and hub_cache is None:
        pytest.skip("no hub cache")
    try:
        return patch, read_source_text(patch.source, hub_cache=hub_cache)
    except TemplateSourceMissing as exc:
        pytest.skip(f"pinned source missing: {exc}")


@pytest.mark.parametrize("recipe,variant", VARIANT_CASES, ids=[f"{r}-{v}" for r, v in VARIANT_CASES])
def test_removing_marks_reproduces_the_source(recipe, variant, hub_cache):
    patch, source = _source(recipe, variant, hub_cache)
    annotated = patch.apply(source)
    assert annotated != source and "mark" in annotated
    assert strip_marks(annotated).encode("utf-8") == source.encode("utf-8")
    assert sha256(strip_marks(annotated)) == patch.source_sha256


@pytest.mark.parametrize("recipe,variant", VARIANT_CASES, ids=[f"{r}-{v}" for r, v in VARIANT_CASES])
def test_planted_mark_moved_one_byte_is_caught(recipe, variant, hub_cache):
    patch, source = _source(recipe, variant, hub_cache)
    first = patch.insertions[0]
    moved = replace(patch, insertions=(Insertion(first.offset + 1, first.text),) + patch.insertions[1:])
    with pytest.raises(TemplateSourceMismatch):
        moved.apply(source)


def _variant_files():
    table = json.loads((VARIANTS_DIR / "variants.json").read_text()) if VARIANTS_DIR.is_dir() else []
    return [(e, VARIANT_FAMILY[e["file"].split("/")[0]]) for e in table]


@pytest.mark.parametrize("entry,recipe", _variant_files(), ids=[e["file"] for e, _ in _variant_files()])
def test_changed_upstream_source_is_rejected(entry, recipe):
    path = VARIANTS_DIR / entry["file"]
    raw = path.read_bytes()
    r = load_recipe(recipe)
    kind = "tokenizer_config.json" if path.name.startswith("tokenizer_config") else "chat_template.jinja"
    patches = [TemplatePatch.load(r.patch_path(v.name)) for v in r.variants]
    patches = [p for p in patches if p.source.filename == kind]
    assert patches, f"recipe {recipe} has no variant pinned to a {kind}"
    text = json.loads(raw)["chat_template"] if kind == "tokenizer_config.json" else raw.decode("utf-8")
    for patch in patches:
        with pytest.raises(TemplateSourceMismatch) as err:
            patch.apply(text)
        message = str(err.value)
        assert patch.source_sha256 in message and sha256(text) in message


@pytest.mark.parametrize("recipe,variant", VARIANT_CASES, ids=[f"{r}-{v}" for r, v in VARIANT_CASES])
def test_every_mark_is_recorded_at_a_root_site(recipe, variant, hub_cache):
    """The annotated template compiles with the mark extension (marks outside buffered blocks)."""
    from helios.frontend.environment import compile_template

    patch, source = _source(recipe, variant, hub_cache)
    compile_template(patch.apply(source))


def test_planted_rounded_token_endpoint_is_caught():
    # A toy byte-level tokenizer: every character is a token, except "ab" which merges.
    prompt = "xxab|yy"
    tokens = ["x", "x", "ab", "|", "y", "y"]
    ids = list(range(len(tokens)))
    decode = lambda seq: "".join(tokens[i] for i in seq)
    # Byte 3 falls inside the "ab" token: that cut must be omitted; byte 5 is exact at token 4.
    assert check_endpoint_invariants(prompt, ids, [3, 5], [4], [5], decode) == []
    # Rounding the crossed cut to a neighbouring token boundary (2 or 3) is a defect.
    assert check_endpoint_invariants(prompt, ids, [3, 5], [2, 4], [3, 5], decode)
    assert check_endpoint_invariants(prompt, ids, [3, 5], [3, 4], [3, 5], decode)
    # Omitting an exact cut is a defect too.
    assert check_endpoint_invariants(prompt, ids, [3, 5], [], [], decode)
