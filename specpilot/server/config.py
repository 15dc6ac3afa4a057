"""ServerConfig: what the HTTP layer decides for itself (the name clients ask for, the queue bound, the chat
template); the engine's own settings (slots, model length) travel in its SchedulerConfig."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerConfig:
    model_name: str  # the `model` clients send; any other name is answered 404
    max_waiting: int = 256  # requests held beyond the engine's running batch; past them, 429
    chat_template: str | None = None  # a Jinja template replacing the tokenizer's own
    completion_max_tokens: int = 16  # /v1/completions without max_tokens (OpenAI's default)
    retry_after_s: int = 1  # the smallest Retry-After of a 429

    def __post_init__(self):
        if not self.model_name:
            raise ValueError("the served model name is empty; pass --served-model-name NAME")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting={self.max_waiting}: must be >= 0")
        if self.completion_max_tokens < 1:
            raise ValueError(f"completion_max_tokens={self.completion_max_tokens}: must be >= 1")
        if self.retry_after_s < 1:
            raise ValueError(f"retry_after_s={self.retry_after_s}: must be >= 1")
