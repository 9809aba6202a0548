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
    token_endpoint_bytes: list[int] = field(default_factory=list)  # the byte cut of each token endpoint
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
        if opts.tools and not self.spec.renders_tools:
            raise FrontendError("tools", "this recipe's chat template does not render tool definitions")
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
        messages, literal_expected = lower(conv, self.spec, self.tokenizer.special_spans)
        prompt, recorder = render_with_marks(self.template, self.template_variables(conv, messages))
        recorder.literal_expected = literal_expected
        return prompt, recorder

    # -- the whole path ---------------------------------------------------------------------------
    def prepare(self, conv: Conversation) -> PreparedPrompt:
        sampling = self.sampling.resolve(conv.sampling)
        prompt, rec = self.render(conv)
        marks = [v for _, v in rec.marks]  # (bytes, chars)
        spans = rec.spans  # (key, start char, end char)
        if conv.options.continue_final_message:
            ends = [e for k, s, e in spans if k == CONTINUE]
            if len(ends) != 1:
                raise FrontendError(
                    "continue_final_message",
                    "this template transforms or repeats the final message, so its end cannot be located",
                )
            cut = ends[0]
            prompt = prompt[:cut]
            marks = [m for m in marks if m[1] <= cut]
            spans = [(k, s, e) for k, s, e in spans if e <= cut]
        literal = [(s, e) for k, s, e in spans if k == LITERAL]
        if rec.literal_expected and len(literal) < rec.literal_expected and not conv.options.continue_final_message:
            # A special spelling in content reached the prompt through a transformation the renderer
            # cannot follow, so its tokens cannot be told apart from the template's own.
            raise FrontendError(
                "messages", "content spelling a special token was transformed by the template; it cannot be kept as text"
            )
        enc = self.tokenizer.encode(prompt, literal)
        n_chars = len(prompt)
        inside = sorted(set(m for m in marks if 0 < m[1] <= n_chars))
        message_endpoints = [b for b, _ in inside]
        pairs = token_endpoints(enc, message_endpoints)
        hint_cuts, unsupported = self._hints(conv, enc, prompt, spans, inside) if conv.has_hints() else ([], [])
        image_order = [b.image_index for b in conv.images()]
        if image_order and self.spec.image_token is not None:
            image_id = self.tokenizer.special_tokens.get(self.spec.image_token)
            n = enc.ids.count(image_id)
            if n != len(image_order):
                raise FrontendError("messages", f"the template rendered {n} image placeholders for {len(image_order)} images")
        return PreparedPrompt(prompt, enc.ids, message_endpoints, [t for t, _ in pairs], [b for _, b in pairs],
                              hint_cuts, unsupported, image_order, sampling)

    def _hints(self, conv: Conversation, enc: Encoding, prompt: str, spans, message_endpoints):
        data = prompt.encode("utf-8")
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
                    after = [c for _, c in message_endpoints if c >= end]
                    end = after[0] if after else end
                t = safe_prefix_cut(enc, len(prompt[:end].encode("utf-8")), data)
                if 0 < t < n:
                    cuts.add(t)
        return sorted(cuts), unsupported
