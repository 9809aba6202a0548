"""Strings that remember where tracked pieces of them came from.

A ``TrackedStr`` carries spans ``(key, start, end)`` in characters.  Concatenation (``+`` on
either side), ``strip``/``lstrip``/``rstrip`` and ``split`` on a separator keep the spans exact; every other operation
returns a plain ``str`` and the spans are lost, so a position is never guessed after a
transformation that cannot be mapped.  ``str()`` of a tracked string is itself and Jinja's
buffer join keeps spans (:func:`concat`), so tracked pieces survive macros, captured blocks and
``trim``; the renderer records the spans of each tracked chunk at its exact output position.

Only requests that need positions (block hints, continuation, literal special-token
spellings) create tracked strings; the ordinary path creates none.
"""

from __future__ import annotations

from typing import Any

Span = tuple[Any, int, int]


class TrackedStr(str):
    spans: tuple[Span, ...]

    def __new__(cls, value: str, spans: tuple[Span, ...] = ()):
        self = super().__new__(cls, value)
        self.spans = spans
        return self

    @classmethod
    def whole(cls, value: str, key: Any) -> "TrackedStr":
        return cls(value, ((key, 0, len(value)),))

    def __add__(self, other):
        if not isinstance(other, str):
            return NotImplemented
        joined = str.__add__(self, other)
        spans = self.spans
        if isinstance(other, TrackedStr):
            n = len(self)
            spans = spans + tuple((k, s + n, e + n) for k, s, e in other.spans)
        return TrackedStr(joined, spans)

    def __radd__(self, other):
        if not isinstance(other, str):
            return NotImplemented
        n = len(other)
        return TrackedStr(str.__add__(other, self), tuple((k, s + n, e + n) for k, s, e in self.spans))

    def _clip(self, left: int, right: int) -> "TrackedStr":
        value = str.__getitem__(self, slice(left, right))
        spans = []
        for k, s, e in self.spans:
            s2, e2 = max(s, left), min(e, right)
            if s2 <= e2 and not (s2 == e2 and s != e):  # an emptied span is dropped
                spans.append((k, s2 - left, e2 - left))
        return TrackedStr(value, tuple(spans))

    def strip(self, chars=None):
        inner = str.strip(self, chars)
        left = len(self) - len(str.lstrip(self, chars)) if inner else len(self)
        return self._clip(left, left + len(inner))

    def lstrip(self, chars=None):
        rest = str.lstrip(self, chars)
        return self._clip(len(self) - len(rest), len(self))

    def rstrip(self, chars=None):
        return self._clip(0, len(str.rstrip(self, chars)))

    def split(self, sep=None, maxsplit=-1):
        """Parts of a split are slices of this string, so spans that overlap them are kept."""
        parts = str.split(self, sep, maxsplit)
        if sep is None or not self.spans:
            return parts
        out, pos = [], 0
        for part in parts:
            out.append(self._clip(pos, pos + len(part)))
            pos += len(part) + len(sep)
        return out

    def __str__(self):  # Jinja calls str() on every output: keep the spans travelling
        return self


def concat(pieces) -> str:
    """``"".join`` that keeps tracked spans (Jinja's buffer join for macros and captured blocks)."""
    pieces = list(pieces)
    if not any(type(p) is TrackedStr for p in pieces):
        return "".join(pieces)
    spans, pos = [], 0
    for p in pieces:
        if type(p) is TrackedStr:
            spans.extend((k, s + pos, e + pos) for k, s, e in p.spans)
        pos += len(p)
    return TrackedStr("".join(pieces), tuple(spans))
