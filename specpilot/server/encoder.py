"""PromptEncoder: a request's prompt as token ids: a completion's prompt (text, or token ids), a chat's messages
through the chat template (the tokenizer's, or the server's --chat-template)."""

from __future__ import annotations

from specpilot.server.errors import bad_request
from specpilot.server.protocol import ChatMessage


class PromptEncoder:
    def __init__(self, tokenizer, vocab_size: int, chat_template: str | None = None):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None) or None

    def completion(self, prompt) -> list[int]:
        """A string, a list of token ids, or a batch of one of either."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise bad_request(f"prompt: a batch of {len(prompt)} prompts; this server takes one prompt per "
                                  "request, send one request each", "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            ids = list(prompt)
            bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise bad_request(f"prompt: token id {bad} is outside the model's vocabulary of {self.vocab_size}",
                                  "prompt")
        if not ids:
            raise bad_request("prompt: encodes to zero tokens; send a non-empty prompt", "prompt")
        return ids

    def chat(self, messages: list[ChatMessage]) -> list[int]:
        if self.chat_template is None:
            raise bad_request("this model's tokenizer has no chat template, so /v1/chat/completions cannot format "
                              "messages; use /v1/completions, or start the server with --chat-template FILE",
                              "messages", code="no_chat_template")
        conversation = [{"role": m.role, "content": _text(m, i)} for i, m in enumerate(messages)]
        try:
            ids = self.tokenizer.apply_chat_template(conversation, chat_template=self.chat_template,
                                                     add_generation_prompt=True, tokenize=True, return_dict=False)
        except Exception as e:  # noqa: BLE001 (jinja's TemplateError, or raise_exception() inside the template)
            raise bad_request(f"messages: the chat template refused them: {e}", "messages") from e
        if not ids:
            raise bad_request("messages: the chat template gives zero tokens", "messages")
        return list(ids)


def _text(message: ChatMessage, index: int) -> str:
    """A message's content as one string: a string, or its text parts joined."""
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    parts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise bad_request(f"messages[{index}].content: a part of type {part.type!r}; this server takes text "
                              "parts only", f"messages.{index}.content")
        parts.append(part.text)
    return "".join(parts)
