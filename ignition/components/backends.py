"""Registry of attention and sampling backends, chosen by GPU class, logged, never silently swapped.

Each :class:`Backend` states its kind, the GPU classes it runs on (``conformance.gpu.GPU_CLASSES``),
its dtypes, its features and what it needs to import.  Availability is probed lazily -- the first time
a selection asks -- so importing this module never imports flashinfer, b12x or triton.

:func:`select` (``kind``, ``gpu_class``, ``requirements``, ``prefer``):

- ``prefer`` names a backend: it is returned if it supports the GPU class, dtype and features and its
  probe passes; otherwise :class:`BackendUnavailable` says everything that is missing.  There is no
  fallback: another backend has other numerics.
- no preference: the highest-priority backend that qualifies is chosen and every skipped candidate is
  logged with its reason.  This is for *preparation*: the chosen name is meant to be recorded in the
  exported core and passed back as ``prefer`` at load, so a serving machine that lacks it fails loudly.

Every choice is logged at INFO on ``ignition.components.backends`` with the reason.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

logger = logging.getLogger(__name__)

__all__ = ["Backend", "BackendRegistry", "BackendUnavailable", "Requirements", "REGISTRY", "select",
           "get_backend", "KINDS", "GPU_CLASSES", "ATTENTION_FEATURES", "SAMPLING_FEATURES"]

KINDS = ("attention", "sampling")
GPU_CLASSES = ("cpu", "sm90", "sm100", "sm120", "sm121")  # conformance/gpu.py detect_gpu_class
ATTENTION_FEATURES = frozenset({"paged_decode", "chunked_prefill", "gqa", "sliding_window", "softcap",
                                "fp8_kv", "capturable"})
SAMPLING_FEATURES = frozenset({"greedy", "temperature", "top_k", "top_p", "min_p", "penalties",
                               "per_row_seed", "inactive_rows", "capturable"})


class BackendUnavailable(RuntimeError):
    """The requested backend (or any backend, without a preference) cannot serve the requirements."""

    def __init__(self, backend: str, kind: str, gpu_class: str, missing: list[str]):
        self.backend, self.kind, self.gpu_class, self.missing = backend, kind, gpu_class, list(missing)
        super().__init__(f"{kind} backend {backend!r} unavailable on {gpu_class}: " + "; ".join(missing))


def _dtype_name(d: Any) -> str:
    return str(d).removeprefix("torch.")


@dataclass(frozen=True)
class Requirements:
    """What the caller needs: a dtype (``torch.bfloat16`` or ``"bfloat16"``) and feature names."""

    dtype: Any = None
    features: frozenset[str] = frozenset()

    @classmethod
    def of(cls, value: "Requirements | Mapping[str, Any] | Iterable[str] | None") -> "Requirements":
        if value is None:
            return cls()
        if isinstance(value, Requirements):
            return value
        if isinstance(value, Mapping):
            return cls(dtype=value.get("dtype"), features=frozenset(value.get("features", ())))
        return cls(features=frozenset(value))


@dataclass(frozen=True)
class Backend:
    """One implementation of one kind.  ``requires``: modules that must import; ``entry``: optional
    ``"module:attr"`` of the implementation (imported by the probe and by :meth:`load`, never before);
    ``probe``: optional extra check returning ``None`` when usable or the reason it is not."""

    name: str
    kind: str
    gpu_classes: frozenset[str]
    dtypes: frozenset[str]
    features: frozenset[str]
    priority: int = 0
    requires: tuple[str, ...] = ()
    entry: str | None = None
    probe: Callable[[str], str | None] | None = None
    numerics: str = ""  # what differs from other backends of the kind (reported, never assumed equal)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"backend {self.name!r}: kind must be one of {KINDS}, not {self.kind!r}")
        unknown = set(self.gpu_classes) - set(GPU_CLASSES)
        if unknown:
            raise ValueError(f"backend {self.name!r}: unknown GPU classes {sorted(unknown)}")
        vocab = ATTENTION_FEATURES if self.kind == "attention" else SAMPLING_FEATURES
        if set(self.features) - vocab:
            raise ValueError(f"backend {self.name!r}: unknown {self.kind} features {sorted(set(self.features) - vocab)}")

    def static_gaps(self, gpu_class: str, req: Requirements) -> list[str]:
        """What the declaration alone rules out (no imports)."""
        gaps = []
        if gpu_class not in self.gpu_classes:
            gaps.append(f"GPU class {gpu_class} not supported (supports {', '.join(sorted(self.gpu_classes))})")
        if req.dtype is not None and _dtype_name(req.dtype) not in self.dtypes:
            gaps.append(f"dtype {_dtype_name(req.dtype)} not supported (supports {', '.join(sorted(self.dtypes))})")
        missing = sorted(set(req.features) - self.features)
        if missing:
            gaps.append(f"features not supported: {', '.join(missing)}")
        return gaps

    def load(self) -> Any:
        """Import and return the implementation named by ``entry``."""
        if self.entry is None:
            raise BackendUnavailable(self.name, self.kind, "?", ["no implementation entry registered"])
        module, _, attr = self.entry.partition(":")
        obj = importlib.import_module(module)
        return getattr(obj, attr) if attr else obj


@dataclass
class BackendRegistry:
    backends: dict[tuple[str, str], Backend] = field(default_factory=dict)
    _probed: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)

    def register(self, backend: Backend) -> Backend:
        key = (backend.kind, backend.name)
        if key in self.backends:
            raise ValueError(f"{backend.kind} backend {backend.name!r} is already registered")
        self.backends[key] = backend
        return backend

    def get(self, kind: str, name: str) -> Backend:
        try:
            return self.backends[(kind, name)]
        except KeyError:
            names = sorted(n for k, n in self.backends if k == kind)
            raise BackendUnavailable(name, kind, "?", [f"no such {kind} backend (registered: {names})"]) from None

    def of_kind(self, kind: str) -> list[Backend]:
        """Backends of ``kind``, highest priority first."""
        return sorted((b for (k, _), b in self.backends.items() if k == kind), key=lambda b: (-b.priority, b.name))

    def probe(self, backend: Backend, gpu_class: str) -> list[str]:
        """Runtime gaps (imports, entry, custom probe); cached per (kind, name, GPU class)."""
        key = (backend.kind, backend.name, gpu_class)
        if key not in self._probed:
            gaps = []
            for module in backend.requires:
                try:
                    importlib.import_module(module)
                except Exception as exc:  # ImportError, or a broken install raising anything
                    gaps.append(f"module {module!r} not importable ({type(exc).__name__}: {exc})")
            if not gaps and backend.entry is not None:
                try:
                    backend.load()
                except Exception as exc:
                    gaps.append(f"implementation {backend.entry!r} not loadable ({type(exc).__name__}: {exc})")
            if not gaps and backend.probe is not None:
                reason = backend.probe(gpu_class)
                if reason:
                    gaps.append(reason)
            self._probed[key] = gaps
        return list(self._probed[key])

    def gaps(self, backend: Backend, gpu_class: str, requirements: Any = None) -> list[str]:
        """Everything that keeps ``backend`` from serving; empty when usable.  Imports only when the
        declaration fits."""
        static = backend.static_gaps(gpu_class, Requirements.of(requirements))
        return static or self.probe(backend, gpu_class)

    def select(self, kind: str, gpu_class: str | None = None, requirements: Any = None,
               prefer: str | None = None) -> Backend:
        """The backend for ``kind`` on ``gpu_class`` (default: the detected class); see module doc."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        if gpu_class is None:
            from conformance.gpu import detect_gpu_class

            gpu_class = detect_gpu_class()
        req = Requirements.of(requirements)
        wanted = _describe(req)
        if prefer is not None:
            backend = self.get(kind, prefer)
            missing = backend.static_gaps(gpu_class, req) + self.probe(backend, gpu_class)
            if missing:
                logger.info("%s backend %r refused on %s%s: %s", kind, prefer, gpu_class, wanted, "; ".join(missing))
                raise BackendUnavailable(prefer, kind, gpu_class, missing)
            logger.info("%s backend %r selected on %s%s: preferred by the caller", kind, prefer, gpu_class, wanted)
            return backend
        skipped = []
        for backend in self.of_kind(kind):
            missing = self.gaps(backend, gpu_class, req)
            if not missing:
                why = f"highest-priority qualifying backend (priority {backend.priority})"
                if skipped:
                    why += "; skipped " + "; ".join(skipped)
                logger.info("%s backend %r selected on %s%s: %s", kind, backend.name, gpu_class, wanted, why)
                return backend
            skipped.append(f"{backend.name} ({'; '.join(missing)})")
        logger.info("no %s backend on %s%s: %s", kind, gpu_class, wanted, "; ".join(skipped))
        raise BackendUnavailable("<any>", kind, gpu_class, skipped or ["no backend registered"])


