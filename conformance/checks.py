"""Invariant checks shared by the conformance tests and their planted-defect twins.

Each returns a list of problems (empty when the invariant holds), so a plant can show the
check fails.  Expected values come from an independent reference, passed in by the caller.
"""

from __future__ import annotations


def check_endpoint_invariants(prompt: str, ids: list[int], message_endpoints: list[int],
                              token_endpoints: list[int], decode) -> list[str]:
    """``decode(ids) -> str`` is the reference tokenizer's decoder."""
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
    # Prefix byte length of every token prefix, from the reference decoder.
    prefix_len = {}
    for t in range(1, n):
        try:
            prefix_len[t] = len(decode(ids[:t]).encode("utf-8"))
        except Exception:
            prefix_len[t] = None
    exact = {}
    for t, length in prefix_len.items():
        if length is not None and data[:length].decode("utf-8", "replace") == decode(ids[:t]):
            exact.setdefault(length, t)
    for t in token_endpoints:
        length = prefix_len.get(t)
        if length not in message_endpoints:
            problems.append(f"token endpoint {t} decodes to {length} bytes, which is no message endpoint (rounded?)")
    for cut in message_endpoints:
        t = exact.get(cut)
        if t is not None and 0 < t < n and t not in token_endpoints:
            problems.append(f"message endpoint {cut} is an exact token cut at {t} but was omitted")
    return problems


def check_reuse(prev_ids: list[int], prev_endpoints: list[int], next_ids: list[int]) -> tuple[int, int]:
    """How many endpoints of turn N remain a token prefix of turn N+1: (kept, total)."""
    kept = sum(1 for t in prev_endpoints if next_ids[:t] == prev_ids[:t])
    return kept, len(prev_endpoints)
