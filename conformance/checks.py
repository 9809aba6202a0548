"""Invariant checks shared by the conformance tests and their planted-defect twins.

Each returns a list of problems (empty when the invariant holds), so a plant can show the
check fails.  Expected values come from an independent reference, passed in by the caller.
"""

from __future__ import annotations


def check_endpoint_invariants(prompt: str, ids: list[int], message_endpoints: list[int],
                              token_endpoints: list[int], endpoint_bytes: list[int], decode,
                              canonical=lambda text: text) -> list[str]:
    """``decode(ids) -> str`` and ``canonical(text) -> str`` (decode of encode, i.e. the text as
    the tokenizer normalizes it) come from the reference tokenizer: an exact cut at byte ``c`` and
    token ``t`` decodes to the canonical prompt text on both sides of the cut."""
    problems = []
    data = prompt.encode("utf-8")
    n = len(ids)
    if message_endpoints != sorted(set(message_endpoints)):
        problems.append(f"message endpoints not sorted/unique: {message_endpoints}")
    if any(not 0 < e <= len(data) for e in message_endpoints):
        problems.append(f"message endpoint outside the prompt: {message_endpoints} (prompt {len(data)} bytes)")
    if token_endpoints != sorted(set(token_endpoints)):
        problems.append(f"token endpoints not sorted/unique: {token_endpoints}")
    if any(not 0 < t < n for t in token_endpoints):
        problems.append(f"token endpoint not strictly inside the prompt: {token_endpoints} ({n} tokens)")
    if len(endpoint_bytes) != len(token_endpoints) or not set(endpoint_bytes) <= set(message_endpoints):
        problems.append(f"token endpoints {token_endpoints} are not paired with message endpoints ({endpoint_bytes})")

    def exact(t: int, cut: int) -> bool:
        try:
            left, right = data[:cut].decode("utf-8"), data[cut:].decode("utf-8")
        except UnicodeDecodeError:
            return False
        return decode(ids[:t]) == canonical(left) and decode(ids[t:]) == canonical(right)

    for t, cut in zip(token_endpoints, endpoint_bytes):
        if not exact(t, cut):
            problems.append(f"token endpoint {t} does not split the prompt exactly at byte {cut} (rounded?)")
    prefix_lengths = None
    for cut in message_endpoints:
        if cut in endpoint_bytes:
            continue
        if prefix_lengths is None:
            prefix_lengths = [len(decode(ids[:t])) for t in range(n + 1)]
        try:
            target = len(canonical(data[:cut].decode("utf-8")))
        except UnicodeDecodeError:
            problems.append(f"message endpoint {cut} is not on a character boundary")
            continue
        for t in (t for t, length in enumerate(prefix_lengths) if length == target):
            if 0 < t < n and exact(t, cut):
                problems.append(f"message endpoint {cut} is an exact token cut at {t} but was omitted")
                break
    return problems


def check_reuse(prev_prompt: str, prev_endpoints: list[int], next_prompt: str) -> tuple[int, int]:
    """How many byte endpoints of turn N remain a byte prefix of turn N+1: (kept, total)."""
    a, b = prev_prompt.encode("utf-8"), next_prompt.encode("utf-8")
    kept = sum(1 for c in prev_endpoints if b[:c] == a[:c])
    return kept, len(prev_endpoints)
