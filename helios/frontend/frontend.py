"""Render once, tokenize once, map endpoints: the shared native frontend."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .conversation import Conversation, FrontendError, ImageBlock
from .environment import compile_template, render_with_marks
from .lowering import CONTINUE, LITERAL, lower
from .tokens import Encoding, PromptTokenizer, safe_prefix_cut, token_endpoints


@dataclass
class PreparedPrompt:
    prompt: str
    token_ids: list[int]
    message_endpoints: list[int]  # UTF-8 byte offsets of completed preamble/messages
    token_endpoints: list[int]  # exact token cuts (sorted, unique, strictly inside)
    hint_cuts: list[int] = field(default_factory=list)  # advisory cuts (safe complete-token prefixes)
    hint_unsupported: list[dict] = field(default_factory=list)
    image_order: list[int] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)


class Frontend:
    """One recipe template variant + the checkpoint tokenizer.

    ``template`` is the annotated template text; ``variables`` are the prepared template variables
    (special tokens such as ``bos_token``); ``spec`` is the recipe's :class:`FrontendSpec`.
    """

    def __init__(self, template: str, tokenizer: PromptTokenizer, variables: dict[str, Any], spec, sampling):
        self.template_source = template
        self.template = compile_template(template)
        self.tokenizer = tokenizer
        self.variables = dict(variables)
        self.spec = spec
        self.sampling = sampling

    # -- rendering -------------------------------------------------------------------------------
    def template_variables(self, conv: Conversation, messages: list[dict]) -> dict[str, Any]:
        opts = conv.options
        v = dict(self.variables)
        v.update(messages=messages, add_generation_prompt=opts.add_generation_prompt)
        v["tools"] = opts.tools if opts.tools else None
        v["documents"] = None
        if opts.tool_choice not in (None, "auto", "none", "required"):
            raise FrontendError("tool_choice", f"{opts.tool_choice!r} is not supported (use auto, none or required)")
        thinking = opts.enable_thinking
        if thinking is not None and self.spec.thinking_kwarg is None:
            raise FrontendError("enable_thinking", "this recipe's template has no reasoning switch")
        if self.spec.thinking_kwarg is not None:
            chosen = self.spec.default_thinking if thinking is None else thinking
            if chosen is not None:
                v[self.spec.thinking_kwarg] = chosen
        for key, value in opts.extra.items():
            if key in ("messages", "tools", "add_generation_prompt"):
                raise FrontendError(f"chat_template_kwargs.{key}", "cannot be overridden")
            v[key] = value
        return v

    def render(self, conv: Conversation):
        special = self.tokenizer.special_spans
        messages, tracking = lower(conv, self.spec, special)
        prompt, recorder = render_with_marks(self.template, self.template_variables(conv, messages), tracking)
        return prompt, recorder

    # -- the whole path ---------------------------------------------------------------------------
    def prepare(self, conv: Conversation) -> PreparedPrompt:
        sampling = self.sampling.resolve(conv.sampling)
        prompt, rec = self.render(conv)
        marks = [int(v) for _, v in rec.marks]
        spans = rec.spans
        if conv.options.continue_final_message:
            ends = [e for k, s, e in spans if k == CONTINUE]
            if len(ends) != 1:
                raise FrontendError(
                    "continue_final_message",
                    "this template transforms or repeats the final message, so its end cannot be located",
                )
            cut = ends[0]
            prompt = prompt.encode("utf-8")[:cut].decode("utf-8")
            marks = [m for m in marks if m <= cut]
            spans = [(k, s, e) for k, s, e in spans if e <= cut]
        literal = [(s, e) for k, s, e in spans if k == LITERAL]
        self._check_literals(conv, prompt, literal)
        literal_chars = _bytes_to_char_spans(prompt, literal) if literal else []
        enc = self.tokenizer.encode(prompt, literal_chars)
        message_endpoints = sorted(set(m for m in marks if 0 < m <= len(prompt.encode("utf-8"))))
        token_eps = token_endpoints(enc, message_endpoints)
        hint_cuts, unsupported = self._hints(conv, enc, spans, message_endpoints) if conv.has_hints() else ([], [])
        image_order = [b.image_index for b in conv.images()]
        if image_order and self.spec.image_token is not None:
            n = sum(1 for t in enc.ids if t == self.tokenizer.special_tokens.get(self.spec.image_token))
            if n != len(image_order):
                raise FrontendError("messages", f"the template rendered {n} image placeholders for {len(image_order)} images")
        return PreparedPrompt(prompt, enc.ids, message_endpoints, token_eps, hint_cuts, unsupported, image_order, sampling)

    def _check_literals(self, conv, prompt, literal):
        # Every special spelling in content must have reached the prompt tracked; otherwise the
        # template transformed it and its tokens cannot be told apart from the template's.
        expected = sum(
            len(self.tokenizer.special_spans(b.text))
            for m in conv.messages for b in m.content if hasattr(b, "text")
        ) + sum(len(self.tokenizer.special_spans(m.reasoning)) for m in conv.messages if m.reasoning)
        if expected and len(literal) < expected and not conv.options.continue_final_message:
            raise FrontendError(
                "messages", "content spelling a special token was transformed by the template; it cannot be kept as text"
            )

    def _hints(self, conv: Conversation, enc: Encoding, spans, message_endpoints):
        n = len(enc.ids)
        cuts, unsupported = set(), []
        located: dict[Any, list[int]] = {}
        for key, s, e in spans:
            if key not in (LITERAL, CONTINUE):
                located.setdefault(key, []).append(e)
        for i, m in enumerate(conv.messages):
            wanted = [(("hint", i, j), f"messages[{i}].content[{j}]") for j, b in enumerate(m.content) if b.hint]
            if m.hint:
                wanted.append((("message", i), f"messages[{i}]"))
            for key, where in wanted:
                if isinstance(key, tuple) and key[0] == "hint" and isinstance(m.content[key[2]], ImageBlock):
                    unsupported.append({"field": where, "reason": "hints on image blocks are not supported"})
                    continue
                ends = located.get(key, [])
                if len(ends) != 1:
                    reason = "not emitted verbatim by the template" if not ends else "emitted more than once"
                    unsupported.append({"field": where, "reason": reason})
                    continue
                end = ends[0]
                if key[0] == "message":  # a whole message (tool result): include its closing wrapper
                    after = [p for p in message_endpoints if p >= end]
                    end = after[0] if after else end
                t = safe_prefix_cut(enc, end)
                if 0 < t < n:
                    cuts.add(t)
        return sorted(cuts), unsupported


def _bytes_to_char_spans(prompt: str, spans):
    data = prompt.encode("utf-8")
    return [(len(data[:s].decode("utf-8")), len(data[:e].decode("utf-8"))) for s, e in spans]
