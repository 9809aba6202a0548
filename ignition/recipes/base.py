"""What a recipe declares: its frontend contract, template variants, checkpoints and capacities."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAMPLING_PARAMS = (
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
)
#: Neutral values: filters off, penalties neutral, plain softmax.
NEUTRAL_SAMPLING = {
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
}


@dataclass(frozen=True)
class SamplingDefaults:
    """Complete defaults for the default serving mode, cited from the model card.

    ``ranges`` holds inclusive ranges the author recommends; request values are clamped into a
    range, and a parameter without a range is fixed at its default.  The seed is request-controlled.
    """

    values: dict[str, float]
    citation: str
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    verified: bool = True  # False where the card is silent or unverified (neutral values chosen)

    def __post_init__(self):
        missing = [p for p in SAMPLING_PARAMS if p not in self.values]
        extra = [p for p in self.values if p not in SAMPLING_PARAMS]
        if missing or extra:
            raise ValueError(f"sampling defaults must name exactly {SAMPLING_PARAMS}: missing {missing}, extra {extra}")
        for name, (lo, hi) in self.ranges.items():
            if name not in SAMPLING_PARAMS or not lo <= self.values[name] <= hi:
                raise ValueError(f"sampling range for {name!r} must contain its default {self.values.get(name)}")

    def resolve(self, request: dict[str, Any]) -> dict[str, Any]:
        from helios.frontend.conversation import FrontendError

        out: dict[str, Any] = dict(self.values)
        for name, value in request.items():
            if name == "seed":
                if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                    raise FrontendError("seed", f"must be an integer, got {value!r}")
                continue
            if name not in SAMPLING_PARAMS:
                raise FrontendError(name, "is not a supported sampling option")
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise FrontendError(name, f"must be a number, got {value!r}")
            if name in self.ranges:
                lo, hi = self.ranges[name]
                out[name] = type(self.values[name])(min(max(value, lo), hi))
        out["seed"] = request.get("seed")
        return out


@dataclass(frozen=True)
class TemplateVariant:
    """One annotated chat template: a patch asset over a pinned source."""

    name: str
    patch: str  # file name under the recipe's assets/
    hidden_sizes: tuple[int, ...] = ()  # model hidden sizes this variant serves (selection by geometry)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint the recipe serves (``examples.py``)."""

    name: str  # short example name: "default", "tiny", ...
    repo_id: str
    variant: str  # template variant name
    sampling: SamplingDefaults
    hidden_size: int | None = None
    tokenizer_class: str = "auto"  # reference loader in tests: "auto" | "gemma"
    notes: str = ""


@dataclass(frozen=True)
class FrontendSpec:
    """How normalized conversations are lowered for this recipe's templates."""

    content_format: str = "string"  # "string" (text joined) | "blocks" (OpenAI-style list of typed items)
    developer_role: bool = False  # the template renders "developer" itself; otherwise lowered to "system"
    thinking_kwarg: str | None = "enable_thinking"  # template variable that switches reasoning; None: no switch
    default_thinking: bool | None = True
    image_token: str | None = None  # placeholder token expanded to image tokens
    reasoning_field: str = "reasoning_content"
    text_joiner: str = "\n"
    renders_tools: bool = True  # False: the template never renders tool definitions; requests with tools are rejected
    # "object": tool-call arguments reach the template as a mapping; "json": as a JSON string
    # (json.dumps, ensure_ascii=False), for templates that concatenate them as text.
    tool_arguments: str = "object"
    # An assistant message without content blocks (the request's null content) lowers to None rather
    # than ""/[], for templates that branch on ``content is none`` (e.g. tool-call-only turns).
    assistant_null_content: bool = False


@dataclass(frozen=True)
class Recipe:
    name: str
    architectures: tuple[str, ...]
    frontend: FrontendSpec
    variants: tuple[TemplateVariant, ...]
    checkpoints: tuple[Checkpoint, ...]
    capacities: tuple[int, ...] = (1, 4)
    # How the templates' assistant tool calls look in a reply: "qwen" | "gemma" | "deepseek" | None (no
    # parsing; replies stay text). A Recipe field rather than a FrontendSpec one: FrontendSpec is mapped
    # field-for-field onto core.proto's Frontend message, and core_pb2.py could not be regenerated here
    # (protoc 3.21 unavailable), so the server derives it from the core's recipe name at load time.
    tool_call_format: str | None = None
    assets_dir: Path = Path(".")
    notes: str = ""

    def variant(self, name: str) -> TemplateVariant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"recipe {self.name!r} has no template variant {name!r} (has {[v.name for v in self.variants]})")

    def checkpoint(self, ref: str) -> Checkpoint:
        for c in self.checkpoints:
            if ref in (c.name, c.repo_id):
                return c
        raise KeyError(f"recipe {self.name!r} declares no checkpoint {ref!r} (has {[c.repo_id for c in self.checkpoints]})")

    def variant_for_hidden_size(self, hidden_size: int) -> TemplateVariant:
        matches = [v for v in self.variants if hidden_size in v.hidden_sizes]
        if len(matches) != 1:
            raise ValueError(f"recipe {self.name!r}: no template variant declared for hidden size {hidden_size}")
        return matches[0]

    def patch_path(self, variant: str) -> Path:
        return self.assets_dir / self.variant(variant).patch
