"""EngineLoop on a FakeEngine: every submitted job gets exactly one terminal event; an engine refusal is a Failed
400 (the HTTP answer says the engine's message); a step that raises fails every request in flight with 503 and
turns /health to 503; stop() lets the requests in flight finish and refuses new ones; the bound counts held
jobs."""

from __future__ import annotations

import asyncio

import httpx

from specpilot.runtime.sampling import SamplingParams
from specpilot.server.app import create_app
from specpilot.server.config import ServerConfig
from specpilot.server.engine_loop import EngineLoop
from specpilot.server.job import Job
from specpilot.server.metrics import ServerMetrics
from specpilot.server.stream import Admitted, Failed, Finished, RequestStream, Tokens
from tests.server.conftest import MODEL, running
from tests.server.fakes import FakeEngine


async def _events(stream: RequestStream) -> list:
    events = []
    while not events or not isinstance(events[-1], (Finished, Failed)):
        events.append(await asyncio.wait_for(stream.get(), 10))
    return events


def _run(engine: FakeEngine, jobs: int, max_tokens: int = 3, capacity: int = 100, stop_after_submit=False):
    """Submits `jobs` jobs to a started loop; returns (submit results, each job's events, the loop)."""
    loop = EngineLoop(engine, ServerMetrics(MODEL))
    loop.start(10)

    async def main():
        streams = [RequestStream(asyncio.get_running_loop()) for _ in range(jobs)]
        results = [loop.submit(Job(f"r{i}", [1, 2], SamplingParams(max_new_tokens=max_tokens), s, 0.0), capacity)
                   for i, s in enumerate(streams)]
        if stop_after_submit:
            await asyncio.to_thread(loop.stop, 10)
        return results, [await _events(s) if r is None else [] for s, r in zip(streams, results)]

    results, events = asyncio.run(main())
    return results, events, loop


def test_every_job_is_answered_once_in_full():
    results, events, loop = _run(FakeEngine(slots=2), jobs=5, max_tokens=3)
    assert results == [None] * 5
    for ev in events:
        # the stream merges the Tokens a slow reader finds queued: the ids are what counts, each exactly once
        assert isinstance(ev[0], Admitted) and [t for e in ev[1:-1] for t in e.ids] == [7] * 3
        assert isinstance(ev[-1], Finished) and ev[-1].reason == "length"
    assert loop.finished == 5 and loop.held == 0
    loop.stop(10)
    assert not loop.alive


def test_the_bound_counts_held_jobs():
    results, _, loop = _run(FakeEngine(), jobs=4, capacity=2)
    assert results == [None, None, "full", "full"]
    loop.stop(10)


def test_with_a_verifying_engine_a_steps_events_go_out_during_the_next_verify(monkeypatch):
    from specpilot.server import engine_loop

    engine, during = FakeEngine(slots=2, verifies=True), []
    real = engine_loop.deliver
    monkeypatch.setattr(engine_loop, "deliver", lambda batch: (during.append(engine.in_verify), real(batch)))
    results, events, loop = _run(engine, jobs=5, max_tokens=4)
    assert results == [None] * 5
    for ev in events:  # nothing lost or doubled: the last step's events go out at once (no step follows)
        assert isinstance(ev[0], Admitted) and [t for e in ev[1:-1] for t in e.ids] == [7] * 4
        assert isinstance(ev[-1], Finished)
    assert sum(during) >= engine.steps - 1 and not during[-1]
    loop.stop(10)


def test_stop_drains_the_jobs_in_flight_then_refuses():
    engine = FakeEngine(slots=1)
    results, events, loop = _run(engine, jobs=3, max_tokens=4, stop_after_submit=True)
    assert all(isinstance(ev[-1], Finished) and [t for e in ev[1:-1] for t in e.ids] == [7] * 4 for ev in events)
    assert not loop.alive and engine.steps >= 12
    assert loop.submit(Job("late", [1], SamplingParams(), None, 0.0), 100) == "closed"


def test_an_engine_refusal_is_a_400_with_its_message():
    _, events, loop = _run(FakeEngine(refuse="the engine decodes greedily for now"), jobs=1)
    assert events == [[Failed(400, "the engine decodes greedily for now")]] and loop.held == 0
    loop.stop(10)


def test_a_failed_step_fails_every_request_in_flight():
    _, events, loop = _run(FakeEngine(slots=2, fail_at_step=2), jobs=3, max_tokens=5)
    for ev in events:
        assert isinstance(ev[-1], Failed) and ev[-1].status == 503 and "a kernel failed" in ev[-1].message
        assert [type(e) for e in ev[:-1]] in ([Admitted, Tokens], [Admitted])
    assert not loop.alive and loop.held == 0
    assert loop.submit(Job("late", [1], SamplingParams(), None, 0.0), 100) == "closed"


def test_over_http_refusals_and_failures_answer_in_the_error_json(zoo_tokenizer):
    tokenizer = zoo_tokenizer
    with running(create_app(FakeEngine(refuse="temperature 0.7: not supported here"), tokenizer,
                            ServerConfig(MODEL))) as url:
        response = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "temperature": 0.7})
        assert response.status_code == 400
        assert response.json()["error"]["message"] == "temperature 0.7: not supported here"
    with running(create_app(FakeEngine(fail_at_step=1), tokenizer, ServerConfig(MODEL))) as url:
        response = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 4})
        assert response.status_code == 503 and "a kernel failed" in response.json()["error"]["message"]
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and "a kernel failed" in health.json()["reason"]
        response = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 4})
        assert response.status_code == 503 and response.json()["error"]["code"] == "unavailable"


def test_a_request_the_engine_drops_is_failed_not_waited_on():
    class Dropping(FakeEngine):
        def step(self):
            self.requests.clear()
            self._sync()
            return []

    _, events, loop = _run(Dropping(), jobs=2)
    assert all(isinstance(ev[-1], Failed) and "holds none of the 2 requests" in ev[-1].message for ev in events)
    assert loop.held == 0
