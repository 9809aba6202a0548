"""``ignition synth-checkpoint``: Hugging Face checkpoints with seeded random weights, no downloads.

:func:`synthesize_checkpoint` writes an ordinary checkpoint folder for a hub repository whose
``config.json`` is in the offline hub cache (or for the project's embedded default):

* ``config.json``: the repository's own file, byte for byte, or, with geometry overrides, the same
  JSON with those fields replaced (every other field kept).
* ``model.safetensors`` or ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``:
  exactly the tensors ``save_pretrained`` would write for the transformers model of that config
  (names, shapes, dtypes read from the model built on the ``meta`` device; tied weights omitted;
  transformers' checkpoint conversions reverted, e.g. fused MoE experts back to per-expert
  tensors), with seeded values (:mod:`.writer`).  Weights are generated and written block by
  block: memory stays at a few MiB for any checkpoint size.
* the tokenizer and template files of the same hub snapshot (:data:`HUB_FILES`, where present).
* ``flare-synth.json``: provenance (source snapshot, seed, overrides, value rules) and the SHA-256
  of every file.  Loaders ignore it; it marks the weights as synthetic.

Value rules: names ending in ``norm.weight`` (RMSNorm/LayerNorm scales, q_norm/k_norm included)
are ones, names ending in ``bias`` are zeros, everything else is ``normal(0, initializer_range)``
(0.02 when the config has none), drawn in fp32 and cast to the tensor's dtype.

Overrides are config field names (``num_hidden_layers``) or the CLI's short names (``layers``).
The geometry fields must be positive integers; ``num_key_value_heads`` must divide
``num_attention_heads``; without an explicit ``head_dim`` the hidden size must be divisible by the
head count; ``vocab_size`` must cover the copied tokenizer (largest token ID + 1, added tokens
included) and every special-token ID in the config, so no token can index past the embedding.
The same seed, repository snapshot and overrides give byte-identical files.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
import sys
from pathlib import Path
from typing import Any, Mapping

from . import writer
from .writer import TensorSpec

DEFAULT_SHARD_SIZE = 4 * 1024**3
EMBEDDED_REPO_ID = "flare/embedded-default"
MANIFEST = "flare-synth.json"
#: Bump when the folder layout or manifest changes (part of the embedded cache key).
CHECKPOINT_FORMAT = 1
#: Files copied from the hub snapshot when present (what tokenizers and the runtime read).
HUB_FILES = (
    "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
    "generation_config.json", "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model",
)
#: CLI short names of the geometry overrides -> config fields.
GEOMETRY_FIELDS = {
    "layers": "num_hidden_layers", "hidden": "hidden_size", "intermediate": "intermediate_size",
    "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "head_dim": "head_dim",
    "vocab": "vocab_size",
}
_SPECIAL_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


class SynthError(ValueError):
    """A checkpoint cannot be synthesized; the message names the repository, file or config field."""


# -- sources ---------------------------------------------------------------------------------------

class _Source:
    """Where config and tokenizer files come from: a hub snapshot or the embedded default."""

    def __init__(self, repo_id: str, revision: str | None, config_bytes: bytes, files: dict[str, Path]):
        self.repo_id, self.revision, self.config_bytes, self.files = repo_id, revision, config_bytes, files


def _hub_source(repo_id: str, hub_cache: str | os.PathLike | None, revision: str | None) -> _Source:
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import LocalEntryNotFoundError

    if hub_cache is None:
        from ignition.hub import default_hub_cache

        hub_cache = default_hub_cache()
    if hub_cache is None:
        raise SynthError(f"{repo_id}: no hub cache found for config.json (set HF_HUB_CACHE or pass --hub-cache); "
                         f"nothing is downloaded")
    try:
        config_path = Path(hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=str(hub_cache),
                                           local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as exc:
        where = f"revision {revision}" if revision else "refs/main"
        raise SynthError(f"{repo_id}: config.json ({where}) is not in the hub cache {hub_cache}; "
                         f"nothing is downloaded ({type(exc).__name__})") from None
    commit = config_path.parent.name  # .../snapshots/<commit>/config.json
    files: dict[str, Path] = {}
    for name in HUB_FILES:
        found = try_to_load_from_cache(repo_id, name, cache_dir=str(hub_cache), revision=commit)
        if isinstance(found, str) and os.path.isfile(found):
            files[name] = Path(found)
    return _Source(repo_id, commit, config_path.read_bytes(), files)


def embedded_config(tokenizer_dir: Path) -> dict:
    """The embedded default's Qwen3-architecture config (vocabulary and special IDs from its tokenizer)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tcfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))

    def token_id(field: str) -> int:
        tid = tok.token_to_id(tcfg[field])
        if tid is None:
            raise SynthError(f"{EMBEDDED_REPO_ID}: {field} {tcfg[field]!r} is not in the embedded tokenizer")
        return tid

    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": token_id("bos_token"),
        "eos_token_id": token_id("eos_token"),
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "max_window_layers": 2,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pad_token_id": token_id("pad_token"),
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
    }


