"""The ``{% mark %}`` Jinja extension.

``{% mark %}`` records the UTF-8 byte position of the output at that point without emitting
anything; ``{% mark expr %}`` records the value of ``expr`` (token-segment templates count
completed segments).  Marks are legal only at root output sites: inside a macro, a call block,
a captured ``{% set %}…{% endset %}`` or a filter block the output is buffered and its final
position is unknown, so compiling such a template fails with an error naming the line.

Positions are recorded by :func:`render_with_marks`, which consumes the template's root
generator chunk by chunk: a mark executes after every earlier chunk has been yielded and
counted, and before the next one, so the recorded position is exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from jinja2 import nodes
from jinja2.exceptions import TemplateSyntaxError
from jinja2.ext import Extension

#: Blocks whose body is rendered into a buffer rather than the template output.
BUFFERED_BLOCKS = ("macro", "call", "set", "filter")

#: Pattern of a mark tag as written in an annotated template (used to author and strip patches).
MARK_TAG = re.compile(r"\{%[-+]?\s*mark\b(?:[^%]|%(?!\}))*?[-+]?%\}")

RECORDER_VAR = "__flare_mark_recorder"


@dataclass
class MarkRecorder:
    """Per-render state: the byte position consumed so far and the marks recorded."""

    position: int = 0  # UTF-8 bytes emitted so far
    chars: int = 0  # characters emitted so far
    marks: list[tuple[int, Any]] = field(default_factory=list)  # (line, (bytes, chars)) or (line, value)
    spans: list[tuple[Any, int, int]] = field(default_factory=list)  # tracked (key, start, end) characters
    literal_expected: int = 0  # special-token spellings in content (set by the frontend)


class MarkExtension(Extension):
    tags = {"mark"}

    def parse(self, parser):
        token = next(parser.stream)
        lineno = token.lineno
        open_blocks = [name for name in parser._tag_stack if name in BUFFERED_BLOCKS]
        if open_blocks:
            raise TemplateSyntaxError(
                f"{{% mark %}} inside a {open_blocks[-1]!r} block at line {lineno}: marks are allowed only "
                "at root output sites (mark the call site after the helper returns)",
                lineno,
                parser.name,
                parser.filename,
            )
        if parser.stream.current.type == "block_end":
            value: nodes.Expr = nodes.Const(None)
        else:
            value = parser.parse_expression()
        call = self.call_method(
            "_record", [nodes.ContextReference(), nodes.Const(lineno), value], lineno=lineno
        )
        return nodes.ExprStmt(call, lineno=lineno)

    @staticmethod
    def _record(context, lineno: int, value: Any) -> str:
        recorder = context.get(RECORDER_VAR)
        if recorder is None:  # plain rendering (e.g. by a reference renderer): marks are inert
            return ""
        recorder.marks.append((lineno, (recorder.position, recorder.chars) if value is None else value))
        return ""


class GenerationExtension(Extension):
    """``{% generation %}…{% endgeneration %}`` as transformers defines it: output unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return body


def strip_marks(annotated: str) -> str:
    """The template text with every mark tag removed."""
    return MARK_TAG.sub("", annotated)


def iter_mark_tags(annotated: str) -> Iterator[re.Match]:
    return MARK_TAG.finditer(annotated)
