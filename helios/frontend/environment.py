"""The Jinja environment chat templates are rendered in.

It matches the environment transformers' ``apply_chat_template`` uses (sandboxed, ``trim_blocks``,
``lstrip_blocks``, loop controls, ``tojson`` without HTML escaping, ``raise_exception``,
``strftime_now``) so prompt bytes are identical, and adds the ``{% mark %}`` extension and a
span-keeping buffer join for tracked strings.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from ignition.templates.marks import GenerationExtension, MarkExtension, MarkRecorder
from .conversation import FrontendError
from .tracked import TrackedStr, concat

ACTIVE_RECORDER: ContextVar[MarkRecorder | None] = ContextVar("flare_mark_recorder", default=None)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _TemplateNamespace(Namespace):
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


class _TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _MarkAwareExtension(MarkExtension):
    @staticmethod
    def _record(context, lineno, value):
        recorder = ACTIVE_RECORDER.get()
        if recorder is not None:
            recorder.marks.append((lineno, (recorder.position, recorder.chars) if value is None else value))
        return ""


def make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_MarkAwareExtension, GenerationExtension, jinja2.ext.loopcontrols],
    )
    env.concat = concat
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


_ENV = make_environment()


@lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """Compile an (annotated) chat template; misplaced marks raise ``TemplateSyntaxError``."""
    return _ENV.from_string(source)


def render_with_marks(template: jinja2.Template, variables: dict):
    """Render once; return ``(text, recorder)``: marks as (bytes, chars), tracked spans in characters."""
    recorder = MarkRecorder()
    token = ACTIVE_RECORDER.set(recorder)
    chunks: list[str] = []
    append = chunks.append
    try:
        ctx = template.new_context(variables)
        for chunk in template.root_render_func(ctx):
            if type(chunk) is TrackedStr and chunk.spans:
                base = recorder.chars
                recorder.spans.extend((key, base + s, base + e) for key, s, e in chunk.spans)
            append(chunk)
            recorder.chars += len(chunk)
            recorder.position += len(chunk) if chunk.isascii() else len(chunk.encode("utf-8"))
    except jinja2.exceptions.TemplateError as exc:  # raise_exception() and template errors
        raise FrontendError("messages", f"the chat template rejected the conversation: {exc}") from exc
    finally:
        ACTIVE_RECORDER.reset(token)
    return "".join(chunks), recorder
