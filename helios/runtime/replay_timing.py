"""GPU time of each step replay, read back without blocking the step loop.

On CUDA, :meth:`ReplayTimer.record` brackets one replay with two CUDA events on the current stream;
:meth:`ReplayTimer.poll` (called by the driver before each step, and by whoever wants the numbers)
hands the completed pairs, oldest first and in replay order, to ``on_gpu_ns(kind, capacity, ns)``:
a pair whose end event has not completed (``event.query()`` is False) stays queued, so nothing waits
for the GPU.  Events are reused from a free list.  On CPU there is no GPU time: ``record`` only runs
the replay and nothing is reported (the counter is not estimated from host time).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import torch


class ReplayTimer:
    def __init__(self, cuda: bool, on_gpu_ns: Callable[[str, int, int], None] | None = None):
        self.cuda, self.on_gpu_ns = cuda, on_gpu_ns
        self._pending: deque = deque()  # (start, end, kind, capacity), in replay order
        self._free: list = []

    def _event(self):
        return self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)

    def record(self, run: Callable[[], None], kind: str, capacity: int) -> None:
        """``run()`` (one replay); on CUDA bracketed by events whose elapsed time is reported later."""
        if not (self.cuda and self.on_gpu_ns):
            run()
            return
        start, end = self._event(), self._event()
        start.record()
        run()
        end.record()
        self._pending.append((start, end, kind, capacity))

    def poll(self) -> None:
        """Report every completed replay at the front of the queue; never blocks."""
        while self._pending and self._pending[0][1].query():
            start, end, kind, capacity = self._pending.popleft()
            self.on_gpu_ns(kind, capacity, int(start.elapsed_time(end) * 1e6))
            self._free += [start, end]

    def drain(self) -> None:
        """Wait for the device, then report everything (measurement tools, not the serving loop)."""
        if self._pending:
            torch.cuda.synchronize()
            self.poll()
