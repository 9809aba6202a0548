"""Patch assets: authoring from an annotated copy, application, hash checks."""

import json

import pytest

from ignition.templates.patch import (TemplatePatch, TemplateSource, TemplateSourceMismatch, author,
                                      read_source_text, sha256)

SOURCE = "{%- for m in messages %}{{ m.content }}\n{%- endfor %}é"


def test_author_apply_roundtrip(tmp_path):
    annotated = "{%- for m in messages %}{{ m.content }}\n{%- mark %}{%- endfor %}{% mark %}é"
    patch = author(SOURCE, annotated, TemplateSource("t.jinja", embedded="x"))
    assert [i.text for i in patch.insertions] == ["{%- mark %}", "{% mark %}"]
    assert patch.apply(SOURCE) == annotated
    path = tmp_path / "p.json"
    path.write_text(patch.to_json())
    loaded = TemplatePatch.load(path)
    assert loaded == patch and "content" not in path.read_text()  # offsets and hashes only
    assert json.loads(path.read_text())["source_sha256"] == sha256(SOURCE)


def test_author_rejects_a_copy_changed_outside_its_marks():
    with pytest.raises(ValueError, match="differs from the source"):
        author(SOURCE, SOURCE.replace("\n", " ") + "{% mark %}", TemplateSource("t.jinja", embedded="x"))


def test_changed_source_is_rejected_with_both_hashes():
    patch = author(SOURCE, SOURCE + "{% mark %}", TemplateSource("t.jinja", embedded="x"))
    changed = SOURCE + " "
    with pytest.raises(TemplateSourceMismatch) as err:
        patch.apply(changed)
    assert sha256(SOURCE) in str(err.value) and sha256(changed) in str(err.value)


def test_offsets_are_utf8_bytes():
    src = "é{{ x }}"
    patch = author(src, "é{% mark %}{{ x }}", TemplateSource("t.jinja", embedded="x"))
    assert patch.insertions[0].offset == 2


def test_source_read_from_a_checkpoint_folder_json_key(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": SOURCE}))
    src = TemplateSource("tokenizer_config.json", "org/repo", "abc", json_key="chat_template")
    assert read_source_text(src, checkpoint_dir=tmp_path) == SOURCE
