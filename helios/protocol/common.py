"""Mechanisms both protocol decoders share: shape checks, inline images, tools, tool-result order."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Iterable

from helios.frontend.conversation import FrontendError, ImageBlock, Message

IMAGE_MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
_MEDIA_ALIASES = {"image/jpg": "image/jpeg"}
_WHITESPACE = re.compile(r"\s+")


def at(path: str, key: str | int) -> str:
    """Extend a field path: ``at("messages", 2)`` -> ``messages[2]``; ``at("m", "content")`` -> ``m.content``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def expect_dict(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise FrontendError(path, f"must be an object, got {_kind(value)}")
    return value


def expect_list(value: Any, path: str, *, nonempty: bool = False) -> list:
    if not isinstance(value, list):
        raise FrontendError(path, f"must be a list, got {_kind(value)}")
    if nonempty and not value:
        raise FrontendError(path, "must not be empty")
    return value


def expect_str(value: Any, path: str, *, nonempty: bool = False) -> str:
    if not isinstance(value, str):
        raise FrontendError(path, f"must be a string, got {_kind(value)}")
    if nonempty and not value:
        raise FrontendError(path, "must not be empty")
    return value


def expect_bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise FrontendError(path, f"must be true or false, got {value!r}")
    return value


def require(obj: dict, key: str, path: str) -> Any:
    if key not in obj:
        raise FrontendError(at(path, key), "is required")
    return obj[key]


def reject_unknown(obj: dict, known: Iterable[str], path: str = "") -> None:
    """Be explicit: a field this decoder does not understand is an error, never silently dropped."""
    known = set(known)
    for key in obj:
        if key not in known:
            raise FrontendError(at(path, key), "is not a supported field")


def pick_sampling(request: dict, names: Iterable[str]) -> dict[str, Any]:
    """The sampling options the request sets (null means unset); values are checked when resolved."""
    return {n: request[n] for n in names if request.get(n) is not None}


class Images:
    """Decodes inline images, numbering them in the order the request gives them."""

    def __init__(self) -> None:
        self.count = 0

    def from_base64(self, media_type: Any, data: Any, path: str, *, hint: bool = False) -> ImageBlock:
        media = expect_str(media_type, at(path, "media_type")).strip().lower()
        media = _MEDIA_ALIASES.get(media, media)
        if media not in IMAGE_MEDIA_TYPES:
            raise FrontendError(at(path, "media_type"),
                                f"unsupported image type {media_type!r} (one of {', '.join(IMAGE_MEDIA_TYPES)})")
        try:
            raw = base64.b64decode(_WHITESPACE.sub("", expect_str(data, at(path, "data"))), validate=True)
        except (binascii.Error, ValueError):
            raise FrontendError(at(path, "data"), "is not valid base64") from None
        if not raw:
            raise FrontendError(at(path, "data"), "holds no image data")
        block = ImageBlock(media, raw, self.count, hint)
        self.count += 1
        return block

    def from_url(self, url: Any, path: str) -> ImageBlock:
        """A ``data:image/...;base64,...`` URL; remote URLs are refused, never fetched."""
        url = expect_str(url, path)
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme in ("http", "https"):
            raise FrontendError(path, "remote image URLs are not fetched; send the image inline as a "
                                      "data:image/...;base64 URL")
        if scheme != "data" or "," not in url:
            raise FrontendError(path, "must be a data:image/...;base64,... URL")
        header, payload = url[5:].split(",", 1)
        media, *params = header.split(";")
        if "base64" not in (p.strip().lower() for p in params):
            raise FrontendError(path, "data URL must be base64-encoded (data:image/...;base64,...)")
        # Errors name the URL itself: it has no media_type/data subfields.
        try:
            return self.from_base64(media, payload, path)
        except FrontendError as exc:
            raise FrontendError(path, exc.problem) from None


def check_function_tool(tool: Any, path: str, *, schema: str = "parameters", schema_required: bool = False) -> dict:
    """Validate a function definition {name, description?, <schema>} (``schema`` names the JSON-schema field)."""
    tool = expect_dict(tool, path)
    expect_str(require(tool, "name", path), at(path, "name"), nonempty=True)
    if tool.get("description") is not None:
        expect_str(tool["description"], at(path, "description"))
    if schema_required:
        require(tool, schema, path)
    if schema_required or tool.get(schema) is not None:
        expect_dict(tool[schema], at(path, schema))
    return tool


def order_tool_results(messages: list[Message]) -> list[Message]:
    """Reorder each run of tool messages after an assistant's tool calls into the calls' order.

    Results are matched by ``tool_call_id``; unmatched results keep their relative order at the end
    of the run.  Images travel inside their message, so their ``image_index`` (request order) stays.
    """
    out: list[Message] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        out.append(m)
        i += 1
        if m.role != "assistant" or not m.tool_calls:
            continue
        j = i
        while j < len(messages) and messages[j].role == "tool":
            j += 1
        rank: dict[str, int] = {}
        for n, call in enumerate(m.tool_calls):
            if call.id is not None:
                rank.setdefault(call.id, n)
        run = messages[i:j]
        out.extend(sorted(run, key=lambda t: rank.get(t.tool_call_id, len(m.tool_calls))))  # stable
        i = j
    return out
