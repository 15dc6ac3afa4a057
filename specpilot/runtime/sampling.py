"""SamplingParams and the sampler: greedy, or temperature / top-k / top-p with each request's own seeded noise stream.

filtered_probs is the one function that turns logits into the distribution a token is drawn from; plain
sampling (sample) and speculative sampling (spec_decode/rejection.py) both read it, so the two draw from the
same distribution by construction. Sampling never syncs with the host: the categorical draw is an exponential
race (argmax of p / Exp(1)), which is exact and needs no torch.multinomial.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: must be >= 0")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k}: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., vocab] -> probabilities after temperature, top-k and top-p, in fp32 (temperature > 0).

    top-k keeps every token tied with the k-th largest logit; top-p keeps the smallest most-likely prefix whose
    mass reaches top_p (the token crossing the threshold stays), then renormalises."""
    logits = logits.float() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token crossing the threshold stays)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, params: SamplingParams, streams: list[NoiseStream] | None,
           position: int) -> torch.Tensor:
    """logits [B, vocab] -> token ids [B] int64, on the logits' device, without a host sync: the argmax when greedy,
    else row b raced with the noise row of output `position` of request b's own stream (streams[b]), so a request
    draws the same tokens in any batch."""
    if params.greedy:
        return logits.argmax(dim=-1)
    noise = torch.cat([s.take(position, 1, logits.shape[-1]) for s in streams])
    return race(filtered_probs(logits, params), None, noise)


def race(probs: torch.Tensor, generator: torch.Generator | None, noise: torch.Tensor | None = None) -> torch.Tensor:
    """probs [..., vocab] (any non-negative weights; no need to normalise) -> one draw per row, int64: the argmax of
    probs / E with E ~ Exp(1) i.i.d., which picks token i with probability probs[i] / sum(probs). `noise`: those E
    given (drawn by exponential_noise), else drawn here from `generator`."""
    if noise is None:
        noise = exponential_noise(probs.shape, generator, probs.device)
    return (probs / noise).argmax(dim=-1)


def race_scores(logits: torch.Tensor, params: SamplingParams, noise: torch.Tensor) -> torch.Tensor:
    """logits [..., vocab], noise [..., vocab] -> log(filtered_probs) - log(noise) in fp32: the race's draw is their
    argmax, and their top-k are k draws without replacement (-inf where filtered_probs is 0)."""
    return filtered_probs(logits, params).log() - noise.log()


def exponential_noise(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Exp(1) draws of `shape` in fp32 from `generator` (the race's noise)."""
    return torch.empty(shape, dtype=torch.float32, device=device).exponential_(generator=generator)


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A request's random stream on `device`: seeded from params.seed, else from a fresh random seed; None when
    greedy (nothing is drawn)."""
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed if params.seed is not None else torch.seed())
    return gen


class NoiseStream:
    """A request's race noise by output position: row k is the Exp(1) row [vocab] that draws its k-th output token,
    drawn from its own generator in position order, one row per draw, as plain sampling of a lone request draws
    them step by step. Speculative sampling reads the rows of the positions a draft tree covers and keeps those it
    did not emit for the next step, so each position's token is raced with the same row whatever tree, drafter or
    batch the request runs in."""

    def __init__(self, params: SamplingParams, vocab: int, device):
        self.generator = make_generator(params, device)
        self.vocab, self.device = vocab, device
        self.start = 0  # output position of rows[0]
        self.rows: list[torch.Tensor] = []

    def take(self, position: int, n: int, vocab: int | None = None) -> torch.Tensor:
        """[n, vocab]: the rows of output positions position .. position + n - 1 (vocab, when given, must be the
        stream's). Rows before `position` are dropped (those tokens are emitted): positions only move forward."""
        if position < self.start:
            raise ValueError(f"noise row {position} was already used (the stream is at row {self.start})")
        if vocab is not None and vocab != self.vocab:
            raise ValueError(f"noise rows of {vocab} tokens asked from a stream of {self.vocab}")
        while self.start + len(self.rows) < position + n:
            self.rows.append(exponential_noise((self.vocab,), self.generator, self.device))
        del self.rows[:position - self.start]
        self.start = position
        return torch.stack(self.rows[:n])
