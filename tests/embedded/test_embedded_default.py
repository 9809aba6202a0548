"""The embedded default: a project-built tokenizer and ChatML template, no hub files.

Determinism (two builds, in this process and in a fresh one with other hash seeds and thread
settings, are byte-identical; a tokenizer from another corpus is caught), byte-level round
trips, fixed special-token IDs, and the template against transformers' reference render.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer, pre_tokenizers

import ignition.embedded as embedded
from ignition.embedded import corpus, tokenizer as etok
from ignition.templates.marks import strip_marks
from ignition.templates.patch import TemplatePatch

REPO_ROOT = Path(__file__).resolve().parents[2]
PATCH = REPO_ROOT / "ignition" / "recipes" / "qwen3" / "assets" / "chat_template.flare-default.patch.json"


# -- fixtures --------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def cache_root(tmp_path_factory):
    """Every build of this session (including load_frontend's) goes to a temporary FLARE_CACHE."""
    root = tmp_path_factory.mktemp("flare-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLARE_CACHE", str(root))
        yield root


@pytest.fixture(scope="session")
def built(cache_root):
    t = time.perf_counter()
    folder = embedded.materialize_default()
    seconds = time.perf_counter() - t
    assert folder.parent == cache_root / "embedded"
    return folder, seconds


@pytest.fixture(scope="session")
def folder(built):
    return built[0]


@pytest.fixture(scope="session")
def tok(folder):
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


@pytest.fixture(scope="session")
def hf_tok(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="session")
def frontend(cache_root, folder):
    from ignition.frontend_assets import load_frontend

    return load_frontend("qwen3", "flare/embedded-default")


def folder_differences(a: Path, b: Path) -> list[str]:
    """The determinism check: names of files that differ (or exist on one side only)."""
    names_a = sorted(p.name for p in a.iterdir())
    names_b = sorted(p.name for p in b.iterdir())
    out = [f"{n}: only in one build" for n in sorted(set(names_a) ^ set(names_b))]
    for name in sorted(set(names_a) & set(names_b)):
        if (a / name).read_bytes() != (b / name).read_bytes():
            out.append(f"{name}: bytes differ")
    return out


# -- determinism -----------------------------------------------------------------------------------

def test_build_is_fast_and_complete(built):
    folder, seconds = built
    assert seconds < 10, f"the embedded build took {seconds:.1f}s"
    assert sorted(p.name for p in folder.iterdir()) == sorted(embedded.FILES + (embedded.MANIFEST,))
    assert embedded.verify_folder(folder)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")], "a temporary build folder was left"


def test_two_builds_are_byte_identical(folder, tmp_path):
    other = embedded.materialize_default(tmp_path / "second")
    assert other != folder and other.name == folder.name
    assert folder_differences(folder, other) == []


def test_a_fresh_process_builds_the_same_bytes(folder, tmp_path):
    """Another interpreter, other string-hash seed, rayon allowed to use several threads."""
    env = dict(os.environ, PYTHONHASHSEED="12345", TOKENIZERS_PARALLELISM="true", RAYON_NUM_THREADS="4",
               PYTHONPATH=str(REPO_ROOT))
    code = "import sys, ignition.embedded as e; print(e.materialize_default(sys.argv[1]))"
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "proc")], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert folder_differences(folder, Path(out.stdout.strip())) == []


#: SHA-256 of tokenizer.json as built with tokenizers 0.23.  A deliberate change of the corpus, the
#: trainer settings or the tokenizers version changes it: rebuild, check the tests above, update it.
TOKENIZER_SHA256 = "b0e49c3f3f55a5911c91dce5270a149239b02e2a7b0a4028ba5d25a347e62217"


def test_tokenizer_bytes_match_the_pinned_build(folder):
    import tokenizers

    actual = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    if actual != TOKENIZER_SHA256 and not tokenizers.__version__.startswith("0.23."):
        pytest.skip(f"pinned for tokenizers 0.23, running {tokenizers.__version__} (got {actual})")
    assert actual == TOKENIZER_SHA256, "the embedded tokenizer changed: same inputs must give the same bytes"


def test_planted_tokenizer_from_another_corpus_is_caught(folder, tmp_path):
    """Plant a tokenizer trained on a different corpus into an otherwise identical build."""
    planted = tmp_path / folder.name
    files = {n: (folder / n).read_bytes() for n in embedded.FILES}
    files["tokenizer.json"] = etok.serialize(etok.train(corpus.documents(seed=corpus.DEFAULT_SEED + 1)))
    embedded.write_folder(planted, files, folder.name)
    assert folder_differences(folder, planted) == ["flare-embedded.json: bytes differ", "tokenizer.json: bytes differ"]


