"""Bounded load test of `flare run`: 64 concurrent streams for one minute, seeded, with no lost, truncated
or mixed responses -- each checked against the same request served alone.

A live ``flare run`` (a subprocess: the server does not share the client's interpreter) serves the ranged
embedded default core on loopback. 64 workers each stream one chat request at a time through the official
async clients (a mix of ``openai.AsyncOpenAI`` and ``anthropic.AsyncAnthropic``), replacing each finished
stream at once with the next request until the 60 s deadline; then every recorded (request, output) pair
is compared with the same request served alone and not streamed.

Requests are drawn in turn from a fixed set of ``SPECS`` distinct requests (distinct prompts, lengths and
``max_tokens``), so every request served under load has a solo twin and repeats of one spec also exercise
the prefix cache (a cache hit must continue exactly as the miss did). OpenAI requests sample at
temperature 0.6 with a per-spec ``seed`` (reproducible, and sensitive to the context, so a mixed-up KV page
shows in the text). The Anthropic Messages API has no ``seed``, so Anthropic requests are greedy
(temperature 0): deterministic, though the tiny random model's greedy text hardly depends on the prompt.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time

import anthropic
import openai
import pytest

MODEL = "flare/embedded-default"
STREAMS = 64  # concurrent streams (outstanding requests never exceed this)
LOAD_S = 60.0  # wall time during which finished streams are replaced
TOTAL_S = 150.0  # bound on the whole test body (load, drain, solo re-serve)
REQUEST_TIMEOUT_S = 45.0  # per request, on the client
SPECS = 40  # distinct requests; every one is served alone afterwards (>= 16)
# the queue timeout exceeds the client timeout: under this bounded load nothing should wait that long
ARGS = ("--max-context", "512", "--kv-tokens", "16384", "--queue-timeout", "60")
WORDS = ("lamps", "boxes", "harbour", "Priya", "Kemi", "ropes", "tides", "lanterns", "gulls", "nets")
OPENAI_FINISH = {"stop", "length"}
ANTHROPIC_STOP = {"end_turn", "max_tokens", "stop_sequence"}


def spec(k: int) -> dict:
    """Distinct request ``k``: even ``k`` OpenAI (seeded, temperature 0.6), odd ``k`` Anthropic (greedy)."""
    words = " ".join(WORDS[(k + j) % len(WORDS)] for j in range(3 + 7 * (k % 5)))
    prompt = f"Load request {k}: tell me about the {words}."
    max_tokens = 8 + (k * 7) % 17  # 8..24
    if k % 2 == 0:
        return dict(protocol="openai", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                    seed=1000 + k, temperature=0.6)
    return dict(protocol="anthropic", system=f"You answer request {k}.",
                messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                # this anthropic SDK's create() takes no `temperature`; the server's Messages API does
                extra_body={"temperature": 0.0})


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def stream_openai(client: openai.AsyncOpenAI, s: dict) -> dict:
    t0 = time.monotonic()
    ttft, text, finish, usage = None, [], [], None
    stream = await client.chat.completions.create(
        model=MODEL, messages=s["messages"], max_tokens=s["max_tokens"], seed=s["seed"],
        temperature=s["temperature"], stream=True, stream_options={"include_usage": True})
    async for c in stream:
        if c.choices:
            piece = c.choices[0].delta.content or ""
            if piece and ttft is None:
                ttft = time.monotonic() - t0
            text.append(piece)
            if c.choices[0].finish_reason:
                finish.append(c.choices[0].finish_reason)
        if c.usage:
            usage = c.usage
    return dict(text="".join(text), finish=finish, tokens=usage and usage.completion_tokens,
                prompt_tokens=usage and usage.prompt_tokens, ttft=ttft, wall=time.monotonic() - t0)


async def stream_anthropic(client: anthropic.AsyncAnthropic, s: dict) -> dict:
    t0 = time.monotonic()
    ttft, text, finish, tokens, prompt_tokens, stopped = None, [], [], None, None, False
    stream = await client.messages.create(model=MODEL, system=s["system"], messages=s["messages"],
                                          max_tokens=s["max_tokens"], extra_body=s["extra_body"], stream=True)
    async for ev in stream:
        if ev.type == "message_start":
            prompt_tokens = ev.message.usage.input_tokens
        elif ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            if ev.delta.text and ttft is None:
                ttft = time.monotonic() - t0
            text.append(ev.delta.text)
        elif ev.type == "message_delta":
            finish.append(ev.delta.stop_reason)
            tokens = ev.usage.output_tokens
        elif ev.type == "message_stop":
            stopped = True
    if not stopped:
        finish.append("no message_stop")
    return dict(text="".join(text), finish=finish, tokens=tokens, prompt_tokens=prompt_tokens, ttft=ttft,
                wall=time.monotonic() - t0)


async def alone(oai: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic, s: dict) -> dict:
    """The same request, served alone and not streamed."""
    if s["protocol"] == "openai":
        r = await oai.chat.completions.create(model=MODEL, messages=s["messages"], max_tokens=s["max_tokens"],
                                              seed=s["seed"], temperature=s["temperature"])
        return dict(text=r.choices[0].message.content or "", finish=[r.choices[0].finish_reason],
                    tokens=r.usage.completion_tokens, prompt_tokens=r.usage.prompt_tokens)
    m = await claude.messages.create(model=MODEL, system=s["system"], messages=s["messages"],
                                     max_tokens=s["max_tokens"], extra_body=s["extra_body"])
    return dict(text="".join(b.text for b in m.content if b.type == "text"), finish=[m.stop_reason],
                tokens=m.usage.output_tokens, prompt_tokens=m.usage.input_tokens)


@pytest.fixture(scope="module")
def server(server_factory, ranged_core):
    return server_factory(*ARGS, core=ranged_core)


def _non_200(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("flare_requests_total") and 'status="200"' not in k}


def test_64_concurrent_streams_for_a_minute_lose_truncate_and_mix_nothing(server, flare_samples):
    specs = [spec(k) for k in range(SPECS)]
    before = server.metrics()

    async def main():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0,
                                      timeout=REQUEST_TIMEOUT_S) as oai, \
                anthropic.AsyncAnthropic(base_url=server.url, api_key="none", max_retries=0,
                                         timeout=REQUEST_TIMEOUT_S) as claude:
            # (the clients' default connection pools, 1000 connections, exceed STREAMS)
            records: list[tuple[int, int, dict]] = []  # (request number, spec, outcome)
            counter = itertools.count()
            outstanding = 0
            peak = 0
            t0 = time.monotonic()
            deadline = t0 + LOAD_S

            async def worker():
                nonlocal outstanding, peak
                while time.monotonic() < deadline:
                    n = next(counter)
                    k = (n * 7) % SPECS  # a fixed, deterministic walk through the specs (7 is coprime to SPECS = 40)
                    s = specs[k]
                    outstanding += 1
                    peak = max(peak, outstanding)
                    try:
                        fn = stream_openai(oai, s) if s["protocol"] == "openai" else stream_anthropic(claude, s)
                        out = await asyncio.wait_for(fn, REQUEST_TIMEOUT_S)
                    except Exception as e:  # noqa: BLE001 -- a lost request, reported below
                        out = dict(error=f"{type(e).__name__}: {e}")
                    finally:
                        outstanding -= 1
                    records.append((n, k, out))

            await asyncio.gather(*(worker() for _ in range(STREAMS)))
            duration = time.monotonic() - t0
            solo, t1 = {}, time.monotonic()
            for k, s in enumerate(specs):  # one at a time, after the load
                solo[k] = await asyncio.wait_for(alone(oai, claude, s), REQUEST_TIMEOUT_S)
            return records, solo, duration, peak, time.monotonic() - t1

    records, solo, duration, peak, solo_s = asyncio.run(asyncio.wait_for(main(), TOTAL_S))
    after = server.metrics()

    # no lost requests: every started request finished, with a normal finish reason
    lost = [(n, out) for n, _, out in records if "error" in out]
    assert not lost, f"{len(lost)} of {len(records)} requests lost, e.g. {lost[:3]}"
    assert peak <= STREAMS and len(records) >= 2 * STREAMS  # every stream was replaced at least once
    for n, k, out in records:
        normal = OPENAI_FINISH if specs[k]["protocol"] == "openai" else ANTHROPIC_STOP
        assert len(out["finish"]) == 1 and out["finish"][0] in normal, (n, k, out)
    assert _non_200(after) == _non_200(before), "the server answered some request with an error"
    assert after["flare_running_requests"] == 0 and after["flare_queue_depth"] == 0

    # every served spec (at least 16 distinct requests) was re-served alone
    served = {k for _, k, _ in records}
    assert len(served) >= 16 and served <= solo.keys()
    for k, twin in solo.items():
        assert twin["text"] and 0 < twin["tokens"] <= specs[k]["max_tokens"], (k, twin)
    # no truncated responses: each stream's text, token counts and finish equal its solo, unstreamed twin
    for n, k, out in records:
        twin = solo[k]
        assert out["text"] == twin["text"], f"request {n} (spec {k}) differs from the request served alone"
        assert (out["tokens"], out["prompt_tokens"], out["finish"]) == \
               (twin["tokens"], twin["prompt_tokens"], twin["finish"]), (n, k, out, twin)
    # no mixed responses: distinct seeded prompts yield their own, distinct outputs
    seeded = [solo[k]["text"] for k in sorted(served) if specs[k]["protocol"] == "openai"]
    assert len(seeded) >= 8 and len(set(seeded)) == len(seeded)

    ttft = [out["ttft"] for _, _, out in records if out["ttft"] is not None]
    tokens = sum(out["tokens"] for _, _, out in records)
    assert len(ttft) == len(records)
    per_protocol = {p: sum(1 for _, k, _ in records if specs[k]["protocol"] == p) for p in ("openai", "anthropic")}
    assert min(per_protocol.values()) > 0
    flare_samples(case={"streams": STREAMS, "load_s": LOAD_S, "specs": SPECS, "max_tokens": "8..24",
                        "device": "cpu", "core": "embedded-default (ranged)"}, seed=0,
                  requests_completed=len(records), openai_requests=per_protocol["openai"],
                  anthropic_requests=per_protocol["anthropic"], tokens_streamed=tokens,
                  ttft_p50_s=statistics.median(ttft), ttft_p99_s=percentile(ttft, 0.99),
                  duration_s=duration, tokens_per_s=tokens / duration, distinct_requests=len(served),
                  solo_reserve_s=solo_s)
    print(f"\nload: {len(records)} requests ({per_protocol}), {tokens} tokens in {duration:.1f} s "
          f"({tokens / duration:.1f} tok/s), TTFT p50 {statistics.median(ttft):.3f} s "
          f"p99 {percentile(ttft, 0.99):.3f} s, peak outstanding {peak}, {len(served)} distinct requests "
          f"re-served alone in {solo_s:.1f} s")
