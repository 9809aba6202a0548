"""FrontendSpec / SamplingDefaults round trips through the proto, and the format-version table."""

from __future__ import annotations

import dataclasses

import pytest
from core_kit import core_message, rewrite_manifest

from ignition.core import (CURRENT_FORMAT_VERSION, CoreFormatError, frontend_from_proto, frontend_to_proto,
                           load_core, sampling_from_proto, sampling_to_proto)
from ignition.core import core_pb2 as pb
from ignition.core.schema import NULLABLE_FRONTEND_FIELDS, VALUED_FRONTEND_FIELDS
from ignition.core.versions import FORMAT_VERSIONS, FormatVersion, migrate
from ignition.recipes.base import NEUTRAL_SAMPLING, FrontendSpec, SamplingDefaults
from ignition.recipes.registry import all_recipes

RECIPES = all_recipes()
SPECS = [pytest.param(r.frontend, id=f"recipe-{r.name}") for r in RECIPES] + [
    pytest.param(FrontendSpec(), id="defaults"),
    pytest.param(FrontendSpec(thinking_kwarg=None, default_thinking=None, image_token=None), id="all-none"),
    pytest.param(FrontendSpec(content_format="blocks", developer_role=True, thinking_kwarg="think",
                              default_thinking=False, image_token="<img>", reasoning_field="reasoning",
                              text_joiner="", renders_tools=False, tool_arguments="json",
                              assistant_null_content=True), id="every-non-default"),
    pytest.param(FrontendSpec(thinking_kwarg="", image_token="", text_joiner="\u2028é🚀"), id="empty-and-unicode"),
]
SAMPLINGS = [pytest.param(c.sampling, id=f"{r.name}-{c.name}") for r in RECIPES for c in r.checkpoints] + [
    pytest.param(SamplingDefaults(values=dict(NEUTRAL_SAMPLING), citation="", verified=False), id="neutral"),
    pytest.param(SamplingDefaults(values={**NEUTRAL_SAMPLING, "top_k": 40, "temperature": 0.7},
                                  ranges={"top_k": (1, 100), "temperature": (0.5, 0.7), "min_p": (0.0, 0.2)},
                                  citation="ranges of every kind"), id="ranges"),
]


def _through_bytes(msg):
    return type(msg).FromString(msg.SerializeToString())


@pytest.mark.parametrize("spec", SPECS)
def test_frontend_spec_round_trip(spec):
    back = frontend_from_proto(_through_bytes(frontend_to_proto(spec)))
    assert back == spec
    for f in dataclasses.fields(FrontendSpec):
        assert type(getattr(back, f.name)) is type(getattr(spec, f.name)), f.name


def test_frontend_mapping_covers_every_frontend_spec_field():
    """A field added to FrontendSpec without a message field fails here (and in frontend_to_proto)."""
    names = {f.name for f in dataclasses.fields(FrontendSpec)}
    assert names == set(NULLABLE_FRONTEND_FIELDS) | set(VALUED_FRONTEND_FIELDS)
    assert names <= set(pb.Frontend.DESCRIPTOR.fields_by_name)
    nullable = {f.name for f in dataclasses.fields(FrontendSpec) if f.default is None or "None" in str(f.type)}
    assert nullable == set(NULLABLE_FRONTEND_FIELDS)


def test_frontend_extras_round_trip():
    msg = _through_bytes(frontend_to_proto(FrontendSpec(), eos_token_ids=[151645, 151643],
                                           special_token_variables={"bos_token": "", "eos_token": "<|im_end|>"}))
    assert list(msg.eos_token_ids) == [151645, 151643]
    assert dict(msg.special_token_variables) == {"bos_token": "", "eos_token": "<|im_end|>"}
    assert msg.renderer == pb.RENDERER_JINJA_TEXT


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_sampling_defaults_round_trip(sampling):
    back = sampling_from_proto(_through_bytes(sampling_to_proto(sampling)))
    assert back == sampling
    assert list(back.ranges) == list(sampling.ranges)  # order kept
    for name, value in sampling.values.items():
        assert type(back.values[name]) is type(value), name
    for name, bounds in sampling.ranges.items():
        assert [type(b) for b in back.ranges[name]] == [type(b) for b in bounds], name
    assert back.resolve({"top_k": 1000, "temperature": 5}) == sampling.resolve({"top_k": 1000, "temperature": 5})


