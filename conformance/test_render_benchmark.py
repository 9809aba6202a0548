"""Render + tokenize + endpoints on a ~32k-token conversation vs transformers' apply_chat_template +
tokenizer encode on the same conversation, timed side by side in one run (raw samples archived).

Run: ``pytest conformance/test_render_benchmark.py -m benchmark -p no:xdist``.
"""

from __future__ import annotations

import random
import statistics
import time

import pytest

from helios.frontend.conversation import Conversation, Message, TextBlock
from .reference import AssetMissing, reference_tokenizer

TARGET_RATIO = 1.10
ROUNDS = 21
WORDS = ("cache prefix token render template boundary kernel graph replay tensor batch memory "
         "bandwidth latency decode prefill attention scheduler request stream endpoint byte utf8 "
         "naïve café 東京 🚀 the of and to in is for on with as by at from").split()


def long_conversation(seed: int = 0, turns: int = 96, words_per_message: int = 260):
    rng = random.Random(seed)
    msgs = [Message("system", [TextBlock("You are a meticulous assistant. " * 4)])]
    for i in range(turns):
        text = " ".join(rng.choice(WORDS) for _ in range(words_per_message))
        msgs.append(Message("user" if i % 2 == 0 else "assistant", [TextBlock(text)]))
    msgs.append(Message("user", [TextBlock("Summarize the discussion.")]))
    return msgs


@pytest.mark.benchmark
@pytest.mark.parametrize("recipe,checkpoint", [("qwen3", "Qwen/Qwen3-8B")])
def test_render_tokenize_endpoints_within_ratio(recipe, checkpoint, hub_cache, flare_samples, benchmark):
    from ignition.frontend_assets import load_frontend

    if hub_cache is None:
        pytest.skip("no hub cache")
    try:
        tok = reference_tokenizer(recipe, checkpoint, hub_cache)
    except AssetMissing as exc:
        pytest.skip(str(exc))
    frontend = load_frontend(recipe, checkpoint, None, hub_cache)
    conv = Conversation(long_conversation())
    messages = [{"role": m.role, "content": m.text()} for m in conv.messages]

    def ours():
        return frontend.prepare(conv)

    def reference():
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)
        return tok(text, add_special_tokens=False)["input_ids"]

    prepared = ours()
    assert prepared.token_ids == reference(), "parity is a precondition of the timing"
    n_tokens = len(prepared.token_ids)
    assert 24_000 <= n_tokens <= 40_000, n_tokens
    for _ in range(3):  # warm-up (template compile caches, allocator)
        ours(), reference()
    t_ours, t_ref = [], []
    for i in range(ROUNDS):  # interleaved, alternating order
        pair = (("ours", ours), ("ref", reference)) if i % 2 == 0 else (("ref", reference), ("ours", ours))
        for name, fn in pair:
            t0 = time.perf_counter()
            fn()
            (t_ours if name == "ours" else t_ref).append(time.perf_counter() - t0)
    ratio = statistics.median(t_ours) / statistics.median(t_ref)
    for seed, (a, b) in enumerate(zip(t_ours, t_ref)):
        flare_samples(case={"benchmark": "render_tokenize_endpoints", "recipe": recipe, "checkpoint": checkpoint,
                            "tokens": n_tokens, "messages": len(conv.messages)},
                      seed=seed, ours_s=a, reference_s=b)
    flare_samples(case={"benchmark": "render_tokenize_endpoints", "recipe": recipe, "checkpoint": checkpoint,
                        "tokens": n_tokens, "summary": True},
                  ratio_of_medians=ratio, ours_median_s=statistics.median(t_ours),
                  reference_median_s=statistics.median(t_ref), ours_min_s=min(t_ours), ours_max_s=max(t_ours),
                  reference_min_s=min(t_ref), reference_max_s=max(t_ref), target=TARGET_RATIO)
    benchmark.extra_info.update(ratio_of_medians=ratio, tokens=n_tokens)
    benchmark.pedantic(ours, rounds=5, iterations=1)
    print(f"\nrender+tokenize+endpoints: ours {statistics.median(t_ours) * 1e3:.2f} ms, reference "
          f"{statistics.median(t_ref) * 1e3:.2f} ms, ratio {ratio:.3f} (target <= {TARGET_RATIO}), {n_tokens} tokens")
    assert ratio <= TARGET_RATIO
