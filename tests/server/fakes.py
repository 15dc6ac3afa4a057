"""FakeEngine: SpecEngine's client API (add_request, step, abort, stats, warmup, scheduler counts) without a model:
each step emits one token per request (a fixed id) until max_new_tokens; with verifies=True each step calls the
engine's while_verifying hook first, as a verify step does. For testing the engine loop's
bookkeeping and failure paths in milliseconds; step_s slows each step down (a run to interrupt)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from specpilot.engine.request import RequestOutput
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.engine.stats import SpecStats


class FakeEngine:
    def __init__(self, slots: int = 2, refuse: str | None = None, fail_at_step: int | None = None, token: int = 7,
                 verifies: bool = False, step_s: float = 0.0):
        self.runner = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=2048, vocab_size=100))
        self.config = SchedulerConfig(max_num_seqs=slots, max_model_len=64)
        self.scheduler = None
        self.refuse, self.fail_at_step, self.token = refuse, fail_at_step, token
        self.requests: dict[str, list] = {}  # id -> [params, emitted]
        self.steps = 0
        self.aborted: list[str] = []
        self.verifies = verifies  # each step calls while_verifying, as SpecEngine's verify does
        self.while_verifying = None
        self.in_verify = False  # True while the hook runs
        self.step_s = step_s  # each step sleeps this long (a GPU's share of a step)

    def warmup(self) -> dict:
        self.scheduler = SimpleNamespace(running=[], waiting=[], num_slots=self.config.max_num_seqs)
        return {}

    def add_request(self, prompt_ids, params, request_id=None, priority=0) -> str:
        if self.refuse:
            raise ValueError(self.refuse)
        self.requests[request_id] = [params, 0]
        self._sync()
        return request_id

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        if self.fail_at_step == self.steps:
            raise RuntimeError("a kernel failed")
        if self.verifies and self.while_verifying is not None:
            self.in_verify = True
            self.while_verifying()
            self.in_verify = False
        if self.step_s:
            time.sleep(self.step_s)
        outputs = []
        for rid in list(self.requests)[:self.config.max_num_seqs]:
            params, n = self.requests[rid]
            self.requests[rid][1] = n + 1
            done = n + 1 >= params.max_new_tokens
            outputs.append(RequestOutput(rid, [self.token], done, "length" if done else None))
            if done:
                del self.requests[rid]
        self._sync()
        return outputs

    def abort(self, request_id: str) -> None:
        del self.requests[request_id]
        self.aborted.append(request_id)
        self._sync()

    def stats(self, request_id: str) -> SpecStats:
        return SpecStats()

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def _sync(self) -> None:
        ids = list(self.requests)
        self.scheduler.running = ids[:self.config.max_num_seqs]
        self.scheduler.waiting = ids[self.config.max_num_seqs:]
