"""One timing mechanism for every benchmark: samples of a callable's duration, GPU or CPU.

``time_samples(fn, samples=..., warmup=..., setup=None, device=...)`` returns one duration (seconds) per
sample.  On CUDA each sample is the elapsed time between two CUDA events recorded on the current stream
around ``fn()`` -- GPU time of the work ``fn`` enqueues (a graph replay: the complete graph), with the
host's launch overhead excluded when the stream is busy; events are read back after all samples, so no
host synchronisation sits between samples beyond what ``setup`` does.  On CPU each sample is
``perf_counter`` around ``fn()``.  ``setup()`` runs before each sample *outside* the timed region (state
restoration: KV lengths, sampling state).

``captured(fn)`` warms ``fn`` up on a side stream and captures it into a CUDA graph (the minimal reference
graphs: the bandwidth floor, the matmul throughput).

``interleaved(fns, samples=..., warmup=...)`` times several callables side by side: each round runs every one once
(in the dict's order), so drifts of the machine fall on all of them alike.

``summarize(samples)`` gives the median/min/max/mean in milliseconds and the sample count, the same
numbers every report prints.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def time_samples(fn: Callable[[], object], *, samples: int = 50, warmup: int = 5,
                 setup: Callable[[], object] | None = None, device: str = "cuda") -> list[float]:
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    cuda = str(device).startswith("cuda")
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    if not cuda:
        out = []
        for _ in range(samples):
            if setup is not None:
                setup()
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out
    import torch

    torch.cuda.synchronize()
    events = []
    for _ in range(samples):
        if setup is not None:
            setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in events]


def interleaved(fns: dict, *, samples: int = 50, warmup: int = 5, device: str = "cuda") -> dict[object, list[float]]:
    """``{name: durations (seconds)}``: ``samples`` rounds after ``warmup`` untimed ones, each round timing every
    callable of ``fns`` once, in order (each sample as :func:`time_samples` takes it)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out = {name: [] for name in fns}
    for _ in range(samples):
        for name, fn in fns.items():
            out[name] += time_samples(fn, samples=1, warmup=0, device=device)
    return out


def captured(fn: Callable[[], object], warmup: int = 3):
    """``fn`` captured into a ``torch.cuda.CUDAGraph`` after ``warmup`` calls on a side stream (CUDA only)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def summarize(samples_s: list[float]) -> dict:
    ms = [s * 1e3 for s in samples_s]
    return {"n": len(ms), "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
            "mean_ms": statistics.fmean(ms)}
