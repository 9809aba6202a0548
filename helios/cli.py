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
    return p


def _has_xdist() -> bool:
    try:
        import xdist  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "qualify":
        from qualify.main_job import run

        return run(args.recipe, args.results, args.workers, args.hub_cache)
    return 2


if __name__ == "__main__":
    sys.exit(main())
