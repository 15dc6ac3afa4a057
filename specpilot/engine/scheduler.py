"""Scheduler: which requests hold a cache slot, which prefill and how much, and which decode in a step.

Requests wait in a queue (higher priority first, then arrival order) until a slot is free; a slot is one
request's target K/V and recurrent state plus the drafter's, sized for max_model_len tokens, and the number of
slots comes from the memory the caches may take (engine.py sizes them). A finished or aborted request frees its
slot at once and the next step admits a waiting one into it. Admitted, a request prefills in chunks that ride in
the running requests' verify forward, under a per-step token cap (max_prefill_tokens), first admitted first;
then it decodes in every step. A waiting request of higher priority than a running one, with no slot free, takes
that request's slot: the running one is preempted (recompute: it keeps its emitted tokens and prefills them
again when re-admitted; engine/request.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

from specpilot.engine.request import Request, Status


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 32  # requests holding a slot at once (fewer if memory allows fewer)
    max_prefill_tokens: int = 512  # prompt tokens prefilled per step, inside the step's verify forward
    max_model_len: int | None = None  # tokens per slot; None: min(model context, 4096), or the longest request
    memory_fraction: float = 0.85  # of the device memory free at allocation, for the caches (CUDA)
    adaptive: bool = True  # per-request draft nodes from the budget; False: the tree spec's full tree for all

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs}: must be >= 1")
        if self.max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens={self.max_prefill_tokens}: must be >= 1")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction={self.memory_fraction}: must be in (0, 1]")


@dataclass(frozen=True)
class Chunk:
    request: Request
    start: int  # first sequence position of the chunk (tokens already in the slot)
    tokens: tuple[int, ...]

    @property
    def last(self) -> bool:
        """The chunk that completes the request's sequence: its last position's token is the first output."""
        return self.start + len(self.tokens) == len(self.request.sequence)


@dataclass(frozen=True)
class StepPlan:
    decoding: list[Request]  # verified this step, in slot-admission order
    chunks: list[Chunk]  # prefilled this step (one chunk per request at most)
    admitted: list[Request] = field(default_factory=list)  # given a slot this step (their state must be reset)
    preempted: list[Request] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: SchedulerConfig, num_slots: int):
        self.config = config
        self.num_slots = num_slots
        self.free = list(range(num_slots - 1, -1, -1))  # pop() gives the lowest slot
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # prefilling or decoding, in admission order
        self.by_id: dict[str, Request] = {}
        self._order = count()
        self._rank: dict[str, int] = {}  # arrival order, for ties in priority

    def add(self, req: Request) -> None:
        if req.request_id in self.by_id:
            raise ValueError(f"request id {req.request_id!r} is already in use; pass a fresh request_id")
        self.by_id[req.request_id] = req
        self._rank[req.request_id] = next(self._order)
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        preempted = self._preempt_for_priority()
        admitted = []
        while self.waiting and self.free:
            req = self._best_waiting()
            self.waiting.remove(req)
            req.slot, req.status, req.committed = self.free.pop(), Status.PREFILLING, 0
            req.features.clear()
            self.running.append(req)
            admitted.append(req)
        chunks, room = [], self.config.max_prefill_tokens
        for req in self.running:
            if req.status is Status.PREFILLING and room > 0:
                n = min(req.to_prefill, room)
                chunks.append(Chunk(req, req.committed, tuple(req.sequence[req.committed:req.committed + n])))
                room -= n
        decoding = [r for r in self.running if r.status is Status.DECODING]
        return StepPlan(decoding, chunks, admitted, preempted)

    def finish(self, req: Request) -> None:
        """The request is done (or aborted): it leaves at once and its slot is free for the next step."""
        req.status = Status.FINISHED
        if req in self.running:
            self.running.remove(req)
            self.free.append(req.slot)
        elif req in self.waiting:
            self.waiting.remove(req)
        del self.by_id[req.request_id]
        self._rank.pop(req.request_id, None)

    def preempt(self, req: Request) -> None:
        """Recompute: the request gives its slot back and waits again, keeping its emitted tokens."""
        self.running.remove(req)
        self.free.append(req.slot)
        req.slot, req.status, req.committed = -1, Status.WAITING, 0
        req.features.clear()
        req.stats.preempted += 1
        self.waiting.append(req)

    def _best_waiting(self) -> Request:
        return min(self.waiting, key=lambda r: (-r.priority, self._rank[r.request_id]))

    def _preempt_for_priority(self) -> list[Request]:
        out = []
        while self.waiting and not self.free and self.running:
            best = self._best_waiting()
            # the lowest priority running request, the latest admitted among equals
            victim = max(reversed(self.running), key=lambda r: (-r.priority, self._rank[r.request_id]))
            if best.priority <= victim.priority:
                break
            self.preempt(victim)
            out.append(victim)
        return out
