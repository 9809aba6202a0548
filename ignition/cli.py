"""``ignition`` command line: thin wrappers over the library."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ignition.durability import without_fsync


def _cmd_template_author(args) -> int:
    from ignition.templates.patch import TemplateSource, author, read_source_text

    source = TemplateSource(
        repo_id=None if args.embedded else args.repo_id,
        revision=None if args.embedded else args.revision,
        filename=args.filename,
        json_key=args.json_key,
        embedded=args.embedded,
    )
    text = read_source_text(source, hub_cache=args.hub_cache)
    annotated = Path(args.annotated).read_text(encoding="utf-8")
    patch = author(text, annotated, source)
    # The annotated result must compile (marks at root output sites only).
    from helios.frontend.environment import compile_template

    compile_template(annotated)
    Path(args.output).write_text(patch.to_json())
    print(f"wrote {args.output}: {len(patch.insertions)} marks, source {patch.source_sha256[:12]}, "
          f"result {patch.result_sha256[:12]}")
    return 0


def _cmd_template_annotated(args) -> int:
    """Print the annotated template a patch produces (for editing marks by hand in a copy)."""
    from ignition.recipes.registry import load_recipe
    from ignition.templates.patch import TemplatePatch, read_source_text

    recipe = load_recipe(args.recipe)
    patch = TemplatePatch.load(recipe.patch_path(args.variant))
    sys.stdout.write(patch.apply(read_source_text(patch.source, hub_cache=args.hub_cache)))
    return 0


def _cmd_frontend_render(args) -> int:
    from helios.frontend.conversation import FrontendError
    from helios.protocol import decode_request
    from ignition.frontend_assets import load_frontend
    from ignition.hub import default_hub_cache

    try:
        request = json.loads(Path(args.request).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        print(f"error: cannot read request {args.request}: {exc}", file=sys.stderr)
        return 2
    try:
        frontend = load_frontend(args.recipe, args.checkpoint, args.variant, args.hub_cache or default_hub_cache())
        conv = decode_request(args.protocol, request)
        prepared = frontend.prepare(conv)
    except (FrontendError, KeyError, ValueError, FileNotFoundError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"error: {msg}", file=sys.stderr)
        return 1
    out = prepared.to_dict()
    out.pop("hint_unsupported") if not out["hint_unsupported"] else None
    print(json.dumps(out, ensure_ascii=False))
    return 0


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _byte_size(text: str) -> int:
    """``4294967296``, ``4GiB``, ``500MB``: a positive number of bytes."""
    import re

    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SIZE_UNITS or int(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a positive byte size: {text!r} (e.g. 4294967296, 4GiB, 500MB)")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]


def _cmd_synth(args) -> int:
    import time

    from ignition.checkpoints.synth import (
        DEFAULT_SHARD_SIZE, GEOMETRY_FIELDS, SynthError, read_manifest, synthesize_checkpoint,
    )

    overrides = {k: getattr(args, k) for k in GEOMETRY_FIELDS if getattr(args, k) is not None}
    for item in args.set or ():
        key, sep, value = item.partition("=")
        try:
            if not sep or not key:
                raise ValueError("expected KEY=JSON")
            overrides[key] = json.loads(value)
        except ValueError as exc:
            print(f"error: --set {item!r}: {exc}", file=sys.stderr)
            return 2
    started = time.perf_counter()
    try:
        with without_fsync(args.no_fsync):
            out = synthesize_checkpoint(
                args.repo_id, args.out, seed=args.seed, overrides=overrides, hub_cache=args.hub_cache,
                shard_size=args.shard_size or DEFAULT_SHARD_SIZE, revision=args.revision, force=args.force,
                progress=not args.quiet,
            )
    except SynthError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    m = read_manifest(out)
    shards = sum(1 for name in m["files"] if name.endswith(".safetensors"))
    rev = m["source"]["revision"]
    print(f"wrote {out}: {m['tensors']} tensors, {m['parameters']:,} parameters, {m['weight_bytes']:,} bytes "
          f"in {shards} shard(s), seed {m['seed']}, from {m['source']['repo_id']}" + (f"@{rev[:12]}" if rev else "")
          + f"; copied {', '.join(m['source']['copied']) or 'nothing'} ({time.perf_counter() - started:.1f}s)")
    return 0


def _no_fsync_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """The writers' ``--no-fsync`` (``ignition.durability.without_fsync``)."""
    parser.add_argument("--no-fsync", action="store_true",
                        help=f"skip fsync: for throwaway outputs (a scratch {what} on a benchmark machine); readers "
                             "see complete files, but a power loss can leave them incomplete")


