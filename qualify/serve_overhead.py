"""Host overhead per decode step of the serving loop: ``python -m qualify.serve_overhead [CORE] --requests N[,N...]
--max-tokens N [--attention NAME] [--json OUT] [--out RESULTS | --no-archive]`` (archived under ``results/``).

Drives ``flare run``'s engine scheduler directly (no HTTP): ``N`` concurrent greedy requests with distinct
prompts, each generating exactly ``--max-tokens`` tokens (end-of-sequence tokens are ignored for this
measurement so that every request runs its full length).  For every loop iteration that ran a decode
step and no prefill chunk, it records the wall time of the iteration (admission, input building, the
step, reading the tokens back, detokenizing, posting the deltas) and, on CUDA, the step's GPU time from
the CUDA events the engine records around each graph replay (``helios.runtime.replay_timing``; the same
numbers as ``flare_graph_gpu_nanoseconds_total``).  Host overhead = wall - GPU.  On CPU there is no GPU
time: only wall is reported and ``gpu_timing`` says "unavailable".

Several ``--requests`` counts (e.g. ``1,8``) run one after the other on one loaded engine.  Prints one JSON
object (also written to ``--json OUT``): per-step records and, per run (``by_batch``, keyed by its request count:
the steps its whole batch ran, not its wind-down), the medians of wall, GPU and host overhead and the overhead as a
fraction of the GPU time.  Refused: a prompt and its tokens longer than the engine's context.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path


def _prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    return [[(r * 7919 + i * 31 + 11) % (vocab - 16) + 8 for i in range(length)] for r in range(n)]


def _median(xs):
    return statistics.median(xs) if xs else None


def measure(core: str | None, requests, max_tokens: int, prompt_tokens: int = 32, device: str | None = None,
            kv_tokens: int | None = None, max_context: int | None = None, embedding_table_storage: str = "device",
            attention: str | None = None) -> dict:
    """``requests``: an int or a sequence of request counts, run in turn on one engine."""
    from helios.runtime.engine import EngineConfig, default_core, load_engine

    counts = [requests] if isinstance(requests, int) else list(requests)
    gpu_ns: list[int] = []  # by replay index (CUDA: every replay is timed)
    engine = load_engine(core or default_core(), EngineConfig(
        kv_tokens=kv_tokens, max_context=max_context, device=device, queue_timeout_s=3600.0, prefix_cache=False,
        embedding_table_storage=embedding_table_storage, attention=attention),
        on_gpu_ns=lambda kind, cap, ns: gpu_ns.append(ns))
    driver = engine.driver
    cuda = driver.timer.cuda
    if prompt_tokens + max_tokens > engine.max_context:  # the server refuses such a request; its pages would run out
        raise ValueError(f"--prompt-tokens {prompt_tokens} + --max-tokens {max_tokens} exceed the engine's context "
                         f"of {engine.max_context} tokens (--max-context / --kv-tokens)")
    engine.eos_token_ids = set()  # every request runs max_tokens (measurement only)
    steps = []
    for i, n in enumerate(counts):
        steps += _run(engine, gpu_ns, n, max_tokens, prompt_tokens, offset=sum(counts[:i]))
    by_batch = {}  # per run, the steps its whole batch ran (its wind-down, fewer rows, is in "steps" only)
    for n in counts:
        sel = [s for s in steps if s["requests"] == n and s["rows"] == n]
        wall = _median([s["wall_ms"] for s in sel])
        gpu = _median([s["gpu_ms"] for s in sel if s["gpu_ms"] is not None])
        host = _median([s["host_ms"] for s in sel if s["host_ms"] is not None])
        by_batch[str(n)] = {"steps": len(sel), "wall_ms_median": wall, "gpu_ms_median": gpu,
                            "host_ms_median": host, "host_over_gpu": None if gpu in (None, 0) else host / gpu}
    return {"core": str(engine.core_path), "device": str(driver.model.device), "requests": counts,
            "max_tokens": max_tokens, "prompt_tokens": prompt_tokens, "attention": attention or "recipe default",
            "gpu_timing": "cuda events around each graph replay" if cuda else "unavailable (no GPU on this device)",
            "decode_steps": len(steps), "by_batch": by_batch, "steps": steps}


def _run(engine, gpu_ns: list[int], requests: int, max_tokens: int, prompt_tokens: int, offset: int) -> list[dict]:
    """``requests`` concurrent greedy requests through a fresh scheduler; the decode-only iterations."""
    from helios.runtime.scheduler import Request, Scheduler

    driver = engine.driver
    cuda = driver.timer.cuda
    scheduler = Scheduler(engine, queue_timeout_s=3600.0, metrics=None, prefix_cache=False)
    iterations: list[tuple[bool, int, float, int, int]] = []
    last = [driver.replays]

    def on_iteration(prefilled: bool, rows: int, wall_s: float) -> None:
        iterations.append((prefilled, rows, wall_s, last[0], driver.replays))
        last[0] = driver.replays

    scheduler.on_iteration = on_iteration
    greedy = {"temperature": 0.0}

    async def run_all() -> None:
        loop = asyncio.get_running_loop()
        prompts = _prompts(offset + requests, prompt_tokens, engine.vocab_size)[offset:]  # distinct per run
        reqs = [Request(p, greedy, max_tokens, [], loop, asyncio.Queue()) for p in prompts]
        for r in reqs:
            scheduler.submit(r)

        async def finish(r):
            while (event := await r.queue.get())[0] not in ("done", "error"):
                pass
            if event[0] == "error":
                raise RuntimeError(f"request failed: {event}")
            if len(r.generated) != max_tokens:  # the measurement's premise: every request its full length
                raise RuntimeError(f"a request generated {len(r.generated)} tokens, not --max-tokens {max_tokens}")

        await asyncio.gather(*(finish(r) for r in reqs))

    scheduler.start()
    try:
        asyncio.run(run_all())
    finally:
        scheduler.stop()
    driver.timer.drain()
    steps = []
    for prefilled, rows, wall, first, end in iterations:
        if prefilled or not rows:
            continue
        gpu = sum(gpu_ns[first:end]) / 1e6 if cuda and end <= len(gpu_ns) else None
        steps.append({"requests": requests, "rows": rows, "wall_ms": wall * 1e3, "gpu_ms": gpu,
                      "host_ms": None if gpu is None else wall * 1e3 - gpu})
    return steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qualify.serve_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("core", nargs="?", default=None, help="an exported core (default: the embedded tiny core)")
    p.add_argument("--requests", default="8", help="concurrent greedy requests; several runs: 1,8")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens each request generates")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--kv-tokens", type=int, default=None)
    p.add_argument("--max-context", type=int, default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--embedding-table-storage", choices=("device", "ram", "disk"), default="device")
    p.add_argument("--attention", default=None, help="attention backend by name (default: the recipe's)")
    p.add_argument("--json", default=None, help="also write the JSON here")
    p.add_argument("--out", default=None, help="results root (default <repo>/results)")
    p.add_argument("--no-archive", action="store_true")
    a = p.parse_args(argv)
    try:
        counts = [int(x) for x in a.requests.split(",") if x.strip()]
    except ValueError:
        p.error(f"--requests must be positive integers separated by commas, got {a.requests!r}")
    for flag, value in [*(("--requests", c) for c in counts or [0]), ("--max-tokens", a.max_tokens),
                        ("--prompt-tokens", a.prompt_tokens)]:
        if value < 1:
            p.error(f"{flag} must be positive, got {value}")
    try:
        out = measure(a.core, counts, a.max_tokens, a.prompt_tokens, a.device, a.kv_tokens, a.max_context,
                      a.embedding_table_storage, a.attention)
    except ValueError as exc:
        print(f"serve_overhead: error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(out, indent=1)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)
    if not a.no_archive:  # one raw record per decode-only step, the summary beside the environment
        from qualify.archive import new_run_dir, write_run

        case = {"tool": "serve_overhead", "core": out["core"], "max_tokens": a.max_tokens,
                "prompt_tokens": a.prompt_tokens, "attention": out["attention"]}
        run_dir = write_run(new_run_dir(a.out, "serve-overhead"), [{"case": case, **step} for step in out["steps"]],
                            [sys.executable, "-m", "qualify.serve_overhead", *(argv if argv is not None else sys.argv[1:])],
                            {"serve_overhead": {k: v for k, v in out.items() if k != "steps"}})
        print(f"serve_overhead: archived run -> {run_dir}", file=sys.stderr)
    for rows, b in out["by_batch"].items():
        gpu = "unavailable" if b["gpu_ms_median"] is None else f"{b['gpu_ms_median']:.3f} ms"
        host = "" if b["host_ms_median"] is None else f", host overhead {b['host_ms_median']:.3f} ms " \
                                                      f"({100 * (b['host_over_gpu'] or 0):.1f}% of GPU)"
        print(f"batch {rows} (its whole batch): {b['steps']} steps, wall {b['wall_ms_median']:.3f} ms, GPU {gpu}{host}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