def test_planted_single_document_change_is_caught(folder):
    docs = corpus.documents()
    docs[len(docs) // 2] += " Quarkwhistle zephyrbloom quarkwhistle zephyrbloom."
    assert etok.serialize(etok.train(docs)) != (folder / "tokenizer.json").read_bytes()


def test_damaged_cache_is_rebuilt(folder, tmp_path):
    root = tmp_path / "cache"
    first = embedded.materialize_default(root)
    (first / "tokenizer.json").write_text("{}")
    assert not embedded.verify_folder(first)
    again = embedded.materialize_default(root)
    assert again == first and folder_differences(folder, again) == []
    assert [p.name for p in root.iterdir()] == [folder.name]


def test_corpus_is_deterministic_and_small():
    a, b = corpus.corpus_bytes(), corpus.corpus_bytes()
    assert a == b and 100_000 < len(a) < 500_000
    assert corpus.corpus_bytes(seed=corpus.DEFAULT_SEED + 1) != a
    text = a.decode("utf-8")
    for needle in ("\t", "\r\n", "\n\n", "    ", "é", "e\u0301", "你", "😀", "\u200d", '{"name": "', "def ", "0x"):
        assert needle in text, needle


# -- tokenizer -------------------------------------------------------------------------------------

def test_vocabulary_and_fixed_ids(tok, folder):
    assert tok.get_vocab_size(with_added_tokens=True) == etok.VOCAB_SIZE == 4096
    doc = json.loads((folder / "tokenizer.json").read_text())
    added = {t["content"]: (t["id"], t["special"]) for t in doc["added_tokens"]}
    assert added == {
        "<|endoftext|>": (0, True), "<|im_start|>": (1, True), "<|im_end|>": (2, True),
        "<think>": (4090, False), "</think>": (4091, False), "<tool_call>": (4092, False),
        "</tool_call>": (4093, False), "<tool_response>": (4094, False), "</tool_response>": (4095, False),
    }
    assert doc["normalizer"] is None
    assert doc["decoder"]["type"] == "ByteLevel"
    # Every byte has its own symbol in the vocabulary, so any byte sequence is encodable.
    vocab = tok.get_vocab()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    assert len(alphabet) == 256 and all(ch in vocab for ch in alphabet)
    assert tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False).ids[:1] == [1]


def test_tokenizer_config(folder):
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert isinstance(cfg[key], str) and cfg[key] in etok.SPECIAL_TOKENS
    assert cfg["eos_token"] == "<|im_end|>"
    assert cfg["additional_special_tokens"] == ["<|im_start|>", "<|im_end|>"]
    assert isinstance(cfg["model_max_length"], int)
    assert cfg["chat_template"] == embedded.chat_template()
    assert strip_marks(cfg["chat_template"]) == cfg["chat_template"]  # the unannotated text


def _symbols_to_bytes(tok: Tokenizer, ids: list[int]) -> bytes:
    """Concatenate token bytes: byte-level symbols mapped back to bytes; added tokens as their text."""
    added = set(etok.SPECIAL_TOKENS + etok.ADDED_TOKENS)
    out = bytearray()
    for i in ids:
        piece = tok.id_to_token(i)
        out += piece.encode("utf-8") if piece in added else bytes(BYTE_OF_SYMBOL[c] for c in piece)
    return bytes(out)


def _gpt_byte_symbols() -> dict[str, int]:
    # The byte-level mapping: printable Latin-1 bytes map to themselves, the others to U+0100 onwards.
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    symbols, n = {}, 0
    for b in range(256):
        if b in keep:
            symbols[chr(b)] = b
        else:
            symbols[chr(0x100 + n)] = b
            n += 1
    return symbols


BYTE_OF_SYMBOL = _gpt_byte_symbols()


def _random_text(r: random.Random) -> str:
    ranges = [(0x00, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF), (0x0300, 0x036F),
              (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF)]
    out = []
    for _ in range(r.randint(0, 40)):
        k = r.random()
        if k < 0.15:
            out.append(r.choice(etok.SPECIAL_TOKENS + etok.ADDED_TOKENS))
        elif k < 0.3:
            out.append(r.choice((" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n ", "\u00a0", "\u3000")) * r.randint(1, 3))
        else:
            lo, hi = r.choice(ranges)
            out.append(chr(r.randint(lo, hi)))
    return "".join(out)


