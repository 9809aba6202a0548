"""The inspection command, sampling resolution and special-token variables."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helios.frontend.conversation import FrontendError
from ignition.frontend_assets import special_token_variables
from ignition.recipes.registry import all_recipes

ROOT = Path(__file__).resolve().parents[2]


def _render(tmp_path, request, *extra):
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request) if not isinstance(request, str) else request)
    return subprocess.run([sys.executable, "-m", "ignition.cli", "frontend", "render", "--recipe", "qwen3",
                           "--checkpoint", "flare/embedded-default", "--protocol", "openai", str(path), *extra],
                          capture_output=True, text=True, cwd=ROOT)


def test_render_prints_one_json_object(tmp_path):
    out = _render(tmp_path, {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                          {"role": "user", "content": "again"}], "temperature": 0.3, "seed": 7})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {"prompt", "token_ids", "message_endpoints", "token_endpoints", "hint_cuts", "image_order",
            "sampling"} <= set(doc)
    assert doc["prompt"].startswith("<|im_start|>user\nhi") and doc["sampling"]["seed"] == 7
    assert len(doc["token_endpoints"]) == 3 and doc["message_endpoints"] == sorted(doc["message_endpoints"])


@pytest.mark.parametrize("request_body,needle", [
    ("{not json", "cannot read request"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}], "top_q": 1}, "top_q"),
])
def test_bad_input_exits_nonzero_with_one_line(tmp_path, request_body, needle):
    out = _render(tmp_path, request_body)
    assert out.returncode != 0 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr


@pytest.mark.parametrize("recipe", all_recipes(), ids=lambda r: r.name)
def test_sampling_defaults_are_complete_cited_and_clamped(recipe):
    for ckpt in recipe.checkpoints:
        s = ckpt.sampling
        assert s.citation
        resolved = s.resolve({"temperature": 1e6, "top_k": 3, "seed": 11})
        assert resolved["seed"] == 11
        for name, value in s.values.items():
            if name in s.ranges:
                lo, hi = s.ranges[name]
                assert lo <= resolved[name] <= hi
            elif name in ("temperature", "top_k"):
                assert resolved[name] == value  # no author range: fixed at the default
        with pytest.raises(FrontendError) as err:
            s.resolve({"temperature": "hot"})
        assert err.value.field == "temperature"


def test_qwen3_presence_penalty_is_clamped_to_the_card_range():
    from ignition.recipes.registry import load_recipe

    s = load_recipe("qwen3").checkpoint("Qwen/Qwen3-8B").sampling
    assert s.resolve({"presence_penalty": 5})["presence_penalty"] == 2.0
    assert s.resolve({"presence_penalty": -1})["presence_penalty"] == 0.0
    assert s.resolve({"presence_penalty": 1.2})["presence_penalty"] == 1.2


@pytest.mark.parametrize("recipe_name,checkpoint", [(r.name, c.repo_id) for r in all_recipes() for c in r.checkpoints
                                                    if not c.repo_id.startswith("flare/")])
def test_special_token_variables_match_transformers(recipe_name, checkpoint, hub_cache):
    from conformance.reference import AssetMissing, reference_tokenizer
    from ignition.templates.patch import hub_file

    if hub_cache is None:
        pytest.skip("no hub cache")
    try:
        tok = reference_tokenizer(recipe_name, checkpoint, hub_cache)
        config = json.loads(Path(hub_file(checkpoint, "tokenizer_config.json", None, hub_cache)).read_text())
    except (AssetMissing, FileNotFoundError) as exc:
        pytest.skip(f"asset missing: {exc}")
    ours = special_token_variables(config)
    theirs = {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)}
    assert {k: ours[k] for k in theirs if k in ours} == theirs
    assert set(theirs) <= set(ours)
