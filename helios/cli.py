"""``flare`` command line."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flare", description="Flare: prepare, serve and qualify LLM cores.")
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("qualify", help="run the conformance subset this machine supports and archive it")
    q.add_argument("--recipe", default=None, help="only cases whose id contains this text")
    q.add_argument("--results", default=None, help="results folder (default: <repo>/results)")
    q.add_argument("-n", "--workers", default="auto" if _has_xdist() else "0",
                   help="pytest-xdist workers (0: in process)")
    q.add_argument("--hub-cache", default=None, help="Hugging Face hub cache (default: ../shared/hub)")
    r = sub.add_parser("run", help="serve a core over HTTP (OpenAI and Anthropic chat)")
    r.add_argument("core", nargs="?", default=None,
                   help="an exported core folder (default: the embedded tiny core, exported once and cached)")
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--port", type=int, default=8000)
    r.add_argument("--kv-tokens", type=int, default=None,
                   help="KV pool size in tokens (default: from free GPU memory on CUDA, see --gpu-memory-fraction; "
                        "largest decode capacity x min(context, 4096) on CPU)")
    r.add_argument("--gpu-memory-fraction", type=float, default=0.90,
                   help="fraction of total GPU memory the server may use (weights, graphs, KV pool) when sizing "
                        "the KV pool without --kv-tokens (default 0.90)")
    r.add_argument("--embedding-table-storage", choices=("device", "ram", "disk"), default="device",
                   help="where the token-embedding table lives: device (default), ram (host memory, pinned on CUDA) "
                        "or disk (memory-mapped from the core); ram/disk gather each step's rows on the host")
    r.add_argument("--max-context", type=int, default=None, help="per-request context in tokens")
    r.add_argument("--queue-timeout", type=float, default=30.0,
                   help="seconds a request may wait for KV pages before a 503 with Retry-After")
    r.add_argument("--no-prefix-cache", action="store_true", help="do not reuse KV pages across requests")
    r.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    r.add_argument("--speculative", default=None, metavar="ngram|self|draft:CORE",
                   help="speculative decoding: 'ngram' proposes continuations found in the request's own tokens "
                        "(prompt lookup); 'self' lets the target draft for itself (greedy batches; a correctness "
                        "probe: every proposal must be accepted); draft:CORE drafts with a model from its own core (same "
                        "tokenizer, greedy batches); verified by captured round graphs, greedy output unchanged")
    r.add_argument("--speculative-width", type=int, default=4,
                   help="verification width W: the pending token + up to W-1 proposals (2..8, default 4)")
    r.add_argument("--attention", default=None,
                   help="attention backend by name (torch, triton, ...; default: the recipe's); refused at start, "
                        "with the reason, where it cannot run")
    r.add_argument("--topk-variant", type=int, default=None, metavar="K",
                   help="also capture decode steps whose sampler cuts with topk(K) instead of sorting the "
                        "vocabulary, replayed for batches whose rows are all greedy or have 1 <= top_k <= K")
    r.add_argument("--eager", action="store_true",
                   help="CUDA: capture the uncompiled prepared steps (default: torch.compile them, then capture)")
    return p


def _has_xdist() -> bool:
    try:
        import xdist  # noqa: F401
    except ImportError:
        return False
    return True


def engine_config(args):
    from helios.runtime.engine import EngineConfig

    return EngineConfig(kv_tokens=args.kv_tokens, max_context=args.max_context, device=args.device,
                        queue_timeout_s=args.queue_timeout, prefix_cache=not args.no_prefix_cache,
                        gpu_memory_fraction=args.gpu_memory_fraction,
                        embedding_table_storage=args.embedding_table_storage, compile=not args.eager,
                        speculative=args.speculative, speculative_width=args.speculative_width,
                        attention=args.attention, topk_variant=args.topk_variant)


def _serve(args) -> int:
    import logging

    from helios.runtime.engine import EngineStartError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("flare.helios")
    try:
        from helios.server.app import build_server

        app, engine = build_server(args.core, engine_config(args))
    except (EngineStartError, ValueError) as e:
        print(f"flare run: {e}", file=sys.stderr)
        return 1
    for line in engine.description:
        log.info("%s", line)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "qualify":
        from qualify.main_job import run

        return run(args.recipe, args.results, args.workers, args.hub_cache)
    if args.command == "run":
        return _serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
