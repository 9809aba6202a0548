"""Fixtures of the conformance matrix; cases are generated from the recipe registry."""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

import pytest

from ignition.hub import default_hub_cache
from ignition.templates.patch import TemplateSourceMissing
from .reference import AssetMissing
from .registry import frontend_cases

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "conversations"
CORPUS = json.loads((FIXTURES / "corpus.json").read_text(encoding="utf-8"))
ERRORS = json.loads((FIXTURES / "errors.json").read_text(encoding="utf-8"))
FRONTEND_CASES = frontend_cases()


@pytest.fixture(scope="session")
def hub_cache():
    return default_hub_cache()


@lru_cache(maxsize=None)
def _frontend(recipe, checkpoint, variant, hub_cache):
    """The frontend under test; annotated templates come from FLARE_TEST_TEMPLATE_DIR when set
    (tests/frontend/prepare_templates.py), else they are prepared from the hub cache."""
    from ignition.frontend_assets import load_frontend

    annotated = None
    prepared_dir = os.environ.get("FLARE_TEST_TEMPLATE_DIR")
    if prepared_dir:
        path = Path(prepared_dir) / recipe / f"chat_template.{variant}.jinja"
        if not path.is_file():
            raise TemplateSourceMissing(f"{path} (prepare it with tests/frontend/prepare_templates.py)")
        annotated = path.read_text(encoding="utf-8")
    return load_frontend(recipe, checkpoint, variant, hub_cache, annotated)


def needs_hub(case) -> bool:
    return not case.checkpoint.startswith("flare/")


@pytest.fixture(params=FRONTEND_CASES, ids=[c.id for c in FRONTEND_CASES])
def frontend_case(request, hub_cache):
    case = request.param
    if needs_hub(case) and hub_cache is None:
        pytest.skip("no hub cache: ../shared/hub is absent and HF_HUB_CACHE is unset")
    return case


@pytest.fixture
def frontend(frontend_case, hub_cache):
    c = frontend_case
    try:
        return _frontend(c.recipe, c.checkpoint, c.variant, hub_cache)
    except (TemplateSourceMissing, AssetMissing, FileNotFoundError) as exc:
        pytest.skip(f"asset missing for {c.checkpoint}: {exc}")


def corpus_ids():
    return [c["name"] for c in CORPUS]