def test_arbitrary_text_round_trips(tok):
    assert set(BYTE_OF_SYMBOL) == set(pre_tokenizers.ByteLevel.alphabet())
    r = random.Random(7)
    samples = [_random_text(r) for _ in range(400)]
    samples += ["", " ", "\x00\x01\x7f", "e\u0301 vs \u00e9", "👨\u200d👩\u200d👧 🇯🇵", "a\r\nb\rc", "\ufeffBOM",
                "<|im_start|>user\n<think>x</think><|im_end|>", "<|im_start", "tab\tend\t", " " * 37, "\U0010ffff"]
    for text in samples:
        enc = tok.encode(text, add_special_tokens=False)
        assert tok.decode(enc.ids, skip_special_tokens=False) == text, repr(text)
        assert _symbols_to_bytes(tok, enc.ids) == text.encode("utf-8"), repr(text)


def test_every_single_byte_and_random_utf8_bytes_round_trip(tok):
    r = random.Random(11)
    for b in range(256):
        sym = next(s for s, v in BYTE_OF_SYMBOL.items() if v == b)
        assert tok.token_to_id(sym) is not None
    for _ in range(300):
        raw = bytes(r.getrandbits(8) for _ in range(r.randint(1, 64))).decode("utf-8", errors="ignore")
        enc = tok.encode(raw, add_special_tokens=False)
        assert _symbols_to_bytes(tok, enc.ids) == raw.encode("utf-8")
        assert tok.decode(enc.ids, skip_special_tokens=False) == raw


def test_transformers_loads_the_folder_and_agrees(tok, hf_tok, folder):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    assert len(hf_tok) == 4096 and hf_tok.eos_token == "<|im_end|>" and hf_tok.pad_token_id == 0
    text = "<|im_start|>user\nGrüße, 世界! <tool_call>{\"a\": 1}</tool_call><|im_end|>\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert hf_tok(text, add_special_tokens=False).input_ids == ids == fast(text, add_special_tokens=False).input_ids
    assert hf_tok.decode(ids, skip_special_tokens=True) == "user\nGrüße, 世界! <tool_call>{\"a\": 1}</tool_call>\n"


# -- template --------------------------------------------------------------------------------------

