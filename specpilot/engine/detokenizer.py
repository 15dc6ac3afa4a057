"""Detokenizer: one request's output text, built token by token in O(1) per token, and its stop strings.

The text is always `tokenizer.decode(ids, skip_special_tokens=True)` (decode_text), produced one of two ways:
- fast: tokenizers' DecodeStream on the backend `tokenizers.Tokenizer` of a Hugging Face fast tokenizer, which
  decodes only a short window of recent tokens per step;
- plain: a full decode of the whole output on every token (the reference), for a tokenizer without a backend
  (the ByteTokenizer of the random-weight benchmarks), one whose decode post-processes the backend's text
  (clean_up_tokenization), a stop string containing U+FFFD, and for the rest of a request once a token rewrote
  text before it for good (a byte-fallback decoder shows every byte of a run of <0xNN> tokens as U+FFFD when
  the run is not valid UTF-8).
A trailing incomplete UTF-8 character (the text ends in U+FFFD) is held back until a later token completes it.

Stop strings are matched on exactly the text a full decode gives at that token, trailing U+FFFD included, so a
request stops at the same token and with the same text as a full decode cut before its first stop string.
(While a byte-fallback run ends in an incomplete character, a full decode shows the whole run as U+FFFD,
characters already shown included; the fast path does not see that text, which only a stop string containing
U+FFFD could match.)
push() returns only text that can no longer become part of a stop string: the longest tail of the text that is
a proper prefix of some stop string is held back until it is resolved.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

_INCOMPLETE = "\ufffd"  # what a decode shows for a UTF-8 character whose bytes have not all arrived


def decode_text(tokenizer, ids: list[int]) -> str:
    """The reference text of a request's tokens (special tokens dropped)."""
    return tokenizer.decode(ids, skip_special_tokens=True)


class Detokenizer:
    """Feeds one request's tokens in order; push() returns the text that became safe to show."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.stop = tuple(s for s in stop if s)
        backend = _backend(tokenizer) if not any(_INCOMPLETE in s for s in self.stop) else None
        self.tokenizer, self.stream = tokenizer, _Stream(backend) if backend is not None else None
        self.ids: list[int] = []
        self.stopped = False
        self.text: str | None = None  # the final text, cut before the first stop string, once stopped
        self._shown: list[str] = []
        self._shown_len = 0
        self._held = ""  # fast path: complete text not shown yet, a tail that could still begin a stop string

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(token)
        if self.stream is not None:
            try:
                return self._push_fast(token)
            except _Rewritten:
                self.stream = None
        return self._push_plain()

    def _push_fast(self, token: int) -> str:
        chunk = self.stream.step(token)
        # every stop string occurrence that was not in the previous text starts inside `region` (the text
        # before it was shown, so it was not the beginning of any stop string)
        region = self._held + (chunk or "")
        if self.stop:
            full = region if chunk is not None else region + self.stream.pending()
            cut = _first_stop(full, self.stop)
            if cut is not None:
                return self._stop_at(full[:cut], "".join(self._shown) + full[:cut])
        keep = _stop_prefix_len(region, self.stop)
        self._held = region[len(region) - keep:]
        return self._show(region[:len(region) - keep])

    def _push_plain(self) -> str:
        text = decode_text(self.tokenizer, self.ids)
        cut = _first_stop(text, self.stop)
        if cut is not None:
            return self._stop_at(text[self._shown_len:cut], text[:cut])
        if text.endswith(_INCOMPLETE):
            return ""
        return self._show(text[self._shown_len:len(text) - _stop_prefix_len(text, self.stop)])

    def _show(self, out: str) -> str:
        if out:
            self._shown.append(out)
            self._shown_len += len(out)
        return out

    def _stop_at(self, out: str, text: str) -> str:
        self.stopped, self.text = True, text
        return self._show(out)


def _first_stop(text: str, stop: tuple[str, ...]) -> int | None:
    """Where the earliest stop string in text begins, or None."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(hits) if hits else None


def _stop_prefix_len(text: str, stop: tuple[str, ...]) -> int:
    """Length of the longest tail of text that is a proper prefix of a stop string."""
    best = 0
    for s in stop:
        j = text.find(s[0], max(0, len(text) - len(s) + 1))  # the earliest start gives the longest tail
        while 0 <= j < len(text) - best:
            if s.startswith(text[j:]):
                best = len(text) - j
                break
            j = text.find(s[0], j + 1)
    return best


def _backend(tokenizer) -> Tokenizer | None:
    """The backend tokenizers.Tokenizer when tokenizer.decode is exactly its decode, else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        return None
    # transformers applies clean_up_tokenization (" ." -> ".", across token boundaries) after the backend's
    # decode, except on BPE models unless forced; such a text is not built by appending chunks
    cleans = getattr(tokenizer, "clean_up_tokenization_spaces", False) and (
        type(backend.model).__name__ != "BPE"
        or getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False))
    return None if cleans else backend


class _Rewritten(Exception):
    """A token changed the text of tokens before it: the request continues on the plain path."""


class _Stream:
    """DecodeStream on the backend tokenizer. step() returns the next complete chunk of text or None.

    DecodeStream decodes a window: the tokens from its previous chunk's start on, and returns what the newest
    tokens add to the text of the window's first `prefix_len` tokens. `window` and `prefix_len` follow it, so
    pending() can tell what the tokens after the last chunk decode to while DecodeStream holds them back.
    """

    def __init__(self, backend: Tokenizer):
        self.backend, self.stream = backend, DecodeStream(skip_special_tokens=True)
        self.window: list[int] = []
        self.prefix_len = 0

    def step(self, token: int) -> str | None:
        self.window.append(token)
        try:
            chunk = self.stream.step(self.backend, token)
        except Exception as e:  # tokenizers raises a bare Exception when the window's text lost its prefix
            raise _Rewritten from e
        if chunk is not None:
            del self.window[:self.prefix_len]
            self.prefix_len = len(self.window)
        return chunk

    def pending(self) -> str:
        """What a full decode shows after the last chunk (U+FFFD for an incomplete character); "" while the
        window's text does not extend its prefix (an incomplete byte-fallback run shown as U+FFFD)."""
        if self.prefix_len == len(self.window):
            return ""
        prefix = self.backend.decode(self.window[:self.prefix_len], skip_special_tokens=True)
        text = self.backend.decode(self.window, skip_special_tokens=True)
        return text[len(prefix):] if text.startswith(prefix) else ""
