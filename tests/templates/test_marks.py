"""The {% mark %} extension: zero output, exact byte positions, rejection inside buffered blocks."""

import pytest
from jinja2.exceptions import TemplateSyntaxError

from helios.frontend.environment import compile_template, render_with_marks
from ignition.templates.marks import strip_marks


def _render(source, **variables):
    text, rec = render_with_marks(compile_template(source), variables)
    return text, [v for _, v in rec.marks]


def test_mark_records_utf8_byte_positions_and_emits_nothing():
    text, marks = _render("é{% mark %}ab{% for x in xs %}{{ x }}{% mark %}{% endfor %}", xs=["🚀", "z"])
    assert text == "éab🚀z"
    assert [b for b, _ in marks] == [2, 8, 9]  # bytes, not characters
    assert [c for _, c in marks] == [1, 4, 5]


def test_mark_expression_records_its_value():
    text, marks = _render("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + 1 %}{% mark ns.n %}{% endfor %}",
                          xs="abc")
    assert text == "" and marks == [1, 2, 3]


@pytest.mark.parametrize("source,block", [
    ("{% macro m() %}x{% mark %}{% endmacro %}{{ m() }}", "macro"),
    ("{% macro m() %}{{ caller() }}{% endmacro %}{% call m() %}x{% mark %}{% endcall %}", "call"),
    ("{% set s %}x{% mark %}{% endset %}{{ s }}", "set"),
    ("{% filter upper %}x{% mark %}{% endfilter %}", "filter"),
])
def test_mark_inside_buffered_block_is_rejected_with_line(source, block):
    source = "line one\n" + source
    with pytest.raises(TemplateSyntaxError) as err:
        compile_template(source)
    assert block in str(err.value) and "line 2" in str(err.value)


def test_whitespace_control_is_preserved_by_marks():
    src = "{%- if true %}\n  a\n{%- endif %}{%- mark %}\n{{- 'b' }}"
    text, marks = _render(src)
    assert text == _render(strip_marks(src))[0] == "\n  ab"[1:] or text == _render(strip_marks(src))[0]
    assert marks[0][0] == len(text.split("b")[0].encode())


def test_strip_marks_removes_every_variant_of_the_tag():
    assert strip_marks("a{% mark %}b{%- mark -%}c{%+ mark ns.x | length +%}d") == "abcd"
