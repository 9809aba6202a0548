"""The HTTP API (FastAPI): OpenAI chat and legacy completions, Anthropic messages, models, health, metrics.

Every generation request takes the same road: JSON -> ``helios.protocol.decode_request`` ->
``Frontend.prepare`` (render once, tokenize once, sampling resolved and clamped by the core's
defaults) -> the scheduler -> events -> the protocol's response shape.  Errors use each protocol's
own error body; nothing a request does reaches another request.  ``/v1/completions`` skips the
frontend: its prompt is text tokenized as is (no template) or token IDs.  With ``tools`` in the request,
a completed reply is parsed for tool calls in the recipe's format (``helios.frontend.tool_calls``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from helios.frontend.conversation import FrontendError
from helios.frontend.tool_calls import ToolCall, opening, parse_tool_calls
from helios.protocol import decode_request
from helios.protocol.openai import decode_completion_request
from helios.runtime.scheduler import Request as EngineRequest
from helios.runtime.scheduler import Scheduler

from .metrics import CONTENT_TYPE_LATEST, Metrics

_OPENAI_TYPES = {400: "invalid_request_error", 404: "not_found_error", 503: "service_unavailable",
                 500: "server_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 404: "not_found_error", 503: "overloaded_error",
                    500: "api_error"}
_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def _error_response(protocol: str, e: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status == 503 else None
    if protocol == "anthropic":
        body = {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(e.status, "api_error"), "message": e.message}}
    else:
        body = {"error": {"message": e.message, "type": _OPENAI_TYPES.get(e.status, "server_error"),
                          "param": e.param, "code": e.code}}
    return JSONResponse(body, status_code=e.status, headers=headers)


def _openai_call(call: ToolCall) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}


def _anthropic_call(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": call.name, "input": call.arguments}


class _Holdback:
    """Streams text up to the tool-call opening and holds the rest; ``finish`` returns the held text and
    no calls, or ``""`` and the calls when the held text is a well-formed call sequence.  Without a
    format nothing is held."""

    def __init__(self, fmt: str | None):
        self.fmt, self.tag = fmt, opening(fmt)
        self.sent, self.text = 0, ""

    def feed(self, delta: str) -> str:
        self.text += delta
        if self.tag is None:
            out, self.sent = self.text[self.sent:], len(self.text)
            return out
        i = self.text.find(self.tag)
        if i < 0:  # hold a suffix that may begin the tag
            i = len(self.text) - max((k for k in range(1, len(self.tag)) if self.text.endswith(self.tag[:k])),
                                     default=0)
        end = max(i, self.sent)
        out, self.sent = self.text[self.sent:end], end
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        held = self.text[self.sent:]
        parsed = parse_tool_calls(self.fmt, held)
        if parsed is None:
            return held, []
        self.sent = len(self.text)
        return parsed[0], parsed[1]


def create_app(engine, scheduler: Scheduler, metrics: Metrics) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app):
        scheduler.start()
        try:
            yield
        finally:
            scheduler.stop()

    app = FastAPI(title="flare", docs_url=None, redoc_url=None, lifespan=lifespan)
    model_name = engine.model_name

    async def _body(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"malformed JSON body: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    def _check_model(body: dict) -> None:
        model = body.get("model")
        if model is not None and model != model_name:
            raise ApiError(404, f"model {model!r} is not served here (served: {model_name!r})", "model",
                           "model_not_found")

    def _positive(body: dict, *names: str) -> int | None:
        for name in names:
            value = body.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FrontendError(name, f"must be a positive integer, got {value!r}")
            return value
        return None

    def _stops(value: Any, name: str) -> list[str]:
        if value is None:
            return []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
            raise FrontendError(name, "must be a non-empty string or a list of non-empty strings")
        return list(value)

    async def _submit(protocol: str, body: dict, max_tokens: int | None, stop: list[str]) -> EngineRequest:
        conv = decode_request(protocol, body)
        prepared = engine.frontend.prepare(conv)
        return _enqueue(prepared.token_ids, prepared.sampling, max_tokens, stop, "messages",
                        sorted(set(prepared.token_endpoints) | set(prepared.hint_cuts)))

    def _enqueue(prompt_ids: list[int], sampling: dict, max_tokens: int | None, stop: list[str], param: str,
                 cache_points: list[int]) -> EngineRequest:
        n = len(prompt_ids)
        if n >= engine.max_context:
            raise ApiError(400, f"the prompt is {n} tokens; this server's context is {engine.max_context} tokens",
                           param, "context_length_exceeded")
        room = engine.max_context - n
        max_tokens = room if max_tokens is None else min(max_tokens, room)
        if scheduler.pages_for(n, max_tokens) > engine.pool.num_pages:
            raise ApiError(400, f"the request needs {n + max_tokens} KV tokens; the pool holds "
                                f"{engine.pool.num_pages * engine.page_size}", "max_tokens", "context_length_exceeded")
        loop = asyncio.get_running_loop()
        req = EngineRequest(list(prompt_ids), sampling, max_tokens, stop, loop, asyncio.Queue(),
                            cache_points=cache_points)
        scheduler.submit(req)
        return req

    def _tool_format(body: dict) -> str | None:
        """The format to parse replies with: the recipe's, when the request declared tools it may call."""
        choice = body.get("tool_choice")
        off = choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none")
        return engine.tool_call_format if body.get("tools") and not off else None

    async def _events(req: EngineRequest):
        """The request's events; a consumer that goes away (disconnect) cancels the request."""
        done = False
        try:
            while True:
                event = await req.queue.get()
                if event[0] in ("done", "error"):
                    done = True
                yield event
                if done:
                    return
        finally:
            if not done:
                scheduler.cancel(req)

    async def _collect(gen, first, http: Request, req: EngineRequest) -> tuple[list[str], tuple]:
        """A non-streaming reply's text and final event; a client that disconnects meanwhile cancels it."""
        async def watch():
            while not await http.is_disconnected():
                await asyncio.sleep(0.1)
            scheduler.cancel(req)  # the engine drops it and frees its pages; end the wait here
            req.queue.put_nowait(("error", 499, "the client disconnected"))

        watcher = asyncio.create_task(watch())
        try:
            text, event = [], first
            while event[0] == "delta":
                text.append(event[1])
                event = await gen.__anext__()
        finally:
            watcher.cancel()
        if event[0] == "error":
            raise ApiError(event[1], event[2])
        return text, event

    async def _first(gen):
        event = await gen.__anext__()
        if event[0] == "error":
            await gen.aclose()
            raise ApiError(event[1], event[2])
        return event

    def _usage_openai(req: EngineRequest) -> dict:
        p, c = len(req.prompt_ids), len(req.generated)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": {"cached_tokens": req.cached_tokens}}

    async def _handle(protocol: str, request: Request, run):
        status = 200
        try:
            return await run(await _body(request), request)
        except FrontendError as e:
            status = 400
            return _error_response(protocol, ApiError(400, str(e), e.field))
        except ApiError as e:
            status = e.status
            return _error_response(protocol, e)
        finally:
            metrics.requests.labels(protocol, str(status)).inc()

    # -- OpenAI ------------------------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _handle("openai", request, _openai)

    async def _openai(body: dict, http: Request):
        _check_model(body)
        max_tokens = _positive(body, "max_completion_tokens", "max_tokens")
        stop = _stops(body.get("stop"), "stop")
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) if stream else False
        req = await _submit("openai", body, max_tokens, stop)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        gen = _events(req)
        first = await _first(gen)

        def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> str:
            c = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name,
                 "choices": [] if usage is not None else [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage is not None:
                c["usage"] = usage
            return f"data: {json.dumps(c)}\n\n"

        fmt = _tool_format(body)
        if stream:
            async def sse():
                yield chunk({"role": "assistant", "content": ""})
                held = _Holdback(fmt)
                event = first
                while True:
                    if event[0] == "delta":
                        out = held.feed(event[1])
                        if out:
                            yield chunk({"content": out})
                    elif event[0] == "done":
                        rest, calls = held.finish()
                        if rest:
                            yield chunk({"content": rest})
                        if calls:
                            yield chunk({"tool_calls": [{"index": i, **_openai_call(c)} for i, c in enumerate(calls)]})
                        yield chunk({}, "tool_calls" if calls else event[1])
                        if include_usage:
                            yield chunk({}, usage=_usage_openai(req))
                        break
                    else:
                        break  # error after the stream began: end it (the client sees no finish_reason)
                    event = await gen.__anext__()
                yield "data: [DONE]\n\n"

            async def guarded():
                try:
                    async for piece in sse():
                        yield piece
                finally:
                    await gen.aclose()

            return StreamingResponse(guarded(), media_type="text/event-stream")

        text, event = await _collect(gen, first, http, req)
        text = "".join(text)
        parsed = parse_tool_calls(fmt, text)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = event[1]
        if parsed is not None:
            message = {"role": "assistant", "content": parsed[0] or None,
                       "tool_calls": [_openai_call(c) for c in parsed[1]]}
            finish = "tool_calls"
        return {"id": rid, "object": "chat.completion", "created": created, "model": model_name,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": _usage_openai(req)}

    # -- OpenAI legacy completions -----------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _handle("openai", request, _completions)

    async def _completions(body: dict, http: Request):
        _check_model(body)
        prompt, sampling = decode_completion_request(body, engine.vocab_size)
        ids = engine.tokenizer.encode(prompt).ids if isinstance(prompt, str) else prompt
        if not ids:
            raise FrontendError("prompt", "tokenizes to no tokens")
        max_tokens = _positive(body, "max_tokens")
        max_tokens = 16 if max_tokens is None else max_tokens  # OpenAI's default for this endpoint
        stop = _stops(body.get("stop"), "stop")
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) if stream else False
        req = _enqueue(ids, engine.frontend.sampling.resolve(sampling), max_tokens, stop, "prompt", [])
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        gen = _events(req)
        first = await _first(gen)

        def body_of(text: str, finish: str | None, usage: bool) -> dict:
            out = {"id": rid, "object": "text_completion", "created": created, "model": model_name,
                   "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}
            if usage:
                out["usage"] = _usage_openai(req)
            return out

        if stream:
            async def sse():
                try:
                    event = first
                    while event[0] == "delta":
                        yield f"data: {json.dumps(body_of(event[1], None, False))}\n\n"
                        event = await gen.__anext__()
                    if event[0] == "done":
                        yield f"data: {json.dumps(body_of('', event[1], False))}\n\n"
                        if include_usage:
                            tail = {**body_of('', None, True), "choices": []}
                            yield f"data: {json.dumps(tail)}\n\n"
                    yield "data: [DONE]\n\n"
                finally:
                    await gen.aclose()

            return StreamingResponse(sse(), media_type="text/event-stream")

        text, event = await _collect(gen, first, http, req)
        return body_of("".join(text), event[1], True)

    # -- Anthropic ---------------------------------------------------------------------------------
    @app.post("/v1/messages")
    async def messages(request: Request):
        return await _handle("anthropic", request, _anthropic)

    async def _anthropic(body: dict, http: Request):
        _check_model(body)
        if body.get("max_tokens") is None:
            raise FrontendError("max_tokens", "is required")
        max_tokens = _positive(body, "max_tokens")
        stop = _stops(body.get("stop_sequences"), "stop_sequences")
        stream = bool(body.get("stream"))
        req = await _submit("anthropic", body, max_tokens, stop)
        fmt = _tool_format(body)
        mid = f"msg_{uuid.uuid4().hex}"
        gen = _events(req)
        first = await _first(gen)

        def usage(output: int) -> dict:
            return {"input_tokens": len(req.prompt_ids), "output_tokens": output,
                    "cache_read_input_tokens": req.cached_tokens, "cache_creation_input_tokens": 0}

        def message(content: list, stop_reason, stop_sequence, output: int) -> dict:
            return {"id": mid, "type": "message", "role": "assistant", "model": model_name, "content": content,
                    "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage(output)}

        if stream:
            def ev(name: str, data: dict) -> str:
                return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

            async def sse():
                try:
                    yield ev("message_start", {"message": message([], None, None, 0)})
                    yield ev("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
                    held = _Holdback(fmt)
                    event = first
                    while event[0] == "delta":
                        out = held.feed(event[1])
                        if out:
                            yield ev("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": out}})
                        event = await gen.__anext__()
                    if event[0] == "error":
                        yield ev("error", {"error": {"type": _ANTHROPIC_TYPES.get(event[1], "api_error"),
                                                     "message": event[2]}})
                        return
                    rest, calls = held.finish()
                    if rest:
                        yield ev("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": rest}})
                    yield ev("content_block_stop", {"index": 0})
                    for i, c in enumerate(calls, start=1):
                        block = _anthropic_call(c)
                        yield ev("content_block_start", {"index": i, "content_block": {**block, "input": {}}})
                        yield ev("content_block_delta", {"index": i, "delta": {
                            "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
                        yield ev("content_block_stop", {"index": i})
                    reason = "tool_use" if calls else "stop_sequence" if event[2] else _ANTHROPIC_STOP[event[1]]
                    yield ev("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": event[2]},
                                               "usage": usage(len(req.generated))})
                    yield ev("message_stop", {})
                finally:
                    await gen.aclose()

            return StreamingResponse(sse(), media_type="text/event-stream")

        text, event = await _collect(gen, first, http, req)
        text = "".join(text)
        reason = "stop_sequence" if event[2] else _ANTHROPIC_STOP[event[1]]
        parsed = parse_tool_calls(fmt, text)
        if parsed is None:
            return message([{"type": "text", "text": text}], reason, event[2], len(req.generated))
        content = [{"type": "text", "text": parsed[0]}] if parsed[0] else []
        content += [_anthropic_call(c) for c in parsed[1]]
        return message(content, "tool_use", event[2], len(req.generated))

    # -- the rest ----------------------------------------------------------------------------------
    @app.get("/v1/models")
    async def models():
        entry = {"id": model_name, "object": "model", "created": 0, "owned_by": "flare",
                 "type": "model", "display_name": model_name, "created_at": "1970-01-01T00:00:00Z"}
        return {"object": "list", "data": [entry], "has_more": False, "first_id": model_name,
                "last_id": model_name}

    @app.get("/health")
    async def health():
        if scheduler.error is not None:
            return JSONResponse({"status": "error", "error": str(scheduler.error)}, status_code=503)
        return {"status": "ok", "model": model_name}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    return app


def build_server(core: str | None, config) -> tuple[FastAPI, Any]:
    """Load ``core`` (None: the cached embedded default) and build the app; returns ``(app, engine)``."""
    from helios.runtime.engine import default_core, load_engine

    metrics = Metrics()
    path = core if core is not None else str(default_core())
    engine = load_engine(path, config, on_replay=metrics.replay, on_gpu_ns=metrics.replay_gpu_ns)
    metrics.steps(engine.driver.replay_keys())
    scheduler = Scheduler(engine, config.queue_timeout_s, metrics, prefix_cache=config.prefix_cache)
    return create_app(engine, scheduler, metrics), engine
