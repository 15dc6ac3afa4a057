"""Request: one generation's state as the scheduler and the engine step move it (waiting, prefilling in chunks,
decoding, finished), and RequestOutput, what a step hands its client for it.

A request's target sequence is its prompt, then its emitted tokens; the cache of its slot holds the first
`committed` of them, and the last emitted token (the root) is not in it yet. Preempted (recompute), a request
keeps its emitted tokens and loses its slot: re-admitted, it prefills prompt + emitted[:-1] again and goes on
from the last emitted token, so its output is the one it would have had uninterrupted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from specpilot.engine.detokenizer import Detokenizer
from specpilot.engine.generator import GenerationResult
from specpilot.engine.stats import SpecStats
from specpilot.runtime.sampling import NoiseStream, SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"  # no slot
    PREFILLING = "prefilling"  # a slot; its sequence goes into the cache chunk by chunk
    DECODING = "decoding"  # in every step's verify
    FINISHED = "finished"


@dataclass(slots=True)
class Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    arrival: float  # perf_counter seconds
    result: GenerationResult
    stats: SpecStats
    detok: Detokenizer | None = None
    priority: int = 0  # higher runs first; a waiting request may preempt a running one of lower priority
    tracker: object | None = None  # engine.budget.AcceptanceTracker, when the engine speculates
    status: Status = Status.WAITING
    slot: int = -1
    committed: int = 0  # tokens of the sequence whose K/V and state the slot holds
    root: int = -1  # last emitted token, not yet seen by the target
    features: list[torch.Tensor] = field(default_factory=list)  # the drafter's target features, chunk by chunk
    new_tokens: list[int] = field(default_factory=list)  # emitted since the client last got an output
    noise: NoiseStream | None = None  # a sampling request's own random stream, made at its first draw

    @property
    def sequence(self) -> list[int]:
        """What the slot must hold before the request decodes: the prompt, and on resumption every emitted token
        but the last (the root)."""
        return self.prompt + self.result.token_ids[:-1]

    @property
    def to_prefill(self) -> int:
        return len(self.sequence) - self.committed

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def noise_rows(self, n: int, vocab: int, device) -> torch.Tensor:
        """[n, vocab]: the race noise of the request's next n output positions, from its own stream seeded by
        params.seed (or a random seed): what it draws does not depend on the batch it shares."""
        if self.noise is None:
            self.noise = NoiseStream(self.params, vocab, device)
        return self.noise.take(len(self.result.token_ids), n, vocab)


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "length" | "eos" | "stop" | "abort" once finished
