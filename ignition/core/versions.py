"""Core format versions: what each version means, how older ones are read, and what v1 requires.

A core keeps the semantics it was prepared with. Loading reads ``format_version`` first:

* a version in :data:`FORMAT_VERSIONS` is supported. Its ``absent_defaults`` are filled into fields the
  core leaves absent (the defaults *of that version*, frozen here, never the dataclass defaults of
  the code doing the loading), then each ``upgrade`` step up to :data:`CURRENT_FORMAT_VERSION` rewrites
  the manifest into current semantics (for example a future v2 that splits a field would carry a
  ``v1 -> v2`` step that fills the new fields from the old one);
* a version in :data:`RETIRED_FORMAT_VERSIONS`, newer than the current one, or 0 (not written) is rejected
  with :class:`UnsupportedCoreVersion` naming the version.

Only version 1 exists; its table still spells out its absent-field defaults, so the mechanism is exercised
(``tests/core/test_versions.py`` also runs a two-version chain through :func:`migrate`).

Changing the format: never reuse a field number; a new field whose absence must mean something gets an
``absent_defaults`` entry in the *new* version and an ``upgrade`` step from the previous one; a field
whose meaning changes bumps the version. Bump :data:`CURRENT_FORMAT_VERSION` and add the entry here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from google.protobuf.message import Message

from . import core_pb2 as pb
from .errors import CoreFormatError, UnsupportedCoreVersion

CURRENT_FORMAT_VERSION = 1


@dataclass(frozen=True)
class FormatVersion:
    number: int
    summary: str
    #: dotted field path -> value used when a core of this version leaves the field absent
    absent_defaults: Mapping[str, Any] = field(default_factory=dict)
    #: rewrites a manifest of this version into the next version's semantics (None for the current one)
    upgrade: Callable[[pb.Core], None] | None = None


FORMAT_VERSIONS: dict[int, FormatVersion] = {
    1: FormatVersion(
        1,
        "first format: jinja-text renderer, bf16 / fp8-block weights, paged KV, manifest SHA-256 trailer",
        absent_defaults={
            # Version 1 knows one renderer; a v1 core that does not name one uses it.
            "frontend.renderer": pb.RENDERER_JINJA_TEXT,
            # FrontendSpec's defaults as of format version 1 (frozen: later code changes do not apply).
            "frontend.content_format": "string",
            "frontend.developer_role": False,
            "frontend.reasoning_field": "reasoning_content",
            "frontend.text_joiner": "\n",
            "frontend.renders_tools": True,
            "frontend.tool_arguments": "object",
            "frontend.assistant_null_content": False,
        },
    ),
}
#: versions once written and no longer readable: version -> why (the error quotes it)
RETIRED_FORMAT_VERSIONS: dict[int, str] = {}

#: Fields a current-version manifest must have (checked after migration). A message or an ``optional``
#: scalar must be present; a plain scalar non-zero / non-empty; a repeated field non-empty.
REQUIRED_FIELDS = (
    "recipe.name", "recipe.version", "source.repo_id",
    "geometry.architecture", "geometry.vocab_size", "geometry.hidden_size", "geometry.num_layers",
    "geometry.num_attention_heads", "geometry.num_kv_heads", "geometry.head_dim", "geometry.intermediate_size",
    "geometry.max_position_embeddings", "geometry.rope_theta", "geometry.rms_norm_eps",
    "geometry.tie_word_embeddings",
    "weights.format", "weights.files", "weights.tensors",
    "kv_layout.page_size", "kv_layout.dtype", "kv_layout.layout",
    "graph_catalog.decode_capacities", "graph_catalog.prefill_chunk_sizes",
    "frontend.renderer", "frontend.template_file", "frontend.tokenizer_file", "frontend.eos_token_ids",
    "frontend.content_format", "frontend.reasoning_field", "frontend.renders_tools", "frontend.tool_arguments",
    "frontend.assistant_null_content", "frontend.developer_role", "frontend.text_joiner",
    "sampling.temperature", "sampling.top_p", "sampling.top_k", "sampling.min_p", "sampling.presence_penalty",
    "sampling.frequency_penalty", "sampling.repetition_penalty", "sampling.citation", "sampling.verified",
    "created.tool_version", "created.utc",
)


def _is_repeated(fd) -> bool:
    flag = getattr(fd, "is_repeated", None)  # protobuf >= 6.31; ``label`` is gone in 7.x
    return bool(flag) if flag is not None else fd.label == fd.LABEL_REPEATED


def _has_presence(fd) -> bool:
    if fd.message_type is not None:
        return True
    return bool(getattr(fd, "has_presence", False)) or fd.containing_oneof is not None


def field_present(msg: Message, path: str) -> bool:
    *parents, last = path.split(".")
    for name in parents:
        if not msg.HasField(name):
            return False
        msg = getattr(msg, name)
    fd = msg.DESCRIPTOR.fields_by_name[last]
    if _is_repeated(fd):
        return len(getattr(msg, last)) > 0
    if _has_presence(fd):
        return msg.HasField(last)
    return getattr(msg, last) != fd.default_value


def _set_default(msg: Message, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for name in parents:
        msg = getattr(msg, name)  # reading a sub-message field and setting into it creates it
    setattr(msg, last, value)


def migrate(core: pb.Core, *, versions: Mapping[int, FormatVersion] = FORMAT_VERSIONS,
            current: int = CURRENT_FORMAT_VERSION, retired: Mapping[int, str] = RETIRED_FORMAT_VERSIONS,
            path=None) -> int:
    """Bring ``core`` (in place) to ``current`` semantics; returns the version it was written with."""
    written = core.format_version
    if written == 0:
        raise UnsupportedCoreVersion(0, "format_version is missing (0): not a core manifest, or one cut short",
                                     path)
    if written in retired:
        raise UnsupportedCoreVersion(written, f"core format version {written} is no longer supported: "
                                     f"{retired[written]}; re-export the core", path)
    if written not in versions:
        newer = " (written by a newer exporter)" if written > current else ""
        raise UnsupportedCoreVersion(written, f"core format version {written} is not supported{newer}; this "
                                     f"runtime reads versions {sorted(versions)}", path)
    for field_path, value in versions[written].absent_defaults.items():
        if not field_present(core, field_path):
            _set_default(core, field_path, value)
    for n in range(written, current):
        step = versions[n].upgrade
        if step is None or n + 1 not in versions:
            raise UnsupportedCoreVersion(written, f"no migration from core format version {n} to {n + 1}", path)
        step(core)
        core.format_version = n + 1
        for field_path, value in versions[n + 1].absent_defaults.items():
            if not field_present(core, field_path):
                _set_default(core, field_path, value)
    return written


def check_required(core: pb.Core, path=None) -> None:
    missing = [p for p in REQUIRED_FIELDS if not field_present(core, p)]
    if missing:
        raise CoreFormatError(f"required manifest fields missing or empty: {', '.join(missing)}", path)
