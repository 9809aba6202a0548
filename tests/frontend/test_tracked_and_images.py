"""Tracked strings keep exact spans through concatenation, trimming and macros; image expansion."""

import pytest

from helios.frontend.environment import compile_template, render_with_marks
from helios.frontend.images import expand_images
from helios.frontend.tracked import TrackedStr


def test_concatenation_and_strip_keep_spans():
    t = TrackedStr.whole("  doc  ", "k")
    s = ("<a>" + t + "</a>").strip()
    assert type(s) is TrackedStr and s.spans == (("k", 3, 10),)
    inner = t.strip()
    assert str.__str__(inner) == "doc" and inner.spans == (("k", 0, 3),)


def test_untracked_transformations_drop_spans():
    t = TrackedStr.whole("a,b", "k")
    assert type(t.upper()) is str and type(t.replace("a", "b")) is str and type(t[1:]) is str
    assert all(type(p) is str for p in t.split())  # whitespace split: positions not followed


def test_spans_survive_a_macro_and_trim_in_rendering():
    tpl = compile_template("{% macro c(x) %}[{{ x }}]{% endmacro %}pre {{ c(v) | trim }} post")
    text, rec = render_with_marks(tpl, {"v": TrackedStr.whole("doc", "k")})
    assert text == "pre [doc] post"
    (key, s, e), = rec.spans
    assert key == "k" and text[s:e] == "doc"


def test_image_expansion_shifts_endpoints_and_keeps_spans_atomic():
    ids = [1, 9, 2, 3, 9, 4]
    out = expand_images(ids, [3, 5], 9, [[7, 7, 7], [8, 8]])
    assert out.token_ids == [1, 7, 7, 7, 2, 3, 8, 8, 4]
    assert out.image_spans == [(1, 4), (6, 8)]
    assert out.token_endpoints == [5, 8]


def test_image_count_mismatch_is_an_error():
    with pytest.raises(ValueError):
        expand_images([1, 9], [], 9, [[7], [8]])


def test_split_on_a_separator_keeps_spans_of_the_parts():
    t = TrackedStr("ab|cdef", (("k", 3, 6),))
    left, right = t.split("|")
    assert left.spans == () and right.spans == (("k", 0, 3),) and str.__str__(right) == "cdef"
