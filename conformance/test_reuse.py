"""Reusable-prefix rate: which endpoints of turn N remain a prefix of turn N+1, per template."""

from __future__ import annotations

import copy

import pytest

from helios.frontend.conversation import FrontendError
from helios.protocol import decode_request
from .checks import check_reuse
from .conftest import CORPUS

MULTITURN = [s for s in CORPUS if "multiturn" in s["features"] and s["protocol"] == "openai"]


def _turns(request):
    """Requests ending at each user message after the first: turn N and turn N+1 pairs."""
    msgs = request["messages"]
    user_idx = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    out = []
    for i in user_idx:
        r = copy.deepcopy(request)
        r["messages"] = msgs[: i + 1]
        out.append(r)
    return list(zip(out, out[1:]))


def test_reusable_prefix_rate(frontend_case, frontend, flare_samples):
    kept_all = total_all = 0
    per_conversation = {}
    for sample in MULTITURN:
        for prev_req, next_req in _turns(sample["request"]):
            try:
                prev = frontend.prepare(decode_request("openai", prev_req))
                nxt = frontend.prepare(decode_request("openai", next_req))
            except FrontendError:
                continue  # a feature this recipe rejects (covered by test_frontend)
            kept, total = check_reuse(prev.token_ids, prev.token_endpoints, nxt.token_ids)
            # Token-prefix reuse implies byte-prefix reuse at the same endpoint.
            for t, cut in zip(prev.token_endpoints, prev.token_endpoint_bytes):
                if nxt.token_ids[:t] == prev.token_ids[:t]:
                    assert nxt.prompt.encode()[:cut] == prev.prompt.encode()[:cut]
            k, n = per_conversation.get(sample["name"], (0, 0))
            per_conversation[sample["name"]] = (k + kept, n + total)
            kept_all += kept
            total_all += total
    if total_all == 0:
        pytest.skip("no multi-turn corpus conversation renders with this recipe")
    rate = kept_all / total_all
    flare_samples(case={"recipe": frontend_case.recipe, "checkpoint": frontend_case.checkpoint,
                        "variant": frontend_case.variant, "metric": "reusable_prefix_rate"},
                  rate=rate, kept=kept_all, total=total_all,
                  per_conversation={k: {"kept": a, "total": b} for k, (a, b) in per_conversation.items()})
    assert 0 < kept_all <= total_all
