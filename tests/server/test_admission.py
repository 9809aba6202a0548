"""Admission control and cancellation on a server whose KV pool holds exactly one full-context request."""

from __future__ import annotations

import json
import time

import httpx
import pytest

MODEL = "flare/embedded-default"


@pytest.fixture(scope="module")
def server(server_factory):
    # 2048-token pool = one 2048-token context: a request reserving its whole context fills it.
    return server_factory("--max-context", "2048", "--kv-tokens", "2048", "--queue-timeout", "0.3")


def _body(max_tokens, stream=False, seed=11):
    return {"model": MODEL, "messages": [{"role": "user", "content": "fill the pool"}], "max_tokens": max_tokens,
            "seed": seed, "stream": stream}


def _wait_for_pages_released(server, timeout=10.0):
    """Every used page is back in the pool or held by the prefix cache (prompt pages it may keep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = server.metrics()
        if m["flare_kv_pages_used"] == m["flare_kv_pages_cached"] and m["flare_running_requests"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"pages never released: {server.metrics()}")


def test_full_pool_gives_503_with_retry_after_and_a_disconnect_frees_the_pages(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        with client.stream("POST", "/v1/chat/completions", json=_body(4000, stream=True)) as long:
            assert long.status_code == 200
            lines = long.iter_lines()
            first = [next(lines) for _ in range(4)]  # the long request is decoding
            assert any(l.startswith("data: {") for l in first)
            assert server.metrics()["flare_kv_pages_free"] == 0
            t0 = time.monotonic()
            waiting = client.post("/v1/chat/completions", json=_body(4))
            assert waiting.status_code == 503, waiting.text
            assert waiting.headers["retry-after"] == "1" and time.monotonic() - t0 >= 0.3
            assert waiting.json()["error"]["type"] == "service_unavailable"
            anthropic = client.post("/v1/messages", content=json.dumps(
                {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}))
            assert anthropic.status_code == 503 and anthropic.json()["error"]["type"] == "overloaded_error"
        # the client went away mid-stream: its request is cancelled and its pages freed
        _wait_for_pages_released(server)
        ok = client.post("/v1/chat/completions", json=_body(4))
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
    m = server.metrics()
    assert m['flare_requests_total{protocol="openai",status="503"}'] == 1
    assert m["flare_queue_depth"] == 0


def test_request_larger_than_the_pool_is_refused_at_once(server):
    r = httpx.post(f"{server.url}/v1/chat/completions",
                   json={**_body(4), "messages": [{"role": "user", "content": "lamp " * 2100}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_a_non_streaming_client_that_disconnects_frees_its_pages(server):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/chat/completions", json=_body(4000), timeout=0.5)
    _wait_for_pages_released(server)
    assert server.metrics()["flare_kv_pages_free"] > 0
