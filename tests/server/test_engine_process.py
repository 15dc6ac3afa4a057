"""`specpilot serve --engine-process`: the engine in a child process (server/engine_process.py). The zoo's target
answers the same tokens as offline generate at temperature 0, streamed and whole; a client that goes away aborts
its request in the child; a refused add is a 400; a killed child fails the requests in flight with 503 and turns
/health to 503 without hanging; shutdown drains the streams in flight, then the child exits; an engine the child
cannot build is a ValueError."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import signal
import threading
import time

import httpx
import pytest

from specpilot.cli import _parser, serve_app
from specpilot.runtime.sampling import SamplingParams
from specpilot.server.app import create_app
from specpilot.server.config import ServerConfig
from specpilot.server.engine_process import RemoteEngine
from tests.server.conftest import MODEL, build_engine, running
from tests.server.fakes import FakeEngine

PROMPTS = ["def fibonacci(n):\n", "class Stack:\n    def __init__(self):\n"]
REFUSED_ID = 5  # PickyEngine refuses a prompt that starts with this id


class PickyEngine(FakeEngine):
    """A FakeEngine that refuses prompts starting with REFUSED_ID (built in the child)."""

    def add_request(self, prompt_ids, params, request_id=None, priority=0) -> str:
        if prompt_ids[0] == REFUSED_ID:
            raise ValueError(f"prompt id {REFUSED_ID}: refused by the engine")
        return super().add_request(prompt_ids, params, request_id, priority)


@pytest.fixture(scope="module")
def remote(zoo_path):
    """`specpilot serve --engine-process` on the zoo's hybrid target: n-gram drafter, 4 slots of 256 tokens."""
    args = _parser().parse_args(["serve", "--target", zoo_path, "--drafter", "ngram", "--max-num-seqs", "4",
                                 "--max-model-len", "256", "--served-model-name", MODEL, "--device", "cpu",
                                 "--dtype", "float32", "--engine-process"])
    app = serve_app(args)
    engine = app.state.engine_loop.engine
    assert isinstance(engine, RemoteEngine)
    with running(app) as url:
        yield app, url
    assert engine.process.exitcode == 0  # shutdown closed the child


def _stream(url: str, body: dict, on_first=None) -> tuple[list[dict], bool]:
    """A streamed completion's JSON events and whether [DONE] ended it; on_first() after the first event."""
    events, done = [], False
    with httpx.stream("POST", url + "/v1/completions", json=body | {"model": MODEL, "stream": True},
                      timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            events.append(json.loads(line[6:]))
            if len(events) == 1 and on_first is not None:
                on_first()
    return events, done


def test_the_engine_process_answers_offline_generates_tokens(remote, zoo):
    _, url = remote
    engine = build_engine(zoo, ["--drafter", "ngram"], 4)
    for prompt in PROMPTS:
        ids = zoo[1].encode(prompt, add_special_tokens=True)
        result, _ = engine.generate([ids], SamplingParams(max_new_tokens=24, ignore_eos=True))[0]
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        whole = httpx.post(url + "/v1/completions", json=body | {"model": MODEL}, timeout=60).json()
        events, done = _stream(url, body)
        assert done and [t for e in events for t in e["choices"][0]["token_ids"]] == result.token_ids
        assert whole["choices"][0]["token_ids"] == result.token_ids and whole["choices"][0]["text"] == result.text
        spec = whole["spec_stats"]  # the parent's mirror of the child's counters, sent as deltas
        assert round(spec["tau"] * spec["steps"]) + 1 == 24 and spec["steps"] == events[-1]["spec_stats"]["steps"]
        assert spec["accepted_tokens"] == sum(spec["accepted_per_pos"]) <= spec["draft_tokens"]


def test_a_client_that_goes_away_aborts_its_request_in_the_child(remote):
    app, url = remote
    loop = app.state.engine_loop
    body = {"prompt": PROMPTS[0], "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    gone = []
    for _ in range(2):
        with httpx.stream("POST", url + "/v1/completions", json=body | {"model": MODEL, "stream": True},
                          timeout=60) as response:
            next(line for line in response.iter_lines() if line.startswith("data: "))
        gone.append(True)  # closed after its first chunk
    deadline = time.monotonic() + 30
    while loop.held:
        assert time.monotonic() < deadline, "the aborts did not reach the engine loop"
        time.sleep(0.02)
    # a short request takes a free slot; the child's counts at its finish hold neither aborted request
    out = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 4,
                                                    "ignore_eos": True}, timeout=60)
    assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] == 4
    assert len(loop.engine.scheduler.running) == 0 and len(loop.engine.scheduler.waiting) == 0
    assert b'specpilot:request_success_total{finished_reason="abort",model_name="zoo-hybrid"} 2.0' in \
        app.state.metrics.render()


def test_a_refused_add_is_a_400_and_shutdown_drains_the_streams_in_flight(zoo_tokenizer):
    engine = RemoteEngine(functools.partial(PickyEngine, slots=2, step_s=0.01))
    app = create_app(engine, zoo_tokenizer, ServerConfig(MODEL))
    results: list = [None, None]
    started = [threading.Event(), threading.Event()]

    def stream(i: int, url: str):
        results[i] = _stream(url, {"prompt": [1, 2], "max_tokens": 40, "return_token_ids": True}, started[i].set)

    with running(app) as url:
        refused = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": [REFUSED_ID, 1]})
        assert refused.status_code == 400
        assert refused.json()["error"]["message"] == f"prompt id {REFUSED_ID}: refused by the engine"
        threads = [threading.Thread(target=stream, args=(i, url)) for i in range(2)]
        for t in threads:
            t.start()
        assert all(e.wait(30) for e in started)
    # the context's exit shut the server down with both streams in flight: each ran to its end
    for t in threads:
        t.join(30)
    for events, done in results:
        assert done and events[-1]["choices"][0]["finish_reason"] == "length"
        assert [t for e in events for t in e["choices"][0]["token_ids"]] == [7] * 40
    assert app.state.engine_loop.finished == 2 and engine.process.exitcode == 0


def test_a_killed_engine_process_fails_the_requests_with_503(zoo_tokenizer):
    engine = RemoteEngine(functools.partial(FakeEngine, slots=2, step_s=0.05))
    app = create_app(engine, zoo_tokenizer, ServerConfig(MODEL))
    whole: list = []
    with running(app) as url:
        body = {"model": MODEL, "prompt": [1, 2], "max_tokens": 60}
        waiting = threading.Thread(target=lambda: whole.append(httpx.post(url + "/v1/completions", json=body,
                                                                          timeout=60)))
        waiting.start()
        events, done = _stream(url, {"prompt": [1, 2], "max_tokens": 60},
                               lambda: os.kill(engine.process.pid, signal.SIGKILL))
        waiting.join(30)
        assert done and "error" in events[-1] and "engine process died" in events[-1]["error"]["message"]
        assert whole[0].status_code == 503
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and "engine process died" in health.json()["reason"]
        late = httpx.post(url + "/v1/completions", json=body)
        assert late.status_code == 503 and late.json()["error"]["code"] == "unavailable"
    assert engine.process.exitcode == -signal.SIGKILL


def test_an_engine_the_child_cannot_build_is_a_value_error_and_no_child_is_left():
    before = set(multiprocessing.active_children())  # the module's server has its engine process
    with pytest.raises(ValueError, match="max_num_seqs=0: must be >= 1"):
        RemoteEngine(functools.partial(FakeEngine, slots=0))  # bad input met in the child: one error line, status 2
    assert not set(multiprocessing.active_children()) - before
