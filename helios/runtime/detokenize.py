"""Incremental detokenization: the text of a growing list of generated tokens at O(1) decode work per token.

Decoding the whole list after every token (``tokenizer.decode(ids)``) costs time proportional to the output so
far -- quadratic over a long reply, per running row, on the engine thread.  :class:`IncrementalText` decodes only
a short window per token, as serving stacks do (vLLM's ``detokenize_incrementally``): with ``prefix`` and
``read`` offsets into the ids, ``decode(ids[prefix:read])`` is the text already emitted from that window and
``decode(ids[prefix:])`` the window with the new token; the difference is the new text.  The window starts at a
token that began on a character boundary, so decoders that treat the start of a string specially (a stripped
leading space, a metaspace prefix) treat both decodes alike.  A window whose text ends in U+FFFD (an incomplete
UTF-8 sequence across byte-level tokens) is not emitted until a later token completes it; :meth:`full` returns
the text with such a pending tail (for the final flush).

Invariant (``tests/server/test_detokenize.py``, over the embedded and real checkpoint tokenizers): whenever the
full decode does not end in U+FFFD, ``text`` equals it; ``full()`` always does.
"""

from __future__ import annotations

from typing import Callable

REPLACEMENT = "\ufffd"


class IncrementalText:
    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.text = ""  # emitted so far: complete characters only
        self.prefix = 0  # window start (a token that starts on a character boundary)
        self.read = 0  # ids up to here are in ``text``

    def _window(self) -> tuple[str, str]:
        return self.decode(self.ids[self.prefix:self.read]), self.decode(self.ids[self.prefix:])

    def append(self, token: int) -> str:
        """Add ``token``; returns the newly completed text ('' while a character is incomplete)."""
        self.ids.append(token)
        before, now = self._window()
        if len(now) > len(before) and not now.endswith(REPLACEMENT):
            new = now[len(before):]
            self.text += new
            self.prefix, self.read = self.read, len(self.ids)
            return new
        return ""

    def full(self) -> str:
        """``text`` plus any pending tail (which may end in U+FFFD): the decode of every id."""
        before, now = self._window()
        return self.text + now[len(before):]
