"""Kernel timeline of one prefill chunk of a Qwen3 geometry, without a checkpoint or a core: the prepared model
(``PreparedQwen3``, the recipe's modules) with random weights, a few layers, compiled and captured by the graph
catalog exactly as a core's prefill step, then profiled by ``qualify.timeline.profile_step`` (graph elapsed,
kernels per layer and per operator).

    python scripts/prefill_profile.py [--config .hub/.../config.json | --hub-model Qwen/Qwen3-8B] [--layers 4]
        [--chunk 4096] [--attention triton] [--json OUT] [--trace-dir DIR]

Per-layer numbers are what a full-depth chunk spends per layer (the layers are identical); the head and the
eager glue are per chunk.  FLOP/s: the model's prefill FLOPs for these layers (``qualify.flops.prefill_flops``)
over the graph's median.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hub-model", default="Qwen/Qwen3-8B")
    ap.add_argument("--hub-cache", default=".hub")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--attention", default="triton")
    ap.add_argument("--json", default=None)
    ap.add_argument("--trace-dir", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: build, compile and run the chunk once (a smoke test)")
    args = ap.parse_args(argv)

    import torch
    from transformers import Qwen3Config

    from ignition.components.attention import slot_mapping_for
    from ignition.recipes.qwen3.model import PreparedQwen3
    from ignition.recipes.qwen3.recipe import graph_catalog  # the recipe's catalog, with this chunk
    from qualify.timeline import format_table, profile_step

    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("prefill_profile: needs a CUDA device (or --device cpu for a smoke run)", file=sys.stderr)
        return 2
    from huggingface_hub import hf_hub_download

    config = Qwen3Config.from_pretrained(Path(hf_hub_download(args.hub_model, "config.json",
                                                              cache_dir=args.hub_cache)).parent)
    config.num_hidden_layers = args.layers
    config.layer_types = config.layer_types[:args.layers]
    torch.manual_seed(0)
    model = PreparedQwen3(config, device=dev, attention_backend=args.attention)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn_like(p) * 0.02)
    pages = -(-args.chunk // args.page)
    model.allocate_kv_cache(num_pages=pages + 8, page_size=args.page, max_context=pages * args.page)
    catalog = graph_catalog()
    catalog = type(catalog)(decode_capacities=catalog.decode_capacities, prefill_chunks=(args.chunk,))
    graphs = catalog.prepare(model, decode=(), prefill=(args.chunk,)).compile()
    if dev == "cuda":
        graphs = graphs.capture()
    step = graphs.step("prefill", 1, args.chunk)
    n = args.chunk
    bt = torch.arange(pages, dtype=torch.int32).view(1, -1)
    pos = torch.arange(n).view(1, n)
    step.load(input_ids=torch.randint(0, config.vocab_size, (1, n), device=dev), positions=pos.to(dev),
              slot_mapping=slot_mapping_for(bt, pos, torch.ones_like(pos, dtype=torch.bool), args.page).to(dev),
              block_tables=bt.to(dev), seq_lens=torch.tensor([n], device=dev),
              active_rows=torch.ones(1, dtype=torch.bool, device=dev))
    if dev != "cuda":
        step.execute()
        print(f"prefill_profile: ran one {n}-token chunk on {dev}; logits finite: "
              f"{bool(torch.isfinite(step.logits).all())}")
        return 0
    trace_dir = Path(args.trace_dir or tempfile.mkdtemp(prefix="flare-prefill-"))
    trace_dir.mkdir(parents=True, exist_ok=True)
    result = profile_step(step, f"prefill-{n}", trace_dir)
    table = format_table(result).replace("timeline B=1", f"prefill chunk {n} ({args.layers} layers)")
    print(table)
    result.update(config=args.hub_model, layers=args.layers, chunk=n, attention=args.attention, table=table)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
