"""Reusable-prefix rate: which endpoints of turn N remain a prefix of turn N+1, per template.

Turn N is the conversation up to and including the assistant reply as the model generated it;
turn N+1 re-renders that history with the next user message.  Templates that rewrite history
(reasoning dropped once a later user message exists, for example) lose the endpoints after it.
"""

from __future__ import annotations

import copy

import pytest

from helios.frontend.conversation import FrontendError
from helios.protocol import decode_request
from .checks import check_reuse
from .conftest import CORPUS

MULTITURN = [s for s in CORPUS if "multiturn" in s["features"] and s["protocol"] == "openai"]


def _turns(request):
    """(turn N, turn N+1) request pairs: turn N ends with an assistant reply as it was generated
    (rendered as history, no generation prompt); turn N+1 adds the next user message."""
    msgs = request["messages"]
    out = []
    for a, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        nxt = next((u for u in range(a + 1, len(msgs)) if msgs[u]["role"] == "user"), None)
        if nxt is None:
            continue
        prev = copy.deepcopy(request)
        prev["messages"] = msgs[: a + 1]
        prev["add_generation_prompt"] = False
        follow = copy.deepcopy(request)
        follow["messages"] = msgs[: nxt + 1]
        out.append((prev, follow))
    return out


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
            kept, total = check_reuse(prev.prompt, prev.message_endpoints, nxt.prompt)
            # Where the bytes before an exact token endpoint are kept, so are its tokens.
            for t, cut in zip(prev.token_endpoints, prev.token_endpoint_bytes):
                if nxt.prompt.encode()[:cut] == prev.prompt.encode()[:cut]:
                    assert nxt.token_ids[:t] == prev.token_ids[:t], (t, cut)
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
    assert kept_all > 0, "no message endpoint of a multi-turn conversation was reusable by the next turn"