def _describe(req: Requirements) -> str:
    parts = []
    if req.dtype is not None:
        parts.append(f"dtype {_dtype_name(req.dtype)}")
    if req.features:
        parts.append("features " + ",".join(sorted(req.features)))
    return f" ({', '.join(parts)})" if parts else ""


REGISTRY = BackendRegistry()
_FLOATS = frozenset({"float32", "bfloat16", "float16"})
_HALF = frozenset({"bfloat16", "float16"})
_GPU = frozenset({"sm90", "sm100", "sm120", "sm121"})

# Attention.  With an entry set the probe also imports it, so a declared-but-missing implementation
# is "unavailable", not a crash.  The Triton/FlashInfer/b12x entries are added with their kernels.
REGISTRY.register(Backend(
    "torch", "attention", frozenset(GPU_CLASSES), _FLOATS,
    frozenset({"paged_decode", "chunked_prefill", "gqa", "capturable"}),
    priority=0, entry="ignition.components.attention:PyTorchPagedAttention",
    numerics="PyTorch/Inductor reference: transformers eager-path rounding, fp32 softmax"))
# "triton": ignition/components/attention.py TritonPagedAttention -- Triton flash-decoding for T == 1 (reads
# seq_lens keys only), a Triton FlashAttention-2 style prefill kernel for T > 1; "triton-decode": the same decode
# kernel with the reference (flare::paged_attention) for T > 1.  Ranked below "torch" (which qualifies wherever
# they do; the GPU matrix runs the default), so select() never picks them unless asked for by name.
REGISTRY.register(Backend(
    "triton", "attention", _GPU, _HALF,
    frozenset({"paged_decode", "chunked_prefill", "gqa", "capturable"}),
    priority=-10, requires=("triton",), entry="ignition.components.attention:TritonPagedAttention",
    numerics="decode: Triton flash-decoding, fp32 scores/softmax/P@V (probabilities not rounded to bf16), own "
             "split/reduction order; prefill (T > 1): Triton flash attention, fp32 softmax, unnormalized "
             "probabilities rounded to bf16 before P@V"))
