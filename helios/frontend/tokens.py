"""Tokenize once and map message endpoints to token endpoints.

Template text is tokenized with special tokens recognized; spans that came from message content
and spell a special token are tokenized as ordinary text (they never become special IDs).  Cuts
come from the full encoding's untrimmed offsets: a cut is exact only when every preceding token
ends at or before it and every following token starts at or after it — otherwise it is omitted,
never rounded.  Offsets are character offsets of the prompt (marks record characters too), so a
token that covers part of a multi-byte character overlaps its neighbour and no cut falls inside.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer


@dataclass
class Encoding:
    ids: list[int]
    starts: np.ndarray  # UTF-8 byte start of each token (untrimmed)
    ends: np.ndarray  # UTF-8 byte end of each token (untrimmed)
    _prefix_max: np.ndarray | None = None
    _suffix_min: np.ndarray | None = None

    def bounds(self):
        if self._prefix_max is None:
            self._prefix_max = np.maximum.accumulate(self.ends) if len(self.ends) else self.ends
            self._suffix_min = np.append(np.minimum.accumulate(self.starts[::-1])[::-1], np.iinfo(np.int64).max)
        return self._prefix_max, self._suffix_min


def _bytes_to_unicode() -> dict[str, int]:
    """The byte-level BPE alphabet: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_byte_lengths(tokenizer_json: dict) -> np.ndarray | None:
    """UTF-8 byte length of every token ID, where the vocabulary spells bytes unambiguously
    (byte-level BPE, or ``▁``-for-space with ``<0xNN>`` byte fallback); None otherwise."""
    model = tokenizer_json.get("model") or {}
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        return None
    text = json.dumps([tokenizer_json.get("pre_tokenizer"), tokenizer_json.get("decoder")])
    size = max(max(vocab.values(), default=0), max((t["id"] for t in tokenizer_json.get("added_tokens", [])), default=0)) + 1
    lengths = np.full(size, -1, dtype=np.int64)
    if '"ByteLevel"' in text:
        alphabet = _bytes_to_unicode()
        for piece, i in vocab.items():
            if all(ch in alphabet for ch in piece):
                lengths[i] = len(piece)
    elif '"ByteFallback"' in text and '\\u2581' in text:
        for piece, i in vocab.items():
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                lengths[i] = 1
            else:
                lengths[i] = len(piece.replace("▁", " ").encode("utf-8"))
    else:
        return None
    for t in tokenizer_json.get("added_tokens", []):
        lengths[t["id"]] = len(t["content"].encode("utf-8"))
    return lengths


class PromptTokenizer:
    """The checkpoint tokenizer (``tokenizer.json``) wrapped for the frontend."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        spec = json.loads(tokenizer.to_str())
        added = spec.get("added_tokens", [])
        self.byte_lengths = token_byte_lengths(spec)
        self.special_tokens = {t["content"]: t["id"] for t in added if t.get("special")}
        self._special_re = (
            re.compile("|".join(re.escape(s) for s in sorted(self.special_tokens, key=len, reverse=True)))
            if self.special_tokens else None
        )
        # Distinct two-character prefixes of the special spellings: a fast C-level prefilter.
        self._special_prefixes = tuple(sorted({t[:2] for t in self.special_tokens}))
        self._literal = None  # a copy that treats special spellings as text, built on first need

    @classmethod
    def from_file(cls, path) -> "PromptTokenizer":
        return cls(Tokenizer.from_file(str(path)))

    def spells_special(self, text: str) -> bool:
        return self._special_re is not None and self._special_re.search(text) is not None

    def special_spans(self, text: str) -> list[tuple[int, int]]:
        if self._special_re is None or not any(p in text for p in self._special_prefixes):
            return []
        return [m.span() for m in self._special_re.finditer(text)]

    def encode(self, prompt: str, literal_spans: list[tuple[int, int]] = ()) -> Encoding:
        """Encode ``prompt``; ``literal_spans`` (character spans) hold content to keep as text.

        Byte offsets come from the token byte lengths where the vocabulary spells bytes (checked:
        they must tile the prompt exactly), else from the tokenizer's untrimmed character offsets."""
        if literal_spans:
            ids, offsets = self._encode_with_literals(prompt, literal_spans)
        elif self.byte_lengths is not None:
            ids, offsets = self.tokenizer.encode_batch_fast([prompt], add_special_tokens=False)[0].ids, None
        else:
            enc = self.tokenizer.encode_batch([prompt], add_special_tokens=False)[0]
            ids, offsets = enc.ids, enc.offsets
        if self.byte_lengths is not None:
            lengths = self.byte_lengths[np.asarray(ids, dtype=np.int64)]
            ends = np.cumsum(lengths)
            n_bytes = len(prompt) if prompt.isascii() else len(prompt.encode("utf-8"))
            if (lengths >= 0).all() and (len(ends) == 0 or ends[-1] == n_bytes):
                return Encoding(ids, ends - lengths, ends)
        if offsets is None:
            offsets = self.tokenizer.encode_batch([prompt], add_special_tokens=False)[0].offsets
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


def _char_to_byte(text: str):
    """A function mapping character offsets of ``text`` to UTF-8 byte offsets (vectorized)."""
    if text.isascii():
        return lambda a: np.asarray(a, dtype=np.int64)
    cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    widths = 1 + (cps >= 0x80) + (cps >= 0x800) + (cps >= 0x10000)
    prefix = np.zeros(len(cps) + 1, dtype=np.int64)
    np.cumsum(widths, out=prefix[1:])
    return lambda a: prefix[np.asarray(a, dtype=np.int64)]


def exact_token_cut(enc: Encoding, byte_cut: int) -> int | None:
    """The token index at an exact byte cut, or None when a token crosses it."""
    prefix_max, suffix_min = enc.bounds()
    i = int(np.searchsorted(prefix_max, byte_cut, side="right"))  # tokens [0, i) all end at or before the cut
    return i if suffix_min[i] >= byte_cut else None


def token_endpoints(enc: Encoding, byte_cuts) -> list[tuple[int, int]]:
    """Exact ``(token endpoint, byte cut)`` pairs: sorted, unique, strictly inside the prompt."""
    n = len(enc.ids)
    out: dict[int, int] = {}
    for cut in sorted(byte_cuts):
        t = exact_token_cut(enc, cut)
        if t is not None and 0 < t < n:
            out.setdefault(t, cut)
    return sorted(out.items())


def safe_prefix_cut(enc: Encoding, byte_cut: int, prompt_bytes: bytes) -> int:
    """The longest complete-token prefix ending at or before ``byte_cut`` on a character
    boundary, with no later token starting inside it (advisory hints)."""
    prefix_max, suffix_min = enc.bounds()
    i = int(np.searchsorted(prefix_max, byte_cut, side="right"))
    while i > 0 and (suffix_min[i] < prefix_max[i - 1]
                     or (prefix_max[i - 1] < len(prompt_bytes) and 0x80 <= prompt_bytes[prefix_max[i - 1]] < 0xC0)):
        i -= 1
    return i
