"""Job: one request as the engine loop carries it: what to add to the engine, where its events go, and what the
loop measures of it (arrival, first token, tokens, the speculative counters already reported)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specpilot.runtime.sampling import SamplingParams
from specpilot.server.stream import RequestStream


@dataclass(slots=True)
class Job:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: RequestStream
    arrival: float  # perf_counter seconds when the HTTP request came in
    first_token: float | None = None
    last_token: float | None = None  # when the request's latest tokens came
    tokens: int = 0
    steps_seen: int = 0  # SpecStats.nodes / .accepted entries already counted in the metrics
    per_pos_seen: list[int] = field(default_factory=list)  # SpecStats.accepted_per_depth already counted
