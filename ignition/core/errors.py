"""Errors raised for cores that cannot be served."""

from __future__ import annotations

from pathlib import Path


class CoreFormatError(ValueError):
    """A core directory that is malformed, truncated, corrupted, incomplete or of an unsupported version.

    ``path`` names the offending file (or the core directory) where one is known; it leads the message.
    """

    def __init__(self, message: str, path: str | Path | None = None):
        self.path = Path(path) if path is not None else None
        self.detail = message
        super().__init__(f"{self.path}: {message}" if self.path is not None else message)


class UnsupportedCoreVersion(CoreFormatError):
    """The core's ``format_version`` is not one this runtime reads (newer, retired or invalid)."""

    def __init__(self, version: int, message: str, path: str | Path | None = None):
        self.version = version
        super().__init__(message, path)
