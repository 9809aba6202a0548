"""Image expansion: each placeholder token becomes the image's tokens; endpoints shift with them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExpandedPrompt:
    token_ids: list[int]
    token_endpoints: list[int]
    image_spans: list[tuple[int, int]]  # [start, end) token span of each image, in rendered order


def expand_images(token_ids: list[int], token_endpoints: list[int], placeholder_id: int,
                  image_tokens: list[list[int]]) -> ExpandedPrompt:
    """Replace the i-th ``placeholder_id`` by ``image_tokens[i]``.

    An endpoint at token index t moves by the growth of every placeholder before it; since a
    placeholder is one token, no endpoint can fall inside an image span, and the expanded spans
    are checked to stay atomic.
    """
    positions = [i for i, t in enumerate(token_ids) if t == placeholder_id]
    if len(positions) != len(image_tokens):
        raise ValueError(f"{len(positions)} image placeholders for {len(image_tokens)} images")
    out: list[int] = []
    spans = []
    shift_at: list[tuple[int, int]] = []  # (original index after which the shift applies, cumulative shift)
    last, shift = 0, 0
    for pos, toks in zip(positions, image_tokens):
        if not toks:
            raise ValueError("an image must expand to at least one token")
        out.extend(token_ids[last:pos])
        spans.append((len(out), len(out) + len(toks)))
        out.extend(toks)
        shift += len(toks) - 1
        shift_at.append((pos, shift))
        last = pos + 1
    out.extend(token_ids[last:])
    moved = []
    for t in token_endpoints:
        s = 0
        for pos, cum in shift_at:
            if pos < t:
                s = cum
        nt = t + s
        if any(a < nt < b for a, b in spans):
            raise AssertionError(f"endpoint {t} would split an image span")
        moved.append(nt)
    return ExpandedPrompt(out, moved, spans)
