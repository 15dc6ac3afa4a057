"""Generator: the autoregressive loop over a batch of prompts (prefill, decode, sample, stop checks). Each request
samples from its own noise stream (seeded by SamplingParams.seed), so its output is the same in any batch.

The host reads each step's tokens one step late: step n+1 is already queued on the GPU when the host copies
and checks the tokens of step n, so the device never waits for Python. Stops: EOS, max_new_tokens, and stop
strings (matched by a Detokenizer per request in O(1) per token; the text is cut before the stop string).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specpilot.engine.detokenizer import Detokenizer, decode_text
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import NoiseStream, SamplingParams, sample


@dataclass(slots=True)
class GenerationResult:
    prompt_len: int
    token_ids: list[int] = field(default_factory=list)
    text: str | None = None
    finish_reason: str = "length"  # "length" | "eos" | "stop"
    ttft_s: float = 0.0
    total_s: float = 0.0


class Generator:
    """prefill_together: a batch's prompts in one ModelRunner.prefill_many where the model allows it (an
    attention-only model, or prompts of one length), for drafter training's rollouts; else one prefill each."""

    def __init__(self, runner: ModelRunner, eos_ids: tuple[int, ...] = (), tokenizer=None,
                 prefill_together: bool = False):
        self.runner, self.eos_ids, self.tokenizer = runner, set(eos_ids), tokenizer
        self.prefill_together = prefill_together

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None) -> list[GenerationResult]:
        """prompts: token ids per request. on_token(request_index, token_id) is called as tokens arrive."""
        self._check(prompts, params)
        detoks = [stop_detokenizer(self.tokenizer, params) for _ in prompts]
        runner, dev = self.runner, self.runner.device
        start = time.perf_counter()
        B = len(prompts)
        runner.allocate(B, max(map(len, prompts)) + params.max_new_tokens + 1)
        if self._together(prompts):
            logits = runner.prefill_many(prompts)
        else:
            logits = torch.stack([runner.prefill(i, p) for i, p in enumerate(prompts)])
        # one noise stream per request, as the speculative engine keeps (Request.noise): a request's draws do not
        # depend on the batch it shares
        streams = None if params.greedy else [NoiseStream(params, logits.shape[-1], dev) for _ in prompts]
        tokens = sample(logits, params, streams, 0)
        positions = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)
        results = [GenerationResult(prompt_len=len(p)) for p in prompts]
        finished = [False] * B
        reader = _TokenReader(tokens)
        for step in range(params.max_new_tokens):
            more = step + 1 < params.max_new_tokens
            if more:  # queue the next step before reading this one's tokens
                next_tokens = sample(runner.decode(tokens, positions), params, streams, step + 1)
            host = reader.read()
            now = time.perf_counter()
            for i, tok in enumerate(host):
                if not finished[i]:
                    finished[i] = self._append(results[i], tok, params, now - start, on_token, i, detoks[i])
            if all(finished) or not more:
                break
            tokens = next_tokens
            reader = _TokenReader(tokens)
        total = time.perf_counter() - start
        for r in results:
            r.total_s = total
            if self.tokenizer is not None and r.text is None:
                r.text = decode_text(self.tokenizer, r.token_ids)
        return results

    def _together(self, prompts: list[list[int]]) -> bool:
        return self.prefill_together and len(prompts) > 1 and (
            not self.runner.config.is_hybrid or len(set(map(len, prompts))) == 1)

    def _check(self, prompts: list[list[int]], params: SamplingParams) -> None:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        limit = self.runner.config.max_position_embeddings
        longest = max(map(len, prompts))
        if longest + params.max_new_tokens > limit:
            raise ValueError(f"prompt of {longest} tokens + max_new_tokens={params.max_new_tokens} exceeds the "
                             f"model's context of {limit} tokens; shorten the prompt or lower max_new_tokens")

    def _append(self, r: GenerationResult, tok: int, params: SamplingParams, elapsed: float, on_token, index,
                detok: Detokenizer | None) -> bool:
        if on_token is not None:
            on_token(index, tok)
        return append_token(r, tok, params, self.eos_ids, detok, elapsed)


def stop_detokenizer(tokenizer, params: SamplingParams) -> Detokenizer | None:
    """A request's stop-string matcher, or None when there are no stop strings."""
    if params.stop and tokenizer is None:
        raise ValueError("stop strings need a tokenizer to detokenise the output")
    return Detokenizer(tokenizer, params.stop) if params.stop else None


def append_token(r: GenerationResult, tok: int, params: SamplingParams, eos_ids: set[int],
                 detok: Detokenizer | None, elapsed: float) -> bool:
    """Appends one emitted token and applies the stop rules (EOS, stop strings, max_new_tokens); returns True when
    the request is finished. Shared by the AR generator and the speculative engine; detok is the request's
    stop_detokenizer and sees every token of the request in order."""
    if not r.token_ids:
        r.ttft_s = elapsed
    r.token_ids.append(tok)
    if tok in eos_ids and not params.ignore_eos:
        r.finish_reason = "eos"
    elif detok is not None:
        detok.push(tok)
        if detok.stopped:
            r.text, r.finish_reason = detok.text, "stop"
    return r.finish_reason != "length" or len(r.token_ids) >= params.max_new_tokens


class _TokenReader:
    """Copies a step's token ids to the host without waiting for work queued after them."""

    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens
        if tokens.is_cuda:
            self.host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self.host.copy_(tokens, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()

    def read(self) -> list[int]:
        if not self.tokens.is_cuda:
            return self.tokens.tolist()
        self.event.synchronize()
        return self.host.tolist()
