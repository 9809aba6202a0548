"""Checkpoints without downloads: seeded random weights of a real (or shrunk) geometry.

``synthesize_checkpoint`` writes an ordinary Hugging Face checkpoint folder from a config in the
offline hub cache; ``embedded_default_checkpoint`` returns the cached tiny Qwen3 checkpoint built
on the project's own tokenizer and template (no hub cache needed).  See :mod:`.synth`.
"""

from .synth import (
    DEFAULT_SHARD_SIZE,
    EMBEDDED_REPO_ID,
    SynthError,
    embedded_default_checkpoint,
    plan_tensors,
    read_manifest,
    synthesize_checkpoint,
    verify_checkpoint,
)

__all__ = [
    "DEFAULT_SHARD_SIZE", "EMBEDDED_REPO_ID", "SynthError", "embedded_default_checkpoint", "plan_tensors",
    "read_manifest", "synthesize_checkpoint", "verify_checkpoint",
]