def test_patch_asset_is_the_embedded_template_annotated():
    patch = TemplatePatch.load(PATCH)
    assert patch.source.embedded == embedded.TEMPLATE_REPO_PATH and patch.source.repo_id is None
    source = embedded.chat_template()
    annotated = patch.apply(source)
    assert strip_marks(annotated) == source
    assert len(patch.insertions) == 2


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _conversations():
    """(name, messages as template dicts, tools, enable_thinking or None, add_generation_prompt)."""
    sys_msg = {"role": "system", "content": "You are brief. Café ☕"}
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
    return [
        ("plain", [{"role": "user", "content": "Hello!"}], None, None, True),
        ("system", [sys_msg, {"role": "user", "content": "Hi\n\tthere"}], None, True, True),
        ("no_thinking", [{"role": "user", "content": "2+2?"}], None, False, True),
        ("no_generation_prompt", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], None, None, False),
        ("history_reasoning_dropped", [
            {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
            {"role": "user", "content": "q2"}], None, None, True),
        ("tools_roundtrip", [
            sys_msg, {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": "", "reasoning_content": "need the tool", "tool_calls": [call]},
            {"role": "tool", "content": '{"temp": 21.5, "unit": "°C"}', "tool_call_id": "c1"},
            {"role": "tool", "content": "second result", "tool_call_id": "c2"},
            {"role": "assistant", "content": "It is 21.5 °C 🌤️", "reasoning_content": "from the tool"}],
         TOOLS, None, False),
        ("tools_no_system_string_args", [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "Calling.", "tool_calls": [
                {"type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
                {"type": "function", "function": {"name": "b", "arguments": {}}}]},
            {"role": "tool", "content": "ok"}, {"role": "user", "content": "and?"}], TOOLS, False, True),
        ("mid_system_and_specials_in_content", [
            {"role": "user", "content": "say <think> and <|im_end|> literally"},
            {"role": "system", "content": "late system"}, {"role": "user", "content": "ok"}], None, None, True),
    ]


def _conversation(messages, tools, thinking, add_generation_prompt):
    from helios.frontend.conversation import Conversation, Message, Options, TextBlock, ToolCall

    out = []
    for m in messages:
        calls = [ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", [])]
        out.append(Message(m["role"], [TextBlock(m["content"])], reasoning=m.get("reasoning_content"),
                           tool_calls=calls, tool_call_id=m.get("tool_call_id")))
    return Conversation(out, Options(add_generation_prompt=add_generation_prompt, enable_thinking=thinking, tools=tools))


@pytest.mark.parametrize("case", _conversations(), ids=[c[0] for c in _conversations()])
def test_frontend_matches_transformers_reference(case, frontend, hf_tok):
    name, messages, tools, thinking, gen = case
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    expected = hf_tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen, **kwargs)
    prepared = frontend.prepare(_conversation(messages, tools, thinking, gen))
    assert prepared.prompt == expected
    if "<|im_end|> literally" not in expected:  # content spelling a special token stays text in the frontend
        assert prepared.token_ids == hf_tok(expected, add_special_tokens=False).input_ids
    # Endpoints: after the preamble and after each completed message, never after the open header.
    data = expected.encode("utf-8")
    ends = prepared.message_endpoints
    assert ends == sorted(set(ends)) and all(0 < e <= len(data) for e in ends)
    for e in ends:
        assert data[:e].endswith((b"<|im_end|>\n", b"</tool_response>")), data[max(0, e - 30):e]
    n_turns = expected.count("<|im_end|>\n")
    n_inner_tool = expected.count("</tool_response>\n<tool_response>")
    assert len(ends) == n_turns + n_inner_tool
    if gen:
        assert data[ends[-1]:] in (b"<|im_start|>assistant\n", b"<|im_start|>assistant\n<think>\n\n</think>\n\n")
    else:
        assert ends[-1] == len(data)
    # Every message endpoint strictly inside the prompt is an exact token cut.
    inside = [e for e in ends if e < len(data)]
    assert len(prepared.token_endpoints) == len(inside)


def test_chatml_shape():
    """The exact bytes of a small conversation (the format, pinned by hand)."""
    from helios.frontend.environment import compile_template, render_with_marks

    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A", "tool_calls": [{"function": {"name": "f", "arguments": {"k": "v"}}}]},
        {"role": "tool", "content": "R"},
        {"role": "assistant", "content": "B", "reasoning_content": "T"},
    ]
    template = compile_template(embedded.chat_template())
    text, _ = render_with_marks(template, {"messages": messages, "add_generation_prompt": True, "enable_thinking": False})
    assert text == (
        "<|im_start|>system\nS<|im_end|>\n"
        "<|im_start|>user\nU<|im_end|>\n"
        '<|im_start|>assistant\nA\n<tool_call>{"name": "f", "arguments": {"k": "v"}}</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nR\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nT\n</think>\n\nB<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    tools_text, _ = render_with_marks(template, {"messages": [{"role": "user", "content": "U"}], "tools": TOOLS,
                                                 "add_generation_prompt": True})
    preamble = tools_text.split("<|im_end|>\n")[0]
    assert preamble.startswith("<|im_start|>system\n# Tools")
    assert json.dumps(TOOLS[0], ensure_ascii=False) + "\n</tools>" in preamble


def test_continue_final_message(frontend, hf_tok):
    from helios.frontend.conversation import Conversation, Message, Options, TextBlock

    messages = [{"role": "user", "content": "Write"}, {"role": "assistant", "content": "Once upon"}]
    expected = hf_tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    conv = Conversation([Message(m["role"], [TextBlock(m["content"])]) for m in messages],
                        Options(add_generation_prompt=False, continue_final_message=True))
    prepared = frontend.prepare(conv)
    assert prepared.prompt == expected and expected.endswith("<|im_start|>assistant\nOnce upon")


def test_unknown_role_is_rejected(frontend):
    from helios.frontend.conversation import FrontendError as TemplateError

    from helios.frontend.conversation import Conversation, Message, TextBlock

    m = Message("user", [TextBlock("x")])
    m.role = "narrator"  # not a normalized role: reachable only by bypassing the protocol decoders
    with pytest.raises(TemplateError, match="Unsupported message role: narrator"):
        frontend.prepare(Conversation([m]))


def test_content_hash_names_the_folder(folder):
    assert folder.name == embedded.build_key()
    manifest = json.loads((folder / embedded.MANIFEST).read_text())
    for name in embedded.FILES:
        assert manifest["files"][name] == hashlib.sha256((folder / name).read_bytes()).hexdigest()
