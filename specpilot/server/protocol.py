"""The OpenAI wire format: request bodies of /v1/completions and /v1/chat/completions (pydantic models), and the
responses and stream chunks of each (plain dicts built by CompletionFormat and ChatFormat).

Beyond OpenAI's fields a response carries `spec_stats` (what speculation did for it). Two of vLLM's request
extensions are taken: `return_token_ids: true` (each choice carries its `token_ids`; a stream chunk, the tokens
it adds) and `ignore_eos: true`; and `top_k`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from specpilot.server.errors import bad_request


class StreamOptions(BaseModel):
    include_usage: bool = False


class _GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # fields of the API this server ignores (user, metadata, ...)

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None  # omitted: 0 (greedy), see docs/server.md
    top_p: float | None = None
    top_k: int | None = None  # vLLM's extension
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens tokens whatever comes
    # accepted only at the values that change nothing
    best_of: int | None = None
    logprobs: bool | int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def check_supported(self) -> None:
        """400 for a parameter this server cannot honour (rather than silently ignoring it)."""
        if self.n not in (None, 1):
            raise bad_request(f"n={self.n}: this server returns one choice per request; send n=1 (or leave it out) "
                              "and send several requests instead", "n")
        if self.best_of not in (None, 1):
            raise bad_request(f"best_of={self.best_of}: not supported; leave it out", "best_of")
        if self.logprobs not in (None, False, 0):
            raise bad_request("logprobs are not supported; leave logprobs out", "logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0):
                raise bad_request(f"{name} is not supported; leave it out or send 0", name)
        if self.logit_bias:
            raise bad_request("logit_bias is not supported; leave it out", "logit_bias")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise bad_request("echo is not supported; leave it out", "echo")
        if self.suffix:
            raise bad_request("suffix is not supported; leave it out", "suffix")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionFormat:
    """/v1/completions: `text_completion` objects."""

    prefix = "cmpl"
    prompt_param = "prompt"

    def __init__(self, request_id: str, created: int, model: str, token_ids: bool):
        self.head = {"id": request_id, "object": "text_completion", "created": created, "model": model}
        self.token_ids = token_ids

    def response(self, text: str, finish_reason: str, ids: list[int], usage: dict, spec: dict) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self.head | {"choices": [self._ids(choice, ids)], "usage": usage, "spec_stats": spec}

    def opening(self) -> dict | None:
        return None

    def chunk(self, text: str, ids: list[int], finish_reason: str | None = None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self.head | {"choices": [self._ids(choice, ids)]}

    def usage_chunk(self, usage: dict) -> dict:
        return self.head | {"choices": [], "usage": usage}

    def _ids(self, choice: dict, ids: list[int]) -> dict:
        return choice | {"token_ids": ids} if self.token_ids else choice


class ChatFormat(CompletionFormat):
    """/v1/chat/completions: `chat.completion` objects and `chat.completion.chunk` deltas."""

    prefix = "chatcmpl"
    prompt_param = "messages"

    def __init__(self, request_id: str, created: int, model: str, token_ids: bool):
        super().__init__(request_id, created, model, token_ids)
        self.head["object"] = "chat.completion"
        self.chunk_head = self.head | {"object": "chat.completion.chunk"}

    def response(self, text: str, finish_reason: str, ids: list[int], usage: dict, spec: dict) -> dict:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        return self.head | {"choices": [self._ids(choice, ids)], "usage": usage, "spec_stats": spec}

    def opening(self) -> dict:
        """The first chunk: the assistant's role, no text yet (as OpenAI streams it)."""
        return self.chunk_head | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                               "logprobs": None, "finish_reason": None}]}

    def chunk(self, text: str, ids: list[int], finish_reason: str | None = None) -> dict:
        delta = {"content": text} if text or finish_reason is None else {}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self.chunk_head | {"choices": [self._ids(choice, ids)]}

    def usage_chunk(self, usage: dict) -> dict:
        return self.chunk_head | {"choices": [], "usage": usage}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
