"""Tokenize once and map byte endpoints to token endpoints.

Template text is tokenized with special tokens recognized; spans that came from message content
and spell a special token are tokenized as ordinary text (they never become special IDs).  Cuts
come from the full encoding's untrimmed offsets: a byte cut is exact only when every preceding
token ends at or before it and every following token starts at or after it — otherwise it is
omitted, never rounded.
"""

from __future__ import annotations

import bisect
import copy
import json
import re
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer


@dataclass
class Encoding:
    ids: list[int]
    starts: np.ndarray  # UTF-8 byte start of each token
    ends: np.ndarray  # UTF-8 byte end of each token
    prefix_max: np.ndarray | None = None  # running max of ends (computed on first use)
    suffix_min: np.ndarray | None = None  # running min of starts from the right, plus a sentinel


def _char_to_byte(text: str):
    """A function mapping character offsets of ``text`` to UTF-8 byte offsets (vectorized)."""
    if text.isascii():
        return lambda a: np.asarray(a, dtype=np.int64)
    cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    widths = 1 + (cps >= 0x80) + (cps >= 0x800) + (cps >= 0x10000)
    prefix = np.zeros(len(cps) + 1, dtype=np.int64)
    np.cumsum(widths, out=prefix[1:])
    return lambda a: prefix[np.asarray(a, dtype=np.int64)]


class PromptTokenizer:
    """The checkpoint tokenizer (``tokenizer.json``) wrapped for the frontend."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        added = json.loads(tokenizer.to_str()).get("added_tokens", [])
        self.special_tokens = {t["content"]: t["id"] for t in added if t.get("special")}
        self._special_re = (
            re.compile("|".join(re.escape(s) for s in sorted(self.special_tokens, key=len, reverse=True)))
            if self.special_tokens else None
        )
        self._literal = None  # a copy that treats special spellings as text, built on first need

    @classmethod
    def from_file(cls, path) -> "PromptTokenizer":
        return cls(Tokenizer.from_file(str(path)))

    def spells_special(self, text: str) -> bool:
        return self._special_re is not None and self._special_re.search(text) is not None

    def special_spans(self, text: str) -> list[tuple[int, int]]:
        if self._special_re is None:
            return []
        return [m.span() for m in self._special_re.finditer(text)]

    def encode(self, prompt: str, literal_spans: list[tuple[int, int]] = ()) -> Encoding:
        """Encode ``prompt``; ``literal_spans`` (character spans) hold content to keep as text."""
        if not literal_spans:
            enc = self.tokenizer.encode(prompt, add_special_tokens=False)
            ids, offsets = enc.ids, enc.offsets
        else:
            ids, offsets = self._encode_with_literals(prompt, literal_spans)
        to_bytes = _char_to_byte(prompt)
        off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
        return Encoding(list(ids), to_bytes(off[:, 0]), to_bytes(off[:, 1]))

    def _encode_with_literals(self, prompt, literal_spans):
        if self._literal is None:
            self._literal = Tokenizer.from_str(self.tokenizer.to_str())
            self._literal.encode_special_tokens = True
        literal_spans = sorted(literal_spans)
        # Special tokens the template emitted: every special match not inside a literal span.
        cuts = []
        for s, e in self.special_spans(prompt):
            i = bisect.bisect_right(literal_spans, (s, float("inf"))) - 1
            if i >= 0 and literal_spans[i][0] <= s and e <= literal_spans[i][1]:
                continue
            cuts.append((s, e))
        ids, offsets, pos = [], [], 0
        for s, e in cuts + [(len(prompt), len(prompt))]:
            if s > pos:
                enc = self._literal.encode(prompt[pos:s], add_special_tokens=False)
                ids.extend(enc.ids)
                offsets.extend((a + pos, b + pos) for a, b in enc.offsets)
            if e > s:
                ids.append(self.special_tokens[prompt[s:e]])
                offsets.append((s, e))
            pos = e
        return ids, offsets

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def _bounds(enc: Encoding):
    if enc.prefix_max is None:
        n = len(enc.ids)
        enc.prefix_max = np.maximum.accumulate(enc.ends) if n else enc.ends
        enc.suffix_min = np.append(np.minimum.accumulate(enc.starts[::-1])[::-1], np.iinfo(np.int64).max)
    return enc.prefix_max, enc.suffix_min


def exact_token_cut(enc: Encoding, byte_cut: int) -> int | None:
    """The token index at an exact byte cut, or None when a token crosses it."""
    prefix_max, suffix_min = _bounds(enc)
    i = int(np.searchsorted(prefix_max, byte_cut, side="right"))  # tokens [0, i) all end at or before the cut
    return i if suffix_min[i] >= byte_cut else None


def token_endpoints(enc: Encoding, byte_cuts) -> list[int]:
    """Exact token endpoints for the byte cuts: sorted, unique, strictly inside the prompt."""
    n = len(enc.ids)
    out = set()
    for cut in byte_cuts:
        t = exact_token_cut(enc, cut)
        if t is not None and 0 < t < n:
            out.add(t)
    return sorted(out)


def safe_prefix_cut(enc: Encoding, byte_cut: int) -> int:
    """The longest complete-token prefix ending at or before ``byte_cut`` (for advisory hints)."""
    prefix_max, suffix_min = _bounds(enc)
    i = int(np.searchsorted(prefix_max, byte_cut, side="right"))
    while i > 0 and suffix_min[i] < prefix_max[i - 1]:
        i -= 1
    return i