def test_sampling_rejects_a_fractional_top_k():
    bad = SamplingDefaults(values={**NEUTRAL_SAMPLING, "top_k": 2.5}, citation="x")
    with pytest.raises(ValueError, match="top_k must be an integer"):
        sampling_to_proto(bad)


def test_sampling_value_absent_is_an_error_not_zero():
    msg = sampling_to_proto(SamplingDefaults(values=dict(NEUTRAL_SAMPLING), citation="x"))
    msg.ClearField("temperature")
    with pytest.raises(CoreFormatError, match="temperature missing"):
        sampling_from_proto(_through_bytes(msg))


# -- versions -----------------------------------------------------------------------------------------
def test_current_version_is_in_the_table():
    assert CURRENT_FORMAT_VERSION in FORMAT_VERSIONS
    assert FORMAT_VERSIONS[CURRENT_FORMAT_VERSION].upgrade is None
    for n in range(min(FORMAT_VERSIONS), CURRENT_FORMAT_VERSION):
        assert FORMAT_VERSIONS[n].upgrade is not None, f"no migration from version {n}"


def test_v1_defines_a_default_for_every_valued_frontend_field():
    defaults = FORMAT_VERSIONS[1].absent_defaults
    assert {f"frontend.{n}" for n in VALUED_FRONTEND_FIELDS} <= set(defaults)
    assert not {f"frontend.{n}" for n in NULLABLE_FRONTEND_FIELDS} & set(defaults)  # absent means None


def test_v1_core_without_optional_frontend_fields_gets_v1_defaults(make_core):
    """A v1 core written without the valued frontend fields (or the renderer) keeps v1's meaning."""
    path = make_core()

    def strip(c):
        c.frontend.ClearField("renderer")
        for name in VALUED_FRONTEND_FIELDS:
            c.frontend.ClearField(name)

    rewrite_manifest(path, strip)
    core = load_core(path, progress=False)
    assert core.format_version == 1 and core.manifest.frontend.renderer == pb.RENDERER_JINJA_TEXT
    spec = core.frontend_spec()
    assert (spec.content_format, spec.text_joiner, spec.tool_arguments, spec.reasoning_field) == (
        "string", "\n", "object", "reasoning_content")
    assert (spec.developer_role, spec.renders_tools, spec.assistant_null_content) == (False, True, False)
    assert (spec.thinking_kwarg, spec.default_thinking, spec.image_token) == ("enable_thinking", False, "<|image|>")


def test_migration_chain_runs_each_step_with_each_versions_defaults():
    """A table with an older version: its defaults apply, then its upgrade step, then the next version's."""
    calls = []

    def v1_to_v2(core):
        calls.append(core.frontend.text_joiner)
        core.frontend.text_joiner = core.frontend.text_joiner * 2

    table = {
        1: FormatVersion(1, "old", {"frontend.text_joiner": "|"}, upgrade=v1_to_v2),
        2: FormatVersion(2, "new", {"frontend.content_format": "blocks"}),
    }
    core = core_message()
    core.format_version = 1
    core.frontend.ClearField("text_joiner")
    core.frontend.ClearField("content_format")
    assert migrate(core, versions=table, current=2) == 1
    assert calls == ["|"] and core.frontend.text_joiner == "||" and core.frontend.content_format == "blocks"
    assert core.format_version == 2


def test_migration_without_a_step_is_refused():
    table = {1: FormatVersion(1, "old"), 2: FormatVersion(2, "new")}
    core = core_message()
    core.format_version = 1
    with pytest.raises(CoreFormatError, match="no migration from core format version 1 to 2"):
        migrate(core, versions=table, current=2)
