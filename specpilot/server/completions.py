"""Completions: what /v1/completions and /v1/chat/completions do with a request, from its body to the last byte
of its answer: the model name (404), unsupported parameters (400), the prompt's token ids, the length checks
(413 for a prompt that leaves no room to generate, 400 for a max_tokens past the model length), the sampling
parameters (400 for what SamplingParams or the engine refuses), the queue bound (429), then the engine's tokens
as one response or as server-sent events. A stream whose client goes away aborts its request at once, freeing
its slot; so does a non-streaming request whose client disconnects before the answer.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from specpilot.engine.detokenizer import Detokenizer, decode_text
from specpilot.runtime.sampling import SamplingParams
from specpilot.server.config import ServerConfig
from specpilot.server.encoder import PromptEncoder
from specpilot.server.engine_loop import EngineLoop
from specpilot.server.errors import APIError, bad_request, error_body
from specpilot.server.job import Job
from specpilot.server.protocol import (ChatCompletionRequest, ChatFormat, CompletionFormat, CompletionRequest,
                                       usage)
from specpilot.server.stream import Failed, RequestStream, Tokens

# the engine's finish reasons as OpenAI names them
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort"}


class Completions:
    def __init__(self, loop: EngineLoop, encoder: PromptEncoder, config: ServerConfig, max_model_len: int):
        self.loop, self.encoder, self.config, self.max_model_len = loop, encoder, config, max_model_len
        self.tokenizer = encoder.tokenizer
        self._latency = 0.0  # recent requests' mean latency (EMA), for Retry-After

    @property
    def capacity(self) -> int:
        """Requests held at most: the engine's slots (max_num_seqs, or fewer where the memory holds fewer) and
        max_waiting more."""
        sched = self.loop.engine.scheduler
        slots = sched.num_slots if sched is not None else self.loop.engine.config.max_num_seqs
        return slots + self.config.max_waiting

    async def completion(self, body: CompletionRequest, request: Request):
        self._check_model(body.model)
        body.check_supported()
        ids = self.encoder.completion(body.prompt)
        return await self._run(body, request, ids, body.max_tokens, self.config.completion_max_tokens,
                               CompletionFormat)

    async def chat(self, body: ChatCompletionRequest, request: Request):
        self._check_model(body.model)
        body.check_supported()
        ids = self.encoder.chat(body.messages)
        return await self._run(body, request, ids, body.max_completion_tokens or body.max_tokens, None, ChatFormat)

    # ---- checks -----------------------------------------------------------------------------------------------

    def _check_model(self, model: str) -> None:
        if model != self.config.model_name:
            raise APIError(404, f"The model `{model}` does not exist; this server serves `{self.config.model_name}` "
                                "(GET /v1/models)", param="model", code="model_not_found")

    def _max_tokens(self, prompt_len: int, asked: int | None, default: int | None, param: str) -> int:
        room = self.max_model_len - prompt_len
        if room < 1:
            raise APIError(413, f"{param}: {prompt_len} tokens, and this server's model length is "
                                f"{self.max_model_len} tokens (prompt and completion together), which leaves no room "
                                "to generate; shorten the prompt", param=param, code="context_length_exceeded")
        if asked is None:
            return room if default is None else min(default, room)
        if asked > room:
            raise bad_request(f"max_tokens={asked} with a prompt of {prompt_len} tokens exceeds this server's model "
                              f"length of {self.max_model_len} tokens; ask for at most {room} tokens",
                              "max_tokens", code="context_length_exceeded")
        return asked

    @staticmethod
    def _sampling(body, max_tokens: int) -> SamplingParams:
        fields = {"max_new_tokens": max_tokens, "stop": body.stop_strings(), "seed": body.seed,
                  "ignore_eos": body.ignore_eos}
        for name in ("temperature", "top_p", "top_k"):
            if getattr(body, name) is not None:
                fields[name] = getattr(body, name)
        try:
            return SamplingParams(**fields)
        except (ValueError, NotImplementedError) as e:
            raise bad_request(str(e)) from e

    # ---- running it -------------------------------------------------------------------------------------------

    async def _run(self, body, request: Request, ids: list[int], asked: int | None, default: int | None, fmt_cls):
        arrival = time.perf_counter()
        params = self._sampling(body, self._max_tokens(len(ids), asked, default, fmt_cls.prompt_param))
        rid = f"{fmt_cls.prefix}-{uuid.uuid4().hex}"
        stream = RequestStream(asyncio.get_running_loop())
        capacity = self.capacity
        refused = self.loop.submit(Job(rid, ids, params, stream, arrival), capacity)
        if refused == "full":
            raise APIError(429, f"the server holds {capacity} requests already (its queue is full); retry "
                                "after the Retry-After seconds", type="rate_limit_exceeded", code="queue_full",
                           headers={"Retry-After": str(self._retry_after())})
        if refused == "closed":
            raise APIError(503, "the server is shutting down or its engine failed", type="server_error",
                           code="unavailable")
        first = await stream.get()
        if isinstance(first, Failed):
            raise APIError(first.status, first.message, type="server_error" if first.status >= 500 else
                           "invalid_request_error")
        fmt = fmt_cls(rid, int(time.time()), self.config.model_name, body.return_token_ids)
        text = _Text(self.tokenizer, params.stop)
        if body.stream:
            answered = []  # holds True once the stream sent its terminal event

            def close() -> None:
                if not answered:
                    self.loop.abort(rid)

            events = self._events(stream, fmt, text, len(ids), body.include_usage, arrival, answered)
            return _EventStream(events, close, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await self._collect(stream, fmt, text, len(ids), rid, request, arrival)

    async def _collect(self, stream: RequestStream, fmt, text: "_Text", prompt_len: int, rid: str,
                       request: Request, arrival: float):
        """The whole answer at once; a client gone before it aborts the request."""
        result = asyncio.ensure_future(self._drain(stream))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not result.done():
                self.loop.abort(rid)
                result.cancel()
        if not result.done() or result.cancelled():
            return JSONResponse(error_body("client disconnected"), status_code=499)
        ids, end = result.result()
        if isinstance(end, Failed):
            raise APIError(end.status, end.message, type="server_error")
        self._note_latency(arrival)
        text.push(ids)  # the stop strings' cut, as the engine made it
        final = text.final(ids)
        return JSONResponse(fmt.response(final, FINISH[end.reason], ids, usage(prompt_len, len(ids)), end.spec))

    @staticmethod
    async def _drain(stream: RequestStream):
        ids = []
        while True:
            event = await stream.get()
            if isinstance(event, Tokens):
                ids += event.ids
            else:
                return ids, event

    async def _events(self, stream: RequestStream, fmt, text: "_Text", prompt_len: int, include_usage: bool,
                      arrival: float, answered: list) -> AsyncIterator[str]:
        """Server-sent events: a chunk per engine step that adds text, the last with the finish reason and
        spec_stats, the usage chunk if asked, then [DONE] (and `answered` gets True)."""
        ids = []
        opening = fmt.opening()
        if opening is not None:
            yield _sse(opening)
        while True:
            event = await stream.get()
            if isinstance(event, Tokens):
                ids += event.ids
                delta = text.push(event.ids)
                if delta or fmt.token_ids:
                    yield _sse(fmt.chunk(delta, event.ids))
                continue
            answered.append(True)
            if isinstance(event, Failed):
                yield _sse(error_body(event.message, "server_error"))
            else:
                self._note_latency(arrival)
                yield _sse(fmt.chunk(text.rest(ids), [], FINISH[event.reason]) | {"spec_stats": event.spec})
                if include_usage:
                    yield _sse(fmt.usage_chunk(usage(prompt_len, len(ids))))
            yield "data: [DONE]\n\n"
            return

    def _note_latency(self, arrival: float) -> None:
        self._latency += 0.1 * (time.perf_counter() - arrival - self._latency)

    def _retry_after(self) -> int:
        """Seconds until a place is likely free: the recent mean latency, at least the configured floor."""
        return max(self.config.retry_after_s, math.ceil(self._latency))


class _Text:
    """A request's output text as it streams: what the Detokenizer releases (complete characters, never part of a
    stop string), then the rest of the final text (what offline generation returns) at the end."""

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.tokenizer, self.detok, self.shown = tokenizer, Detokenizer(tokenizer, stop), 0

    def push(self, ids: list[int]) -> str:
        out = "".join(self.detok.push(t) for t in ids)
        self.shown += len(out)
        return out

    def final(self, ids: list[int]) -> str:
        return self.detok.text if self.detok.stopped else decode_text(self.tokenizer, ids)

    def rest(self, ids: list[int]) -> str:
        return self.final(ids)[self.shown:]


class _EventStream(StreamingResponse):
    """A StreamingResponse that, whichever way it ends (the client gone included, even before the first event),
    closes its event generator and calls on_close: the request is aborted unless it was answered."""

    def __init__(self, events: AsyncIterator[str], on_close, **kwargs):
        super().__init__(events, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            self.on_close()


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body is read already, so the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