REGISTRY.register(Backend(
    "triton-decode", "attention", _GPU, _HALF,
    frozenset({"paged_decode", "chunked_prefill", "gqa", "capturable"}),
    priority=-11, requires=("triton",), entry="ignition.components.attention:TritonDecodePagedAttention",
    numerics="decode: as 'triton'; prefill (T > 1): the torch reference (flare::paged_attention)"))
REGISTRY.register(Backend(
    "triton-unfused", "attention", _GPU, _HALF,
    frozenset({"paged_decode", "chunked_prefill", "gqa", "capturable"}),
    priority=-12, requires=("triton",), entry="ignition.components.attention:TritonUnfusedPagedAttention",
    numerics="as 'triton' (ulp-level differences on the GPU: norm sum order); a decode step's rope_write and "
             "decode attention as separate launches"))
REGISTRY.register(Backend(
    "flashinfer", "attention", frozenset({"sm90", "sm100"}), _HALF,
    frozenset({"paged_decode", "chunked_prefill", "gqa", "sliding_window", "softcap", "fp8_kv", "capturable"}),
    priority=20, requires=("flashinfer",), numerics="FlashInfer kernels: own split-KV reduction order"))
REGISTRY.register(Backend(
    "b12x", "attention", frozenset({"sm120", "sm121"}), _HALF,
    frozenset({"paged_decode", "chunked_prefill", "gqa", "fp8_kv", "capturable"}),
    priority=30, requires=("b12x",), numerics="b12x kernels and numerical policy (SM120/SM121 only)"))

# Sampling.  "torch" is ignition/components/sampling.py; FlashInfer's sampling kernels draw from a
# global Philox stream, so they do not offer per-row seeds and rank below it.
REGISTRY.register(Backend(
    "torch", "sampling", frozenset(GPU_CLASSES), frozenset({"float32"}), SAMPLING_FEATURES,
    priority=0, entry="ignition.components.sampling:sample",
    numerics="counter-hash Gumbel-max per (seed, step, token); vLLM filter order"))
REGISTRY.register(Backend(
    "flashinfer", "sampling", frozenset({"sm90", "sm100"}), frozenset({"float32"}),
    frozenset({"greedy", "temperature", "top_k", "top_p", "min_p", "capturable"}),
    priority=-10, requires=("flashinfer.sampling",), numerics="FlashInfer rejection sampling, global Philox"))


def select(kind: str, gpu_class: str | None = None, requirements: Any = None, prefer: str | None = None) -> Backend:
    """:meth:`BackendRegistry.select` on the default registry."""
    return REGISTRY.select(kind, gpu_class, requirements, prefer)


def get_backend(kind: str, name: str) -> Backend:
    return REGISTRY.get(kind, name)