def _embedded_source() -> _Source:
    from ignition.embedded import FILES, materialize_default

    folder = materialize_default()
    config = embedded_config(folder)
    return _Source(EMBEDDED_REPO_ID, None, _dump_json(config), {name: folder / name for name in FILES})


def _dump_json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


# -- overrides and validation ----------------------------------------------------------------------

def normalize_overrides(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Map short names to config fields and check geometry values (positive integers)."""
    out: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        field = GEOMETRY_FIELDS.get(key.replace("-", "_"), key)
        if field in out:
            raise SynthError(f"override {field} given twice")
        if field in GEOMETRY_FIELDS.values():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SynthError(f"override {field} must be a positive integer, got {value!r}")
        out[field] = value
    return out


def apply_overrides(raw: dict, overrides: Mapping[str, Any], text_attrs: set[str], repo_id: str) -> dict:
    """``raw`` (config.json) with ``overrides`` set where each field lives (top level or ``text_config``).

    A field absent from the JSON is added only where the transformers config class knows it
    (``text_attrs``); ``None`` removes a field.  A per-layer ``layer_types`` list follows a changed
    ``num_hidden_layers`` (truncated, or its pattern repeated).
    """
    out = copy.deepcopy(raw)
    text = out.get("text_config") if isinstance(out.get("text_config"), dict) else None
    for field, value in overrides.items():
        if field in out:
            target = out
        elif text is not None and field in text:
            target = text
        elif field in text_attrs:
            target = text if text is not None else out
        else:
            raise SynthError(f"{repo_id}: config.json has no field {field!r} to override")
        old = target.get(field)
        if value is None:
            target.pop(field, None)
            continue
        target[field] = value
        if field == "num_hidden_layers" and isinstance(target.get("layer_types"), list) and old != value:
            pattern = target["layer_types"]
            if pattern:
                target["layer_types"] = [pattern[i % len(pattern)] for i in range(value)]
    return out


def tokenizer_size(tokenizer_json: Path) -> int:
    """Largest token ID + 1 of a ``tokenizer.json`` (model vocabulary and added tokens)."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = (data.get("model") or {}).get("vocab")
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab or ())))
    ids += [tok["id"] for tok in data.get("added_tokens") or ()]
    return max(ids) + 1 if ids else 0


