"""Prometheus metrics of one server (its own registry: several servers may share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the app)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("flare_requests", "HTTP generation requests by protocol and status",
                                ["protocol", "status"], registry=r)
        self.prompt_tokens = Counter("flare_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.completion_tokens = Counter("flare_completion_tokens", "generated tokens of finished requests",
                                         registry=r)
        self.cached_tokens = Counter("flare_cached_prompt_tokens",
                                     "prompt tokens consumed from the prefix cache",
                                     registry=r)
        self.graph_replays = Counter("flare_graph_replays", "prepared step executions by kind and capacity",
                                     ["kind", "capacity"], registry=r)
        self.graph_gpu_ns = Counter(
            "flare_graph_gpu_nanoseconds",
            "GPU time of prepared step replays by kind and capacity, in nanoseconds: CUDA events recorded around "
            "each graph replay, read back without blocking the step loop. On CPU there is no GPU timing: it "
            "stays 0 (not estimated from host time)", ["kind", "capacity"], registry=r)
        self.speculative_rounds = Counter(
            "flare_speculative_rounds", "speculative verification round replays by graph batch and width",
            ["batch", "width"], registry=r)
        self.speculative_gpu_ns = Counter(
            "flare_speculative_gpu_nanoseconds", "GPU time of speculative verification rounds by graph batch and "
            "width, in nanoseconds (CUDA events; 0 on CPU, not estimated)", ["batch", "width"], registry=r)
        self.draft_tokens = Counter("flare_speculative_draft_tokens", "proposed (drafted) tokens", registry=r)
        self.accepted_tokens = Counter("flare_speculative_accepted_tokens", "accepted proposals", registry=r)
        self.self_probe_misses = Counter(
            "flare_speculative_self_probe_misses", "self-drafting rounds where a greedy row did not accept all of "
            "its own greedy proposals (a verification bug, or a numerical near-tie between the round and decode "
            "graphs)", registry=r)
        self.accepted_by_position = Counter("flare_speculative_accepted_tokens_by_position",
                                            "accepted proposals by their position in the round (0 = first)",
                                            ["position"], registry=r)
        self.queue_depth = Gauge("flare_queue_depth", "requests waiting for admission", registry=r)
        self.running = Gauge("flare_running_requests", "admitted requests (prefilling or decoding)", registry=r)
        self.kv_pages_used = Gauge("flare_kv_pages_used", "KV pages held by requests", registry=r)
        self.kv_pages_cached = Gauge("flare_kv_pages_cached", "KV pages held by the prefix cache", registry=r)
        self.kv_pages_free = Gauge("flare_kv_pages_free", "KV pages free", registry=r)
        self.ttft = Histogram("flare_time_to_first_token_seconds", "arrival to first token", registry=r)
        self.itl = Histogram("flare_inter_token_latency_seconds", "time between a request's tokens",
                             buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1.0, 2.5), registry=r)

    def steps(self, shapes) -> None:
        """Every ``(kind, capacity)`` the engine can replay appears at 0 from the start."""
        for kind, capacity in shapes:
            self.graph_replays.labels(kind, str(capacity))
            self.graph_gpu_ns.labels(kind, str(capacity))
            if kind == "round":
                self.speculative_rounds.labels(*str(capacity).split("x"))
                self.speculative_gpu_ns.labels(*str(capacity).split("x"))

    def replay(self, kind: str, capacity) -> None:
        self.graph_replays.labels(kind, str(capacity)).inc()
        if kind == "round":
            self.speculative_rounds.labels(*str(capacity).split("x")).inc()

    def replay_gpu_ns(self, kind: str, capacity, ns: int) -> None:
        self.graph_gpu_ns.labels(kind, str(capacity)).inc(ns)
        if kind == "round":
            self.speculative_gpu_ns.labels(*str(capacity).split("x")).inc(ns)

    def speculative(self, proposals: list[list[int]], emitted: list[list[int]]) -> None:
        """One round's drafted and accepted tokens (accepted = emitted minus the target's own last token)."""
        for props, out in zip(proposals, emitted):
            self.draft_tokens.inc(len(props))
            accepted = max(len(out) - 1, 0)
            self.accepted_tokens.inc(accepted)
            for i in range(accepted):
                self.accepted_by_position.labels(str(i)).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
