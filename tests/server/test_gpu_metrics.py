"""/metrics: graph replays and GPU nanoseconds by capacity (GPU time stays 0 on CPU: not faked), and the
speculative families registered for when speculation exists -- parsed as Prometheus text."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helios.runtime.engine import DEFAULT_CORE_DECODE, DEFAULT_CORE_PREFILL


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory("--max-context", "512", "--kv-tokens", "4096", in_process=True)


def _families(server) -> dict:
    return {f.name: f for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)}


def _samples(family, name: str) -> dict[tuple[str, str], float]:
    return {(s.labels["kind"], s.labels["capacity"]): s.value for s in family.samples if s.name == name}


def test_graph_replays_and_gpu_nanoseconds_by_capacity(server, oai):
    oai.chat.completions.create(model="flare/embedded-default", messages=[{"role": "user", "content": "Hi"}],
                                max_tokens=4)
    fams = _families(server)
    keys = {(k, str(c)) for k in ("decode", "decode_greedy") for c in DEFAULT_CORE_DECODE} | \
        {("prefill", str(c)) for c in DEFAULT_CORE_PREFILL}
    replays = _samples(fams["flare_graph_replays"], "flare_graph_replays_total")
    gpu = _samples(fams["flare_graph_gpu_nanoseconds"], "flare_graph_gpu_nanoseconds_total")
    assert set(replays) == set(gpu) == keys  # every step of the catalog, registered from the start
    assert replays[("prefill", "256")] >= 1 and replays[("decode", "1")] >= 3
    assert fams["flare_graph_gpu_nanoseconds"].type == "counter"
    # CPU: no GPU timing, so the counter stays 0 and its help says so
    assert all(v == 0 for v in gpu.values())
    assert "On CPU there is no GPU timing" in fams["flare_graph_gpu_nanoseconds"].documentation


def test_speculative_counters_are_registered(server):
    fams = _families(server)
    for name in ("flare_speculative_rounds", "flare_speculative_gpu_nanoseconds"):
        assert fams[name].type == "counter"
        assert all(s.value == 0 for s in fams[name].samples)
    text = httpx.get(f"{server.url}/metrics").text
    assert "# TYPE flare_speculative_rounds_total counter" in text
    assert "# TYPE flare_speculative_gpu_nanoseconds_total counter" in text


class _FakeEvent:
    """Stands in for ``torch.cuda.Event``: 'completes' when the test says so; times are given."""

    def __init__(self, clock):
        self.clock, self.t, self.done = clock, None, False

    def record(self):
        self.t = self.clock.pop(0)

    def query(self):
        return self.done

    def elapsed_time(self, end):
        return end.t - self.t  # milliseconds, like CUDA events


def test_replay_timer_reports_completed_replays_in_order_and_never_waits():
    from helios.runtime.replay_timing import ReplayTimer

    got, made = [], []
    clock = [0.0, 1.5, 2.0, 2.25]  # ms: replay A 1.5 ms, replay B 0.25 ms
    timer = ReplayTimer(cuda=True, on_gpu_ns=lambda kind, cap, ns: got.append((kind, cap, ns)))
    timer._event = lambda: made.append(_FakeEvent(clock)) or made[-1]
    ran = []
    timer.record(lambda: ran.append("A"), "decode", 8)
    timer.record(lambda: ran.append("B"), "prefill", 256)
    assert ran == ["A", "B"]
    timer.poll()
    assert got == []  # nothing completed: nothing reported, no wait
    made[3].done = True  # B finished first: still reported only after A (replay order)
    timer.poll()
    assert got == []
    made[1].done = True
    timer.poll()
    assert got == [("decode", 8, 1_500_000), ("prefill", 256, 250_000)]