def _attr(config, name: str):
    """``config.name`` or None (some configs raise on global access to per-layer attributes)."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001 - e.g. Gemma 4's AmbiguousGlobalPerLayerAttributeError
        return None


def validate_geometry(config, repo_id: str, tokenizer_json: Path | None) -> None:
    """Geometry rules of the module docstring, on the (overridden) transformers config."""
    text = config.get_text_config()
    heads = _attr(text, "num_attention_heads")
    kv = _attr(text, "num_key_value_heads")
    if heads and kv and heads % kv:
        raise SynthError(f"{repo_id}: num_key_value_heads={kv} must divide num_attention_heads={heads} "
                         f"(--kv-heads / --heads)")
    hidden = _attr(text, "hidden_size")
    if heads and hidden and _attr(text, "head_dim") is None and hidden % heads:
        raise SynthError(f"{repo_id}: hidden_size={hidden} is not divisible by num_attention_heads={heads} "
                         f"and the config has no explicit head_dim")
    vocab = _attr(text, "vocab_size")
    if vocab is None:
        return
    if tokenizer_json is not None:
        size = tokenizer_size(tokenizer_json)
        if vocab < size:
            raise SynthError(f"{repo_id}: vocab_size={vocab} is smaller than the tokenizer's {size} token IDs "
                             f"(tokenizer.json); token IDs would index past the embedding (--vocab >= {size})")
    for cfg in {id(config): config, id(text): text}.values():
        for field in _SPECIAL_ID_FIELDS:
            value = _attr(cfg, field)
            for tid in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(tid, int) and tid >= vocab:
                    raise SynthError(f"{repo_id}: {field}={tid} is outside vocab_size={vocab}")


# -- the tensor plan -------------------------------------------------------------------------------

def _config_dtype(config):
    import torch

    for cfg in (config, config.get_text_config()):
        dtype = _attr(cfg, "dtype") or _attr(cfg, "torch_dtype")
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, None)
        if isinstance(dtype, torch.dtype):
            return dtype
    return torch.float32


def _meta_model(config, repo_id: str):
    """The transformers model of ``config`` on the meta device: the class its ``architectures``
    names where transformers has it (the class upstream checkpoints are saved from), else
    ``AutoModelForCausalLM``."""
    import torch
    import transformers

    dtype = _config_dtype(config)
    archs = getattr(config, "architectures", None) or []
    cls = getattr(transformers, archs[0], None) if archs else None
    try:
        with torch.device("meta"):
            if cls is not None and isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
                return cls._from_config(config, dtype=dtype)
            return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    except (ValueError, KeyError, ImportError) as exc:
        raise SynthError(f"{repo_id}: transformers {transformers.__version__} cannot build model_type "
                         f"{getattr(config, 'model_type', None)!r} (architectures {archs}): {exc}") from None


def init_std(config) -> float:
    return float(_attr(config.get_text_config(), "initializer_range") or 0.02)


def init_rule(name: str, std: float) -> tuple[str, float]:
    if name.endswith("norm.weight"):
        return "ones", 1.0
    if name.endswith("bias"):
        return "zeros", 0.0
    return "normal", std


def plan_tensors(config, repo_id: str = "checkpoint") -> list[TensorSpec]:
    """Every tensor ``save_pretrained`` would write for ``config``, in its order, with value rules."""
    quant = _attr(config, "quantization_config")
    if quant:
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", quant)
        raise SynthError(f"{repo_id}: config.json declares quantization_config (quant_method {method!r}); "
                         f"synth-checkpoint writes unquantized weights only: override quantization_config=null "
                         f"(--set quantization_config=null) for an unquantized checkpoint of the same geometry")
    model = _meta_model(config, repo_id)
    state = model.state_dict()
    for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
        state.pop(key, None)
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = remove_tied_weights_from_state_dict(state, model)
    state = revert_weight_conversion(model, state)
    std = init_std(config)
    specs = []
    for name, tensor in state.items():
        init, value = init_rule(name, std)
        specs.append(TensorSpec(name, tuple(int(d) for d in tensor.shape), tensor.dtype, init, value))
    return specs


# -- writing ---------------------------------------------------------------------------------------

def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _prepare_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise SynthError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise SynthError(f"{out} is not empty; pass --force (force=True) to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)


def _move_into_place(staging: Path, out: Path) -> None:
    aside = None
    if out.is_dir():
        if any(out.iterdir()):
            aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent)) / "old"
            os.rename(out, aside)
        else:
            out.rmdir()
    os.rename(staging, out)
    if aside is not None:
        shutil.rmtree(aside.parent, ignore_errors=True)


def write_weights(folder: Path, specs: list[TensorSpec], seed: int, shard_size: int,
                  progress: bool = True, desc: str = "weights", workers: int | None = None) -> dict[str, str]:
    """Write the shards one at a time (and the index when sharded); returns file name -> SHA-256."""
    from tqdm.auto import tqdm

    workers = writer.default_workers() if workers is None else workers
    shards = writer.split_shards(specs, shard_size)
    names = writer.shard_filenames(len(shards))
    total = sum(s.nbytes for s in specs)
    hashes: dict[str, str] = {}
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=not progress) as bar:
        for fname, shard in zip(names, shards):
            hashes[fname] = writer.write_shard(folder / fname, shard, seed, metadata={"format": "pt"},
                                               on_bytes=bar.update, workers=workers)
    if len(shards) > 1:
        index = writer.write_index(folder, shards, names)
        hashes[index.name] = _sha256_file(index)
    return hashes


def _load_config(folder: Path, repo_id: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SynthError(f"{repo_id}: transformers cannot read the config.json: {exc}") from None


def synthesize_checkpoint(
    repo_id: str,
    out: str | os.PathLike,
    seed: int = 0,
    overrides: Mapping[str, Any] | None = None,
    hub_cache: str | os.PathLike | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    *,
    revision: str | None = None,
    force: bool = False,
    progress: bool = True,
    workers: int | None = None,
) -> Path:
    """Write a checkpoint folder for ``repo_id`` at ``out`` (see the module docstring); returns ``out``.

    ``repo_id`` is a hub repository in the offline cache ``hub_cache`` (default
    :func:`ignition.hub.default_hub_cache`) or :data:`EMBEDDED_REPO_ID`, which needs no cache.
    The folder is built in a temporary sibling and renamed into place; a non-empty ``out`` is
    replaced only with ``force``.  ``workers`` threads generate weight blocks (default: the CPU
    count, at most 8); the bytes do not depend on it.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SynthError(f"seed must be a non-negative integer, got {seed!r}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size <= 0:
        raise SynthError(f"shard_size must be a positive number of bytes, got {shard_size!r}")
    out = Path(out).absolute()
    _prepare_out(out, force)
    fields = normalize_overrides(overrides)
    source = _embedded_source() if repo_id == EMBEDDED_REPO_ID else _hub_source(repo_id, hub_cache, revision)

    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.synth-", dir=out.parent))
    try:
        os.chmod(staging, 0o755)
        config_bytes = source.config_bytes
        (staging / "config.json").write_bytes(config_bytes)
        config = _load_config(staging, repo_id)
        if fields:
            attrs = set(config.get_text_config().to_dict())
            config_bytes = _dump_json(apply_overrides(json.loads(config_bytes), fields, attrs, repo_id))
            (staging / "config.json").write_bytes(config_bytes)
            config = _load_config(staging, repo_id)
        validate_geometry(config, repo_id, source.files.get("tokenizer.json"))
        specs = plan_tensors(config, repo_id)

        hashes = {"config.json": hashlib.sha256(config_bytes).hexdigest()}
        for name, path in sorted(source.files.items()):
            shutil.copyfile(path, staging / name)
            hashes[name] = _sha256_file(staging / name)
        hashes.update(write_weights(staging, specs, seed, shard_size, progress, desc=f"synth {repo_id}",
                                    workers=workers))
        manifest = {
            "checkpoint_format": CHECKPOINT_FORMAT,
            "values": {"format": writer.VALUE_FORMAT, "block_elements": writer.BLOCK_ELEMENTS,
                       "rules": "norm.weight: ones; *bias: zeros; else normal(0, std) in fp32, cast",
                       "std": init_std(config)},
            "note": "synthetic checkpoint: seeded random weights, not a trained model",
            "source": {"repo_id": source.repo_id, "revision": source.revision, "copied": sorted(source.files)},
            "seed": seed,
            "overrides": fields,
            "tensors": len(specs),
            "parameters": sum(s.numel for s in specs),
            "weight_bytes": sum(s.nbytes for s in specs),
            "files": dict(sorted(hashes.items())),
        }
        (staging / MANIFEST).write_bytes(_dump_json(manifest))
        _move_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def read_manifest(folder: str | os.PathLike) -> dict:
    return json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))


