"""Frontend conformance over every recipe checkpoint × the conversation corpus.

Prompt bytes must equal transformers' ``apply_chat_template`` with the upstream template, token
IDs the checkpoint tokenizer's encoding of those bytes, and endpoints every invariant.
"""

from __future__ import annotations

import pytest

from helios.frontend.conversation import FrontendError
from helios.protocol import decode_request
from .checks import check_endpoint_invariants
from .conftest import CORPUS, ERRORS, corpus_ids
from .reference import (AssetMissing, reference_conversation, reference_ids, reference_render,
                        reference_sanitized_ids, reference_tokenizer, supports_sanitize, upstream_template)


def _reference(frontend_case, hub_cache):
    c = frontend_case
    try:
        return (reference_tokenizer(c.recipe, c.checkpoint, hub_cache),
                upstream_template(c.recipe, c.checkpoint, c.variant, hub_cache))
    except AssetMissing as exc:
        pytest.skip(f"reference asset missing: {exc}")


def expected_error(frontend, sample) -> str | None:
    """The field a recipe must reject for this corpus case (unsupported feature), else None."""
    spec = frontend.spec
    if "images" in sample["features"] and (spec.content_format != "blocks" or spec.image_token is None):
        return "content"
    if "enable_thinking" in str(sample["request"].get("chat_template_kwargs", {})) and spec.thinking_kwarg is None:
        return "enable_thinking"
    if sample["request"].get("tools") and not spec.renders_tools:
        return "tools"
    return None


def _canonical(tok):
    decode = _decode(tok)
    return lambda text: decode(tok(text, add_special_tokens=False)["input_ids"])


def _decode(tok):
    return lambda ids: tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("sample", CORPUS, ids=corpus_ids())
def test_prompt_tokens_and_endpoints(frontend_case, frontend, hub_cache, sample, flare_samples):
    tok, template = _reference(frontend_case, hub_cache)
    conv = decode_request(sample["protocol"], sample["request"])
    field = expected_error(frontend, sample)
    if field is not None:
        with pytest.raises(FrontendError) as err:
            frontend.prepare(conv)
        assert field in err.value.field
        return
    prepared = frontend.prepare(conv)
    # the reference reads the request itself (reference_conversation), not helios' decoding and lowering
    messages, variables, options = reference_conversation(sample["protocol"], sample["request"], frontend.spec)
    expected_prompt = reference_render(tok, template, messages, variables, options)
    assert prepared.prompt == expected_prompt
    problems = check_endpoint_invariants(prepared.prompt, prepared.token_ids, prepared.message_endpoints,
                                         prepared.token_endpoints, prepared.token_endpoint_bytes, _decode(tok),
                                         _canonical(tok))
    assert not problems, problems
    if frontend.tokenizer.spells_special(prepared.prompt) and sample["name"] == "literal_special_spelling":
        # content spelling a special token stays text: other ids than the reference's naive encoding, the same text
        # (the special-id count: test_literal_special_spellings_stay_text)
        assert _decode(tok)(prepared.token_ids) == _decode(tok)(reference_ids(tok, expected_prompt))
    else:
        assert prepared.token_ids == reference_ids(tok, expected_prompt)
    n_messages = len(conv.messages)
    assert prepared.message_endpoints, "no endpoint was recorded"
    flare_samples(case={"recipe": frontend_case.recipe, "checkpoint": frontend_case.checkpoint,
                        "variant": frontend_case.variant, "conversation": sample["name"]},
                  prompt_bytes=len(prepared.prompt.encode("utf-8")), tokens=len(prepared.token_ids),
                  messages=n_messages, message_endpoints=len(prepared.message_endpoints),
                  token_endpoints=len(prepared.token_endpoints))


def test_literal_special_spellings_stay_text(frontend_case, frontend, hub_cache):
    tok, template = _reference(frontend_case, hub_cache)
    sample = next(s for s in CORPUS if s["name"] == "literal_special_spelling")
    conv = decode_request(sample["protocol"], sample["request"])
    prepared = frontend.prepare(conv)
    content = conv.messages[-1].text()
    literal = frontend.tokenizer.special_spans(content)
    if not literal:
        pytest.skip(f"none of the corpus spellings is a special token of {frontend_case.checkpoint}")
    specials = set(frontend.tokenizer.special_tokens.values())
    # Independent count: special IDs in the reference encoding of the same prompt minus those spelled by content.
    naive = reference_ids(tok, prepared.prompt)
    n_naive = sum(1 for t in naive if t in specials)
    n_ours = sum(1 for t in prepared.token_ids if t in specials)
    assert n_ours == n_naive - len(literal)
    assert _decode(tok)(prepared.token_ids) == _decode(tok)(naive)  # same text, fewer special IDs
    if supports_sanitize(tok):
        messages, variables, options = reference_conversation(sample["protocol"], sample["request"], frontend.spec)
        sanitized = reference_sanitized_ids(tok, template, messages, variables, options)
        assert sum(1 for t in sanitized if t in specials) == n_ours


@pytest.mark.parametrize("sample", ERRORS, ids=[e["name"] for e in ERRORS])
def test_malformed_requests_name_the_field(frontend, sample):
    with pytest.raises(FrontendError) as err:
        conv = decode_request(sample["protocol"], sample["request"])
        frontend.prepare(conv)
    assert err.value.field.startswith(sample["field"]), err.value


def test_hints_never_change_prompt_and_add_the_expected_cut(frontend_case, frontend, hub_cache):
    sample = next(s for s in CORPUS if s["name"] == "anthropic_hints")
    hinted = decode_request("anthropic", sample["request"])
    prepared = frontend.prepare(hinted)
    unhinted_req = _strip_cache_control(sample["request"])
    plain = frontend.prepare(decode_request("anthropic", unhinted_req))
    assert prepared.prompt == plain.prompt and prepared.token_ids == plain.token_ids
    assert prepared.token_endpoints == plain.token_endpoints and plain.hint_cuts == []
    assert not prepared.hint_unsupported, prepared.hint_unsupported
    # The stable document block inside the user message gets a cut that is not a message endpoint.
    extra = [t for t in prepared.hint_cuts if t not in prepared.token_endpoints]
    assert extra, (prepared.hint_cuts, prepared.token_endpoints)
    # A changed suffix in the same message keeps every token before the extra cut.
    changed = _strip_cache_control(sample["request"])
    changed["messages"][0]["content"][1]["text"] = "Question: how big should pages be?"
    other = frontend.prepare(decode_request("anthropic", changed))
    cut = max(extra)
    assert other.token_ids[:cut] == prepared.token_ids[:cut]
    # The cut is the last complete-token prefix at or before the end of the hinted block.
    doc = sample["request"]["messages"][0]["content"][0]["text"]
    doc_end = prepared.prompt.index(doc) + len(doc)
    tok, _ = _reference(frontend_case, hub_cache)
    prefix = _decode(tok)(prepared.token_ids[:cut])
    assert prepared.prompt.startswith(prefix) and doc_end - 8 <= len(prefix) <= doc_end, (len(prefix), doc_end)


def _strip_cache_control(obj):
    if isinstance(obj, dict):
        return {k: _strip_cache_control(v) for k, v in obj.items() if k != "cache_control"}
    if isinstance(obj, list):
        return [_strip_cache_control(v) for v in obj]
    return obj
