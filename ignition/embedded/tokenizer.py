"""The embedded default tokenizer: a byte-level BPE trained on the project's own corpus.

* Pre-tokenization: a split regex of the GPT family (contractions, letter runs with one
  leading non-letter, single digits, punctuation runs, newline runs, other whitespace), then
  the byte-level mapping (``add_prefix_space=False``), so every byte sequence is encodable:
  the initial alphabet holds all 256 byte symbols.
* No normalizer: text is never changed (combining marks, CRLF and NFC/NFD spellings all
  round-trip exactly).
* Special tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` get IDs 0, 1, 2; the
  non-special added tokens ``<think>`` … ``</tool_response>`` take the last six IDs.
* Training is made single-threaded (``TOKENIZERS_PARALLELISM=false`` while it runs); the same
  corpus gives the same bytes (tests build twice and compare).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from ignition.components.switches import environment

#: Total vocabulary size (model vocabulary + the added tokens below).
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # IDs 0, 1, 2
ADDED_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

#: Contractions; an optional non-letter/non-digit/non-newline then letters (and marks, so a
#: combining accent stays with its letter); one digit; an optional space then punctuation (with
#: trailing newlines); newline runs with their leading whitespace; whitespace not followed by
#: text; any other whitespace.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    r"|[^\r\n\p{L}\p{M}\p{N}]?[\p{L}\p{M}]+"
    r"|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)

_ENV_LOCK = threading.Lock()


@contextmanager
def _single_threaded():
    """Run the trainer without rayon parallelism (a process-wide switch tokenizers reads per call)."""
    # RAYON_NUM_THREADS is effective only if the rayon pool is not started yet
    with _ENV_LOCK, environment({"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}):
        yield


def new_tokenizer() -> Tokenizer:
    """An untrained tokenizer with the embedded default's pipeline."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def train(documents: Iterable[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Train the tokenizer on ``documents`` (the whole vocabulary, added tokens included, is ``vocab_size``)."""
    documents = list(documents)
    tok = new_tokenizer()
    model_size = vocab_size - len(ADDED_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=model_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    with _single_threaded():
        tok.train_from_iterator(documents, trainer=trainer, length=len(documents))
    if tok.get_vocab_size(with_added_tokens=True) != model_size:
        raise ValueError(
            f"the corpus yields {tok.get_vocab_size(with_added_tokens=True)} tokens, fewer than {model_size}: "
            "it is too small for the requested vocabulary"
        )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    for i, t in enumerate(ADDED_TOKENS):
        assert tok.token_to_id(t) == model_size + i, (t, tok.token_to_id(t))
    return tok


def serialize(tok: Tokenizer) -> bytes:
    """``tokenizer.json`` bytes (the vocabulary in ID order, merges in rank order)."""
    return (tok.to_str(pretty=True) + "\n").encode("utf-8")