def verify_checkpoint(folder: str | os.PathLike) -> bool:
    """Whether every file the manifest lists is present with its recorded SHA-256."""
    folder = Path(folder)
    try:
        files = read_manifest(folder)["files"]
        return bool(files) and all(_sha256_file(folder / name) == digest for name, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


# -- the embedded default --------------------------------------------------------------------------

def embedded_build_key() -> str:
    """Hash of everything the embedded default checkpoint depends on (its cache folder name)."""
    import torch
    import transformers

    from ignition import embedded

    h = hashlib.sha256()
    h.update(f"flare-checkpoint/{CHECKPOINT_FORMAT}/{writer.VALUE_FORMAT}/torch={torch.__version__}/"
             f"transformers={transformers.__version__}/embedded={embedded.build_key()}\n".encode())
    for module in (writer, sys.modules[__name__]):
        data = Path(module.__file__).read_bytes()
        h.update(f"{Path(module.__file__).name}:{len(data)}\n".encode())
        h.update(data)
    return h.hexdigest()[:16]


def checkpoints_root() -> Path:
    base = os.environ.get("FLARE_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "flare") / "checkpoints"


def embedded_default_checkpoint(cache: bool = True, root: str | os.PathLike | None = None,
                                progress: bool = False) -> Path:
    """The embedded default checkpoint folder (tiny Qwen3 geometry, the project's tokenizer).

    With ``cache`` (default) it is built once into ``root/embedded-default-<key>`` (``root``
    defaults to ``$FLARE_CACHE/checkpoints``, else ``~/.cache/flare/checkpoints``), keyed by
    :func:`embedded_build_key`, verified against its manifest on every call and rebuilt when
    damaged; concurrent builders produce identical bytes and the first rename wins.  Without
    ``cache`` a fresh folder is built under a new temporary directory (the caller owns it).
    """
    if not cache:
        return synthesize_checkpoint(EMBEDDED_REPO_ID, Path(tempfile.mkdtemp(prefix="flare-embedded-")) / "checkpoint",
                                     progress=progress)
    root = Path(root) if root is not None else checkpoints_root()
    final = root / f"embedded-default-{embedded_build_key()}"
    from ignition.cached_build import build_cached

    return build_cached(final, lambda tmp: synthesize_checkpoint(EMBEDDED_REPO_ID, tmp / "checkpoint",
                                                                 progress=progress), verify_checkpoint)
