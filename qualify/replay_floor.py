"""The decode-step bandwidth floor: the bytes one decode step must read, and the time that takes.

``weight_traffic(core_or_geometry, batch, context)`` counts the bytes a single-token decode step at
``batch`` rows must read from device memory:

- every stored tensor of the core (weights, FP8 scales, norms, small buffers) once, except the token
  embedding, of which only the ``batch`` gathered rows are read (``batch x hidden x dtype bytes``);
- a tied ``lm_head`` (no ``lm_head.weight`` in the core, ``geometry.tie_word_embeddings``) reads the whole
  embedding matrix once for the vocabulary projection;
- the KV cache at ``context`` tokens per row: ``layers x kv_heads x head_dim x 2 (K, V) x context x batch x
  KV dtype bytes``.

The source is a core directory, a :class:`ignition.core.LoadedCore`, a ``Core`` manifest message (its
``weights.tensors`` give names, dtypes and shapes; ``kv_layout.dtype`` the KV dtype), or a plain geometry
dict (Qwen3 layout: q/k/v/o projections, gate/up/down MLP, input/post-attention RMSNorms, per-head q/k norms,
final norm; ``dtype_bytes`` / ``kv_dtype_bytes`` default 2, bf16).

Both also give ``layer_projection_bytes`` (and ``layer_projection_names``, their modules): the bytes of one decoder
layer's projections in the order the step runs them (the manifest's order of its ``*_proj`` modules, each with every tensor stored under it -- packed parts, FP8
scales; the geometry's packed q/k/v, o, packed gate/up, down), when every layer holds the same; a timeline's
per-kernel floor comes from it (``qualify.critical_path.position_gaps``).

``floor_s = total_bytes / bandwidth`` with ``bandwidth`` the *measured* device read bandwidth in bytes/s.
Measuring that bandwidth needs a CUDA GPU: :func:`measure_read_bandwidth` (raises on a CPU machine).

CLI: ``python -m qualify.replay_floor CORE --batch 1,4 --context 1024 [--bandwidth 4.23e12]`` prints one
JSON object ``{"source": ..., "bandwidth": ..., "cases": [weight_traffic(...) per batch]}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import sys
from typing import Any, Mapping

EMBEDDING_SUFFIX = "embed_tokens.weight"
LM_HEAD_NAME = "lm_head.weight"

# geometry dict aliases (core Geometry names first, Hugging Face config names second)
_ALIASES = {
    "num_layers": ("num_layers", "num_hidden_layers"),
    "num_kv_heads": ("num_kv_heads", "num_key_value_heads"),
}


def _get(geometry: Mapping[str, Any], key: str, default=None):
    for name in _ALIASES.get(key, (key,)):
        if name in geometry and geometry[name] is not None:
            return geometry[name]
    if default is not None:
        return default
    raise KeyError(f"geometry lacks {key!r} (accepted names: {_ALIASES.get(key, (key,))})")


def _kv_bytes(layers: int, kv_heads: int, head_dim: int, context: int, batch: int, kv_dtype_bytes: int) -> int:
    return layers * kv_heads * head_dim * 2 * context * batch * kv_dtype_bytes


def _finish(out: dict, bandwidth: float | None) -> dict:
    out["total_bytes"] = out["weight_bytes_read"] + out["kv_bytes"]
    if bandwidth is not None:
        out["bandwidth_bytes_per_s"] = float(bandwidth)
        out["floor_s"] = floor_seconds(out["total_bytes"], bandwidth)
    return out


def floor_seconds(total_bytes: int, bandwidth: float) -> float:
    """``total_bytes / bandwidth`` (bandwidth in bytes/s, measured on the device)."""
    if not bandwidth or bandwidth <= 0:
        raise ValueError(f"bandwidth must be a positive number of bytes/s, got {bandwidth!r}")
    return total_bytes / float(bandwidth)


def _from_geometry(g: Mapping[str, Any], batch: int, context: int) -> dict:
    hidden, layers = int(_get(g, "hidden_size")), int(_get(g, "num_layers"))
    heads, kv_heads = int(_get(g, "num_attention_heads")), int(_get(g, "num_kv_heads"))
    head_dim = int(g.get("head_dim") or hidden // heads)
    inter, vocab = int(_get(g, "intermediate_size")), int(_get(g, "vocab_size"))
    tied = bool(g.get("tie_word_embeddings", False))
    wb, kvb = int(g.get("dtype_bytes", 2)), int(g.get("kv_dtype_bytes", 2))
    per_layer = (hidden * heads * head_dim          # q_proj
                 + 2 * hidden * kv_heads * head_dim  # k_proj, v_proj
                 + heads * head_dim * hidden        # o_proj
                 + 3 * hidden * inter               # gate, up, down
                 + 2 * hidden + 2 * head_dim)       # input/post-attention norms, q_norm, k_norm
    projections = [hidden * (heads + 2 * kv_heads) * head_dim, heads * head_dim * hidden, 2 * hidden * inter,
                   inter * hidden]  # packed q/k/v, o, packed gate/up, down
    embedding = vocab * hidden
    stored = layers * per_layer + hidden + embedding + (0 if tied else vocab * hidden)
    gathered = min(batch, vocab) * hidden
    lm_head = vocab * hidden  # separate or tied: the vocabulary projection reads the whole matrix once
    read = layers * per_layer + hidden + gathered + lm_head
    return {"source": "geometry", "batch": batch, "context": context, "num_layers": layers,
            "weight_bytes_stored": stored * wb, "weight_bytes_read": read * wb,
            "embedding_bytes_gathered": gathered * wb, "lm_head_bytes": lm_head * wb, "tied_lm_head": tied,
            "layer_projection_bytes": [n * wb for n in projections],
            "layer_projection_names": ["self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"],
            "kv_bytes": _kv_bytes(layers, kv_heads, head_dim, context, batch, kvb)}


_LAYER = re.compile(r"^(?:.*\.)?layers\.(\d+)\.(.+)$")


def _layer_projections(named: list[tuple[str, int]], layers: int) -> dict[str, int] | None:
    """One decoder layer's projections in manifest order (module doc), ``{module path under layers.<i>: bytes}`` --
    each ``*_proj`` module of ``layers.<i>.`` with every tensor under it -- or None when a layer has none or the layers
    differ."""
    per_layer: list[dict[str, int]] = [{} for _ in range(layers)]
    for name, n in named:
        m = _LAYER.match(name)
        if not m or int(m.group(1)) >= layers:
            continue
        parts = m.group(2).split(".")
        cut = next((j for j, part in enumerate(parts) if part.endswith("_proj")), None)
        if cut is not None:
            layer, key = per_layer[int(m.group(1))], ".".join(parts[:cut + 1])
            layer[key] = layer.get(key, 0) + n
    first = per_layer[0] if per_layer else {}
    if not first or any(list(d.items()) != list(first.items()) for d in per_layer):
        return None
    return first


def _from_manifest(m, batch: int, context: int) -> dict:
    from ignition.core import core_pb2 as pb
    from ignition.core.schema import DTYPES

    g = m.geometry
    tensors = list(m.weights.tensors)
    if not tensors:
        raise ValueError("the core manifest lists no weight tensors")

    def nbytes(t) -> int:
        if t.dtype not in DTYPES:
            raise ValueError(f"tensor {t.name}: dtype {t.dtype} has no known size")
        n = 1
        for d in t.shape:
            n *= int(d)
        return n * DTYPES[t.dtype][1]

    embeds = [t for t in tensors if t.name.endswith(EMBEDDING_SUFFIX)]
    if len(embeds) != 1:
        raise ValueError(f"expected one '*{EMBEDDING_SUFFIX}' tensor in the core, found {[t.name for t in embeds]}")
    emb = embeds[0]
    if len(emb.shape) != 2:
        raise ValueError(f"{emb.name}: expected a 2-D [vocab, hidden] embedding, shape {list(emb.shape)}")
    vocab = int(emb.shape[0])
    emb_bytes, row_bytes = nbytes(emb), nbytes(emb) // vocab
    stored = sum(nbytes(t) for t in tensors)
    has_lm_head = any(t.name == LM_HEAD_NAME for t in tensors)
    tied = not has_lm_head  # no separate lm_head: the vocabulary projection reads the (tied) embedding
    gathered = min(batch, vocab) * row_bytes
    read = stored - emb_bytes + gathered + (emb_bytes if tied else 0)
    lm_head = emb_bytes if tied else sum(nbytes(t) for t in tensors if t.name == LM_HEAD_NAME)
    projections = _layer_projections([(t.name, nbytes(t)) for t in tensors], int(g.num_layers))
    kv_dtype = m.kv_layout.dtype
    if kv_dtype == pb.DTYPE_UNSPECIFIED:
        kv_dtype = emb.dtype  # no stated KV dtype: the activation dtype of the embedding
    kvb = DTYPES[kv_dtype][1]
    return {"source": "manifest", "batch": batch, "context": context, "num_layers": int(g.num_layers),
            "weight_format": pb.WeightFormat.Name(m.weights.format),
            "weight_bytes_stored": stored, "weight_bytes_read": read,
            "embedding_bytes_gathered": gathered, "lm_head_bytes": lm_head, "tied_lm_head": tied,
            "kv_dtype_bytes": kvb, **({"layer_projection_bytes": list(projections.values()),
                                       "layer_projection_names": list(projections)} if projections else {}),
            "kv_bytes": _kv_bytes(int(g.num_layers), int(g.num_kv_heads), int(g.head_dim), context, batch, kvb)}


def weight_traffic(core_or_geometry, batch: int, context: int, bandwidth: float | None = None) -> dict:
    """Bytes one decode step at ``batch`` rows and ``context`` tokens must read (and ``floor_s`` when
    ``bandwidth``, bytes/s, is given).  Source: a core path, LoadedCore, Core message or geometry dict."""
    if batch < 1 or context < 0:
        raise ValueError(f"batch must be >= 1 and context >= 0, got batch={batch}, context={context}")
    src = core_or_geometry
    if isinstance(src, (str, os.PathLike)):
        from ignition.core import load_core

        src = load_core(src, verify_checksums=False, progress=False)
    if hasattr(src, "manifest"):
        src = src.manifest
    if isinstance(src, Mapping):
        out = _from_geometry(src, batch, context)
    elif hasattr(src, "weights") and hasattr(src, "geometry"):
        out = _from_manifest(src, batch, context)
    else:
        raise TypeError(f"expected a core path, LoadedCore, Core manifest or geometry dict, got {type(src).__name__}")
    return _finish(out, bandwidth)


def region_bytes(traffic: Mapping[str, Any]) -> dict[str, int]:
    """The floor's bytes of :func:`weight_traffic` split by the regions of a decode step's timeline
    (``qualify.timeline``), summing to ``total_bytes``: the decoder layers every weight but the vocabulary projection
    and the gathered embedding rows, plus the KV cache; the head the vocabulary projection; the eager glue the
    gathered rows.  Every other region (sampler, metadata...) reads nothing the floor counts.  Raises naming a missing
    field."""
    from qualify.timeline import LAYERS, UNRANGED

    missing = [k for k in ("weight_bytes_read", "lm_head_bytes", "embedding_bytes_gathered", "kv_bytes")
               if k not in traffic]
    if missing:
        raise KeyError(f"weight traffic lacks {missing} (archived before the per-region split?)")
    head, gathered = int(traffic["lm_head_bytes"]), int(traffic["embedding_bytes_gathered"])
    layers = int(traffic["weight_bytes_read"]) - head - gathered + int(traffic["kv_bytes"])
    return {LAYERS: layers, "head": head, UNRANGED: gathered}


def measured_floor(nbytes: int, samples: int = 50, warmup: int = 5) -> dict:
    """The measured floor of a case: a minimal captured CUDA graph that reads exactly ``nbytes`` (one bf16
    reduction over a buffer of that size), timed by CUDA events around replay (:mod:`qualify.timing`).
    Returns ``{"floor_s": median, "samples_s": [...], "bandwidth_bytes_per_s": nbytes / median}``.
    Needs a CUDA GPU; on a machine without one it raises ``RuntimeError``."""
    import torch

    from qualify.timing import captured, time_samples

    if not torch.cuda.is_available():
        raise RuntimeError("the measured floor needs a CUDA GPU (none on this machine): pass a measured "
                           "--bandwidth in bytes/s instead (the H200 read bandwidth is in ../shared/GUIDE.md §5)")
    buf = torch.ones(max(nbytes // 2, 1), dtype=torch.bfloat16, device="cuda")
    out = torch.empty((), dtype=torch.float32, device="cuda")
    graph = captured(functools.partial(torch.sum, buf, dim=0, dtype=torch.float32, out=out))
    times = time_samples(graph.replay, samples=samples, warmup=warmup, device="cuda")
    median = statistics.median(times)  # the statistic the replay's ratio divides (qualify.timing.summarize)
    del graph, buf
    torch.cuda.empty_cache()
    return {"floor_s": median, "samples_s": times, "bandwidth_bytes_per_s": (nbytes // 2) * 2 / median,
            "nbytes": nbytes}


def measure_read_bandwidth(nbytes: int = 4 << 30, samples: int = 50) -> float:
    """Achieved device read bandwidth (bytes/s) of the floor graph over ``nbytes`` (CUDA only)."""
    return measured_floor(nbytes, samples)["bandwidth_bytes_per_s"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qualify.replay_floor", description=__doc__.split("\n\n")[0])
    p.add_argument("core", help="a core directory (ignition export output)")
    p.add_argument("--batch", default="1,4", help="comma-separated batch sizes (default 1,4)")
    p.add_argument("--context", type=int, default=1024, help="KV context in tokens per row (default 1024)")
    p.add_argument("--bandwidth", type=float, default=None,
                   help="measured read bandwidth in bytes/s (e.g. 4.23e12); without it no floor_s is printed")
    p.add_argument("--measure", action="store_true", help="measure the read bandwidth on this GPU (CUDA only)")
    args = p.parse_args(argv)
    if args.measure and args.bandwidth is not None:
        p.error("--measure and --bandwidth: give one (the measured bandwidth would replace the given one)")
    if args.bandwidth is not None and not args.bandwidth > 0:
        p.error(f"--bandwidth {args.bandwidth}: expected bytes/s > 0")
    from qualify.arguments import int_list

    batches = int_list(p, "--batch", args.batch)
    bandwidth = args.bandwidth
    if args.measure:
        try:
            bandwidth = measure_read_bandwidth()
        except RuntimeError as exc:
            print(f"replay_floor: {exc}", file=sys.stderr)
            return 2
    try:
        cases = [weight_traffic(args.core, b, args.context, bandwidth) for b in batches]
    except (ValueError, KeyError, TypeError) as exc:  # CoreFormatError is a ValueError
        print(f"replay_floor: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"source": str(args.core), "bandwidth_bytes_per_s": bandwidth,
                      "bandwidth_measured_here": bool(args.measure), "cases": cases}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
