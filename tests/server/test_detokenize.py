"""Incremental detokenization (``helios.runtime.detokenize``) against the full decode it replaces, over the
embedded tokenizer and real checkpoint tokenizers from the hub cache (byte-level BPE: Qwen3, DeepSeek-V3; the
Gemma 4 tokenizer with its own pre/decoders): after every token, whenever the full decode of all ids does not end
in U+FFFD, the emitted text equals it, and ``full()`` always equals it."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer

from helios.runtime.detokenize import REPLACEMENT, IncrementalText

HUB_TOKENIZERS = ["Qwen/Qwen3-8B", "deepseek-ai/DeepSeek-V3", "google/gemma-4-E2B-it"]


def _embedded():
    from ignition.checkpoints import embedded_default_checkpoint

    return Tokenizer.from_file(str(embedded_default_checkpoint() / "tokenizer.json"))


def _hub(repo, hub_cache):
    from pathlib import Path

    snaps = sorted((Path(hub_cache) / f"models--{repo.replace('/', '--')}" / "snapshots").glob("*/tokenizer.json"))
    if not snaps:
        pytest.skip(f"{repo}: no tokenizer.json in the hub cache {hub_cache}")
    return Tokenizer.from_file(str(snaps[-1]))


def _sequences(tok, seed):
    """Real text round-tripped (multi-byte scripts, emoji, spaces, newlines) and random ids (special tokens and
    byte pieces included)."""
    rng = random.Random(seed)
    text = ("Hello  world,\n  caf\u00e9 na\u00efve \u4f60\u597d\uff0c\u4e16\u754c \U0001f680\U0001f469\u200d\U0001f4bb "
            "\u0645\u0631\u062d\u0628\u0627  \t tabs\u00a0nbsp \u3053\u3093\u306b\u3061\u306f  end ")
    yield tok.encode(text, add_special_tokens=False).ids
    vocab = tok.get_vocab_size()
    for _ in range(3):
        yield [rng.randrange(vocab) for _ in range(60)]


def _check(tok, seed=0):
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731 -- as PromptTokenizer.decode
    for ids in _sequences(tok, seed):
        inc, emitted = IncrementalText(decode), ""
        for i, t in enumerate(ids):
            emitted += inc.append(t)
            full = decode(ids[:i + 1])
            assert emitted == inc.text
            if not full.endswith(REPLACEMENT):
                assert inc.text == full, f"after {i + 1} tokens"
            assert full.startswith(inc.text) or REPLACEMENT in full
            assert inc.full() == full


def test_embedded_tokenizer():
    _check(_embedded())


@pytest.mark.parametrize("repo", HUB_TOKENIZERS)
def test_checkpoint_tokenizers(repo, hub_cache):
    _check(_hub(repo, hub_cache), seed=len(repo))


def test_stop_strings_found_across_flushes_earliest_first():
    """The engine searches only the text not yet searched (plus a stop's length - 1 back): a stop string split
    across tokens is still found, and of two stops the earliest occurrence wins, as a search of the whole text."""
    from helios.runtime.scheduler import Request, Scheduler

    class Loop:
        def call_soon_threadsafe(self, fn, *a):
            fn(*a)

    class Queue(list):
        put_nowait = list.append

    pieces = ["Hello wo", "rld, th", "e END is", " here"]  # both stops complete in the third flush
    sched = Scheduler.__new__(Scheduler)
    sched.metrics = None
    r = Request([1], {}, 10, ["END is", "rld, the"], Loop(), Queue())
    r.detok = IncrementalText(lambda ids: "".join(pieces[i] for i in ids))
    for i in range(len(pieces)):
        r.detok.append(i)
        sched._flush(r, final=False)
        if r.finish_reason:
            break
    whole = "".join(pieces[:i + 1])
    assert r.finish_reason == "stop" and r.stop_sequence == "rld, the" and i == 2
    assert "".join(e[1] for e in r.queue if e[0] == "delta") == whole[:whole.find("rld, the")] == "Hello wo"
