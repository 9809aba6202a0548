"""``ignition export``: checkpoint -> prepared model -> tuned, compiled, captured catalog -> core.

The export validates every graph of the catalog on this machine (compiled, and captured on a GPU)
before writing the core, times each step, and writes the core atomically.  ``load_prepared`` is
the inverse the runtime uses: a core -> the same prepared model, with no preparation resources.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("flare.ignition")

DEFAULT_PAGE_SIZE = 16


class ExportError(ValueError):
    pass


@dataclass
class ExportReport:
    core: Path
    timings_s: dict[str, float] = field(default_factory=dict)
    graphs: list[str] = field(default_factory=list)
    memory: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"core": str(self.core), "timings_s": self.timings_s, "graphs": self.graphs, "memory": self.memory}


class _Clock:
    def __init__(self, report: ExportReport, device: str):
        self.report, self.device = report, device

    def __call__(self, name: str):
        clock = self

        class _Span:
            def __enter__(self):
                self.t0 = time.perf_counter()
                log.info("export: %s …", name)

            def __exit__(self, *exc):
                if clock.device.startswith("cuda"):
                    import torch

                    torch.cuda.synchronize()
                clock.report.timings_s[name] = round(time.perf_counter() - self.t0, 3)
                log.info("export: %s done in %.1f s", name, clock.report.timings_s[name])

        return _Span()


def _config(checkpoint: Path) -> dict:
    path = checkpoint / "config.json"
    if not path.is_file():
        raise ExportError(f"{path} not found: export needs a checkpoint folder with weights "
                          "(make one with `ignition synth-checkpoint`)")
    return json.loads(path.read_text())


def _recipe_for(checkpoint: Path, recipe_name: str | None):
    from ignition.recipes.registry import load_recipe, recipe_for_architecture

    archs = _config(checkpoint).get("architectures") or []
    if not archs:
        raise ExportError(f"{checkpoint}/config.json has no 'architectures'")
    recipe = recipe_for_architecture(archs[0])
    if recipe_name and recipe_name != recipe.name:
        raise ExportError(f"--recipe {recipe_name} does not serve {archs[0]} (recipe {recipe.name} does)")
    return load_recipe(recipe.name)


def _recipe_model(recipe):
    import importlib

    module = importlib.import_module(f"ignition.recipes.{recipe.name}.recipe")
    if not hasattr(module, "MODEL"):
        raise ExportError(f"recipe {recipe.name} declares no prepared model yet (frontend only)")
    mod, cls = module.MODEL.split(":")
    return getattr(importlib.import_module(mod), cls), module


def export(checkpoint: str, out: str, *, recipe_name: str | None = None, decode=None, prefill=None,
           device: str | None = None, page_size: int = DEFAULT_PAGE_SIZE, compile: bool = True,
           capture: bool | None = None, hub_cache: str | None = None, overwrite: bool = False,
           progress: bool = True) -> ExportReport:
    import torch

    from ignition.core import core_pb2 as pb
    from ignition.core import export_core, frontend_to_proto, sampling_to_proto
    from ignition.frontend_assets import prepare_frontend_assets

    ckpt = Path(checkpoint)
    if not ckpt.is_dir():
        raise ExportError(f"{checkpoint} is not a checkpoint folder (a hub cache holds no weights; "
                          f"run `ignition synth-checkpoint {checkpoint} --out DIR` first)")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    capture = device.startswith("cuda") if capture is None else capture
    report = ExportReport(Path(out))
    clock = _Clock(report, device)
    recipe = _recipe_for(ckpt, recipe_name)
    model_cls, recipe_module = _recipe_model(recipe)
    cfg = _config(ckpt)
    if cfg.get("rope_scaling") or (cfg.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        raise ExportError("config.json rope scaling is not representable in core format v1")
    with clock("frontend"):
        assets = prepare_frontend_assets(recipe.name, str(ckpt), hub_cache=hub_cache)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    with clock("load_weights"):
        model = model_cls.from_pretrained(ckpt, device=device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        report.memory["weights_bytes"] = torch.cuda.memory_allocated()
    catalog = recipe_module.graph_catalog()
    decode = tuple(decode) if decode else catalog.decode_capacities
    prefill = tuple(prefill) if prefill is not None else catalog.prefill_chunks
    max_context = max(prefill, default=0) + 2 * page_size
    pages = (max(decode, default=1) + 1) * (max_context // page_size + 1)
    with clock("kv_cache"):
        model.allocate_kv_cache(pages, page_size, max_context)
    graphs = catalog.prepare(model, decode=decode, prefill=prefill)
    with clock("tune"):
        graphs.tune()
    if compile:
        with clock("compile"):
            graphs.compile()
    if capture:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()  # compile transients are not the graph pool
        before = torch.cuda.memory_reserved() if device.startswith("cuda") else 0
        with clock("capture"):
            graphs.capture()
        if device.startswith("cuda"):
            report.memory["graph_pool_reserved_bytes"] = torch.cuda.memory_reserved() - before
    report.graphs = [s.shape.name for s in graphs.steps]
    if device.startswith("cuda"):
        report.memory.update(allocated_bytes=torch.cuda.memory_allocated(), reserved_bytes=torch.cuda.memory_reserved(),
                             peak_allocated_bytes=torch.cuda.max_memory_allocated())

    core = pb.Core()
    core.recipe.name, core.recipe.version = recipe.name, "1"
    src = json.loads((ckpt / "flare-synth.json").read_text()) if (ckpt / "flare-synth.json").is_file() else {}
    core.source.repo_id = src.get("repo_id") or assets.checkpoint.repo_id
    core.source.revision = str(src.get("revision") or src.get("commit") or "")
    c = model.config
    g = core.geometry
    g.architecture = cfg["architectures"][0]
    g.vocab_size, g.hidden_size, g.num_layers = c.vocab_size, c.hidden_size, c.num_hidden_layers
    g.num_attention_heads, g.num_kv_heads, g.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    g.intermediate_size, g.max_position_embeddings = c.intermediate_size, c.max_position_embeddings
    g.rope_theta = float((getattr(c, "rope_parameters", None) or {}).get("rope_theta", getattr(c, "rope_theta", 0.0)))
    g.rms_norm_eps, g.tie_word_embeddings = c.rms_norm_eps, bool(c.tie_word_embeddings)
    fp8 = model.quant.method == "fp8" if hasattr(model.quant, "method") else False
    core.weights.format = pb.WEIGHT_FORMAT_FP8_BLOCK if fp8 else pb.WEIGHT_FORMAT_BF16
    if fp8:
        core.weights.block_shape.extend(model.quant.block_size)
    core.kv_layout.page_size, core.kv_layout.dtype, core.kv_layout.layout = page_size, pb.DTYPE_BF16, pb.KV_PAGE_LAYOUT_NHD
    core.graph_catalog.decode_capacities.extend(decode)
    core.graph_catalog.prefill_chunk_sizes.extend(prefill)
    eos = cfg.get("eos_token_id")
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    core.frontend.CopyFrom(frontend_to_proto(recipe.frontend, eos_token_ids=eos,
                                             special_token_variables=assets.variables))
    core.sampling.CopyFrom(sampling_to_proto(assets.checkpoint.sampling))
    del graphs  # graphs are re-captured by the runtime; the core holds what it needs to do so
    with clock("write_core"):
        export_core(out, core, assets.tokenizer_path, assets.annotated_template, prepared_tensors(model),
                    overwrite=overwrite, progress=progress)
    report.timings_s["total"] = round(sum(v for k, v in report.timings_s.items()), 3)
    return report


def prepared_tensors(model):
    """The prepared (packed) parameters, tied copies once, moved to the host one at a time."""
    seen = set()
    for name, tensor in model.hf.state_dict().items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        if key in seen:
            continue  # a tied copy (lm_head sharing the embedding)
        seen.add(key)
        yield name, tensor.detach().to("cpu")


def load_prepared(core_path: str, device: str = "cpu", verify: bool = True, host_embedding: bool = False,
                  attention_backend: str | None = None):
    """A core -> (the prepared model, the loaded core); nothing from preparation is needed.  With
    ``host_embedding`` the model takes ``input_embeds`` and its embedding table is neither allocated on
    ``device`` nor read (unless a tied ``lm_head`` needs it): the caller gathers rows from the core.
    ``attention_backend``: a registered attention backend by name (``ignition.components.backends``; default the
    recipe's own), refused with the reason where it cannot run."""
    import torch
    from transformers import Qwen3Config

    from ignition.core import load_core
    from ignition.recipes.registry import load_recipe

    core = load_core(core_path, verify_checksums=verify, progress=False)
    m = core.manifest
    recipe = load_recipe(m.recipe.name)
    model_cls, _ = _recipe_model(recipe)
    from ignition.core import core_pb2 as pb

    g = m.geometry
    extra = {"attention_backend": attention_backend} if attention_backend else {}
    if host_embedding:
        if not hasattr(model_cls, "embedding_weight_name"):
            raise ExportError(f"recipe {recipe.name} cannot take its embedding rows from the host")
        extra["host_embedding"] = True
    config = Qwen3Config(
        vocab_size=g.vocab_size, hidden_size=g.hidden_size, num_hidden_layers=g.num_layers,
        num_attention_heads=g.num_attention_heads, num_key_value_heads=g.num_kv_heads, head_dim=g.head_dim,
        intermediate_size=g.intermediate_size, max_position_embeddings=g.max_position_embeddings,
        rope_theta=g.rope_theta, rms_norm_eps=g.rms_norm_eps, tie_word_embeddings=g.tie_word_embeddings,
        architectures=[g.architecture])
    if m.weights.format == pb.WEIGHT_FORMAT_BF16:
        model = model_cls(config, device=device, **extra)
    elif m.weights.format == pb.WEIGHT_FORMAT_FP8_BLOCK:
        from ignition.components.projections import FP8_BLOCK_SIZE, Quantization

        block = tuple(m.weights.block_shape)
        if block != FP8_BLOCK_SIZE:
            raise ExportError(f"{core_path}: FP8_BLOCK core with weights.block_shape {list(block)} is not supported "
                              f"(supported: {list(FP8_BLOCK_SIZE)})")
        quant = Quantization("fp8", block)
        formats = model_cls.weight_formats(config, _CoreDtypes(m, model_cls.packed_modules_mapping), quant)
        model = model_cls(config, formats, quant=quant, device=device, **extra)
    else:
        raise ExportError(f"{core_path}: weight format {pb.WeightFormat.Name(m.weights.format)} cannot be loaded "
                          "by this version (supported: WEIGHT_FORMAT_BF16, WEIGHT_FORMAT_FP8_BLOCK)")
    state = model.hf.state_dict()
    names = set(core.tensor_names())
    expected = {n for n in state if not (g.tie_word_embeddings and n == "lm_head.weight")}
    if names != expected:
        raise ExportError(f"{core_path}: tensors differ from the prepared model: missing "
                          f"{sorted(expected - names)[:5]}, unexpected {sorted(names - expected)[:5]}")
    with torch.no_grad():
        for name in core.tensor_names():
            if not state[name].is_meta:  # meta: a table kept off the device (host_embedding), not read
                state[name].copy_(core.get_tensor(name))
    return model, core


class _CoreDtypes:
    """``CheckpointReader.dtype`` over a core's prepared tensors, so that the recipe's own ``weight_formats``
    rebuilds the per-projection formats the core was exported with.  A Hugging Face leaf fused into a
    packed module (``q_proj`` -> ``qkv_proj`` shard 0) is stored either packed, ``<fused>.proj.<suffix>``
    (all parts one format), or split, ``<fused>.parts.<shard>.<suffix>``."""

    _TORCH = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "BF16": "bfloat16", "F16": "float16",
              "F32": "float32"}

    def __init__(self, manifest, packed_modules_mapping: dict[str, tuple[str, int]]):
        import torch

        from ignition.core.schema import dtype_name

        self.mapping = packed_modules_mapping
        self.dtypes = {t.name: getattr(torch, self._TORCH.get(dtype_name(t.dtype), "uint8"))
                       for t in manifest.weights.tensors}

    def dtype(self, name: str):
        module, _, suffix = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        candidates = [name]
        if leaf in self.mapping:
            fused, shard = self.mapping[leaf]
            base = f"{parent}.{fused}" if parent else fused
            candidates = [f"{base}.proj.{suffix}", f"{base}.parts.{shard}.{suffix}"]
        for c in candidates:
            if c in self.dtypes:
                return self.dtypes[c]
        return None  # absent (a tied lm_head): bf16; the tensor-name check in load_prepared reports real gaps
