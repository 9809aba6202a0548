"""Patch assets: mark insertions into a pinned upstream chat template, without its text.

An asset ``ignition/recipes/<recipe>/assets/chat_template.<variant>.patch.json`` holds the pinned
source location (hub repo id, revision, file name and, for ``tokenizer_config.json``, the JSON
key), the SHA-256 of the source template bytes, the SHA-256 of the annotated result and the
insertions (byte offset into the source + mark text).  Preparation reads the source from the
checkpoint folder or the hub cache, rejects changed bytes, applies the insertions and checks
the result.  Removing the marks reproduces the source exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .marks import MARK_TAG

FORMAT = 1


class TemplateSourceMismatch(ValueError):
    def __init__(self, where: str, expected: str, actual: str):
        super().__init__(
            f"chat template source {where} changed: expected sha256 {expected}, got {actual}; "
            "the pinned annotations do not apply to these bytes"
        )
        self.expected, self.actual = expected, actual


class TemplateSourceMissing(FileNotFoundError):
    pass


def sha256(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Insertion:
    offset: int  # UTF-8 byte offset into the source template
    text: str


@dataclass(frozen=True)
class TemplateSource:
    filename: str
    repo_id: str | None = None  # None for project-embedded templates
    revision: str | None = None
    json_key: str | None = None  # e.g. "chat_template" inside tokenizer_config.json
    embedded: str | None = None  # repository-relative path of a project-owned template

    def describe(self) -> str:
        if self.embedded:
            return f"embedded:{self.embedded}"
        key = f"#{self.json_key}" if self.json_key else ""
        return f"{self.repo_id}@{self.revision}/{self.filename}{key}"


@dataclass(frozen=True)
class TemplatePatch:
    source: TemplateSource
    source_sha256: str
    result_sha256: str
    insertions: tuple[Insertion, ...] = field(default_factory=tuple)

    # -- serialization -------------------------------------------------------------------------
    def to_json(self) -> str:
        src = {k: v for k, v in vars(self.source).items() if v is not None}
        doc = {
            "format": FORMAT,
            "source": src,
            "source_sha256": self.source_sha256,
            "result_sha256": self.result_sha256,
            "insertions": [{"offset": i.offset, "text": i.text} for i in self.insertions],
        }
        return json.dumps(doc, indent=2) + "\n"

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TemplatePatch":
        doc = json.loads(Path(path).read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"{path}: unsupported patch format {doc.get('format')!r} (expected {FORMAT})")
        return cls(
            source=TemplateSource(**doc["source"]),
            source_sha256=doc["source_sha256"],
            result_sha256=doc["result_sha256"],
            insertions=tuple(Insertion(int(i["offset"]), i["text"]) for i in doc["insertions"]),
        )

    # -- application ---------------------------------------------------------------------------
    def verify_source(self, source: str) -> None:
        actual = sha256(source)
        if actual != self.source_sha256:
            raise TemplateSourceMismatch(self.source.describe(), self.source_sha256, actual)

    def apply(self, source: str) -> str:
        """Verify the source, insert the marks, verify the annotated result."""
        self.verify_source(source)
        data = source.encode("utf-8")
        out, last = [], 0
        for ins in sorted(self.insertions, key=lambda i: i.offset):
            if not 0 <= ins.offset <= len(data) or ins.offset < last:
                raise ValueError(f"insertion offset {ins.offset} outside the source ({len(data)} bytes)")
            out.append(data[last : ins.offset])
            out.append(ins.text.encode("utf-8"))
            last = ins.offset
        out.append(data[last:])
        annotated = b"".join(out)
        actual = sha256(annotated)
        if actual != self.result_sha256:
            raise TemplateSourceMismatch(f"{self.source.describe()} (annotated result)", self.result_sha256, actual)
        return annotated.decode("utf-8")


def author(source_text: str, annotated: str, source: TemplateSource) -> TemplatePatch:
    """Compute a patch from an annotated copy (marks written by hand) and the upstream source."""
    insertions, pieces, removed = [], [], 0
    last = 0
    for m in MARK_TAG.finditer(annotated):
        pieces.append(annotated[last : m.start()])
        byte_offset = len(annotated[: m.start()].encode("utf-8")) - removed
        insertions.append(Insertion(byte_offset, m.group(0)))
        removed += len(m.group(0).encode("utf-8"))
        last = m.end()
    pieces.append(annotated[last:])
    stripped = "".join(pieces)
    if stripped != source_text:
        a, b = stripped.encode(), source_text.encode()
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        raise ValueError(
            f"the annotated copy differs from the source outside its marks (first difference at source byte {i}: "
            f"{b[max(0, i - 20) : i + 20]!r} vs {a[max(0, i - 20) : i + 20]!r})"
        )
    if not insertions:
        raise ValueError("the annotated copy holds no {% mark %} tags")
    return TemplatePatch(source, sha256(source_text), sha256(annotated), tuple(insertions))


def read_source_text(source: TemplateSource, checkpoint_dir: str | os.PathLike | None = None,
                     hub_cache: str | os.PathLike | None = None, repo_root: str | os.PathLike | None = None) -> str:
    """The raw template text the patch applies to, from the checkpoint folder or the hub cache (offline)."""
    if source.embedded:
        root = Path(repo_root) if repo_root else Path(__file__).resolve().parents[2]
        return (root / source.embedded).read_text(encoding="utf-8")
    path = None
    if checkpoint_dir is not None:
        candidate = Path(checkpoint_dir) / source.filename
        if not candidate.is_file():
            raise TemplateSourceMissing(f"{candidate} not found (the pinned template source is {source.describe()})")
        path = candidate
    else:
        path = hub_file(source.repo_id, source.filename, source.revision, hub_cache)
    raw = Path(path).read_bytes()
    if source.json_key:
        value = json.loads(raw).get(source.json_key)
        if not isinstance(value, str):
            raise TemplateSourceMissing(f"{path} has no string {source.json_key!r}")
        return value
    return raw.decode("utf-8")


def hub_file(repo_id: str, filename: str, revision: str | None = None,
             hub_cache: str | os.PathLike | None = None) -> Path:
    """A file of a hub repository from the local cache only (never the network)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=hub_cache,
                                    local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as exc:
        raise TemplateSourceMissing(
            f"{repo_id}@{revision or 'main'}/{filename} is not in the hub cache {hub_cache or '(default)'}"
        ) from exc