def _cmd_export(args) -> int:
    import logging

    from ignition.preparation import ExportError, export

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    caps = lambda text: tuple(int(x) for x in text.split(",") if x) if text is not None else None  # noqa: E731
    try:
        with without_fsync(args.no_fsync):
            report = export(args.checkpoint, args.out, recipe_name=args.recipe, decode=caps(args.capacities),
                            prefill=caps(args.prefill_chunks), device=args.device, page_size=args.page_size,
                            compile=not args.eager, hub_cache=args.hub_cache, overwrite=args.overwrite)
    except (ExportError, FileNotFoundError, KeyError, ValueError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.to_dict()))
    return 0


def _cmd_bench(args) -> int:
    from ignition.bench import main

    return main(args, args.argv)


DEBUG_SERVE_BANNER = """\
================================================================================
 ignition debug-serve: FAULT DIAGNOSIS ONLY.
 The checkpoint was prepared in this process into a temporary core (removed at
 exit){eager}.
 Timings and throughput seen here are NOT serving measurements: export a core
 (`ignition export`), serve it with `flare run` and measure with `flare qualify`.
================================================================================"""


def _cmd_debug_serve(args) -> int:
    """Prepare a checkpoint in process into a temporary core and serve it with ``flare run``'s app."""
    import logging
    import shutil
    import tempfile

    from helios.runtime.engine import EngineConfig, EngineStartError
    from helios.server.app import build_server
    from ignition.preparation import ExportError, export

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("flare.ignition")
    caps = lambda text: tuple(int(x) for x in text.split(",") if x) if text is not None else None  # noqa: E731
    if not Path(args.checkpoint).is_dir():
        print(f"ignition debug-serve: {args.checkpoint} is not a checkpoint folder", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="flare-debug-serve-"))
    try:
        core = tmp / "core"
        try:
            export(args.checkpoint, str(core), decode=caps(args.capacities), prefill=caps(args.prefill_chunks),
                   device=args.device, compile=not args.eager, progress=False)
            config = EngineConfig(kv_tokens=args.kv_tokens, max_context=args.max_context, device=args.device)
            app, engine = build_server(str(core), config)
        except (ExportError, EngineStartError, OSError, KeyError, ValueError) as exc:
            msg = str(exc.args[0] if exc.args else exc) or type(exc).__name__
            print(f"ignition debug-serve: {msg.splitlines()[0]}", file=sys.stderr)
            return 1
        print(DEBUG_SERVE_BANNER.format(eager="; --eager: no torch.compile" if args.eager else ""), file=sys.stderr,
              flush=True)
        for line in engine.description:
            log.info("%s", line)
        import uvicorn

        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ignition", description="Prepare checkpoints into Flare cores.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("template", help="annotated chat templates").add_subparsers(dest="sub", required=True)
    a = t.add_parser("author", help="write a patch asset from an annotated copy and the pinned source")
    a.add_argument("--annotated", required=True, help="the annotated copy (marks written by hand)")
    a.add_argument("--output", required=True, help="patch asset to write")
    a.add_argument("--repo-id")
    a.add_argument("--revision")
    a.add_argument("--filename", required=True)
    a.add_argument("--json-key", default=None, help="e.g. chat_template inside tokenizer_config.json")
    a.add_argument("--embedded", default=None, help="repository path of a project-owned source template")
    a.add_argument("--hub-cache", default=None)
    a.set_defaults(func=_cmd_template_author)
    s = t.add_parser("annotated", help="print the annotated template of a recipe variant")
    s.add_argument("--recipe", required=True)
    s.add_argument("--variant", required=True)
    s.add_argument("--hub-cache", default=None)
    s.set_defaults(func=_cmd_template_annotated)

    e = sub.add_parser("export", help="prepare a checkpoint folder into a core (tune, compile, capture, write)")
    e.add_argument("--recipe", default=None, help="recipe name (default: from config.json architectures)")
    e.add_argument("--checkpoint", required=True, help="checkpoint folder with weights")
    e.add_argument("--out", required=True, help="core directory to write (atomically)")
    e.add_argument("--capacities", default=None, help="decode capacities, e.g. 1,4 (default: the recipe's)")
    e.add_argument("--prefill-chunks", default=None, help="prefill chunk sizes, e.g. 256 ('' for none)")
    e.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    e.add_argument("--page-size", type=int, default=16)
    e.add_argument("--eager", action="store_true", help="validate eager prepared forwards (no torch.compile)")
    e.add_argument("--hub-cache", default=None)
    e.add_argument("--overwrite", action="store_true")
    _no_fsync_flag(e, "core")
    e.set_defaults(func=_cmd_export)

    b = sub.add_parser("bench", help="time prepared graph rounds (or exact prefill chunks) of a core on real "
                       "tokenized contexts; score = mean of per-case medians, lower is better")
    from ignition.bench import add_arguments as bench_arguments

    bench_arguments(b)
    b.set_defaults(func=_cmd_bench)

    d = sub.add_parser("debug-serve", help="prepare a checkpoint in process and serve it (fault diagnosis only)")
    d.add_argument("checkpoint", help="checkpoint folder with weights")
    d.add_argument("--eager", action="store_true", help="skip torch.compile while preparing (the served steps are built from the core as `flare run` "
                   "builds them)")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=int, default=8000)
    d.add_argument("--kv-tokens", type=int, default=None, help="KV pool size in tokens")
    d.add_argument("--max-context", type=int, default=None, help="per-request context in tokens")
    d.add_argument("--capacities", default=None, help="decode capacities, e.g. 1,4 (default: the recipe's)")
    d.add_argument("--prefill-chunks", default=None, help="prefill chunk sizes, e.g. 256 (default: the recipe's)")
    d.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    d.set_defaults(func=_cmd_debug_serve)

    f = sub.add_parser("frontend", help="inspect the prompt frontend").add_subparsers(dest="sub", required=True)
    r = f.add_parser("render", help="render a request: prompt, token IDs, endpoints, hints, sampling")
    r.add_argument("--recipe", required=True)
    r.add_argument("--checkpoint", required=True, help="hub repo id (offline cache) or checkpoint folder")
    r.add_argument("--protocol", choices=("openai", "anthropic"), required=True)
    r.add_argument("--variant", default=None, help="template variant (default: the checkpoint's)")
    r.add_argument("--hub-cache", default=None)
    r.add_argument("request", help="request JSON file")
    r.set_defaults(func=_cmd_frontend_render)

    c = sub.add_parser("synth-checkpoint", help="write a checkpoint folder with seeded random weights (no downloads)")
    c.add_argument("repo_id", help="hub repo id in the offline cache, or flare/embedded-default")
    c.add_argument("--out", required=True, help="checkpoint folder to write (must be empty or absent)")
    c.add_argument("--seed", type=int, default=0)
    for flag, field in (("layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                        ("intermediate", "intermediate_size"), ("heads", "num_attention_heads"),
                        ("kv-heads", "num_key_value_heads"), ("head-dim", "head_dim"), ("vocab", "vocab_size")):
        c.add_argument(f"--{flag}", type=int, default=None, metavar="N", help=f"override {field}")
    c.add_argument("--set", action="append", metavar="KEY=JSON",
                   help="override any other config field (JSON value; null removes it); repeatable")
    c.add_argument("--hub-cache", default=None)
    c.add_argument("--revision", default=None, help="hub revision (default: refs/main)")
    c.add_argument("--shard-size", type=_byte_size, default=None, metavar="BYTES",
                   help="largest shard (default 4GiB); accepts 4GiB, 500MB, ...")
    c.add_argument("--force", action="store_true", help="replace a non-empty --out")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    _no_fsync_flag(c, "checkpoint")
    c.set_defaults(func=_cmd_synth)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
