"""The app's routes and every error status, over HTTP: /v1/models, /health, /metrics (scraped and parsed), and
OpenAI's error JSON for 400 (bad parameters, no chat template), 404 (unknown model or route), 413 (a prompt with
no room to generate) and 429 (the bounded queue full, with Retry-After) under a 10x overload burst."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specpilot.engine.scheduler import SchedulerConfig
from specpilot.server.app import max_model_len
from tests.server.conftest import MODEL


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


def _post(served, path: str, **body) -> httpx.Response:
    return httpx.post(served.url + path, json={"model": MODEL} | body, timeout=30)


def test_models_and_health(served):
    models = served.client().models.list()
    assert [m.id for m in models.data] == [MODEL] and models.data[0].model_extra["max_model_len"] == 256
    assert httpx.get(served.url + "/health").json() == {"status": "ok"}


def test_unknown_model_is_404(served):
    with pytest.raises(openai.NotFoundError) as e:
        served.client().completions.create(model="gpt-5", prompt="x", max_tokens=2)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    assert "gpt-5" in _error(_post(served, "/v1/completions", model="gpt-5", prompt="x"), 404)["message"]
    assert _error(httpx.get(served.url + "/v1/nothing"), 404)["code"] == "not_found"


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"prompt": "x", "n": 2}, "n", "n=2"),
    ({"prompt": "x", "top_p": 0}, None, "top_p=0"),
    ({"prompt": "x", "temperature": -1}, None, "temperature=-1"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"prompt": "x", "max_tokens": 300}, "max_tokens", "at most"),
    ({"prompt": "x", "logprobs": 2}, "logprobs", "logprobs"),
    ({"prompt": "x", "echo": True}, "echo", "echo"),
    ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
    ({"prompt": [5, 10**7]}, "prompt", "outside the model's vocabulary"),
    ({"prompt": ""}, "prompt", "zero tokens"),
    ({}, "prompt", "Field required"),
])
def test_bad_completion_parameters_are_400(served, body, param, says):
    error = _error(_post(served, "/v1/completions", **body), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param and says in error["message"]


def test_bad_bodies_are_400_not_422(served):
    response = httpx.post(served.url + "/v1/completions", content=b"{not json", timeout=30,
                          headers={"content-type": "application/json"})
    _error(response, 400)
    error = _error(_post(served, "/v1/chat/completions", messages=[{"role": "robot", "content": "hi"}]), 400)
    assert error["param"] == "messages.0.role"
    with pytest.raises(openai.BadRequestError):
        served.client().chat.completions.create(model=MODEL, messages=[], max_tokens=2)


def test_chat_without_a_template_is_400(small):
    with pytest.raises(openai.BadRequestError) as e:
        small.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["code"] == "no_chat_template" and "--chat-template" in e.value.body["message"]


def test_a_prompt_with_no_room_to_generate_is_413(served, zoo):
    ids = [5] * 256  # the server's model length: prompt and completion together
    error = _error(_post(served, "/v1/completions", prompt=ids), 413)
    assert error["code"] == "context_length_exceeded" and "256" in error["message"]
    with pytest.raises(openai.APIStatusError) as e:
        served.client().completions.create(model=MODEL, prompt=ids[:-1], max_tokens=2)
    assert e.value.status_code == 400  # room for one token, not two
    assert served.client().completions.create(model=MODEL, prompt=ids[:-1], max_tokens=1).usage.completion_tokens == 1


def test_max_model_len_past_the_context_is_refused(served):
    engine = served.engine
    assert max_model_len(engine) == 256
    context = engine.runner.config.max_position_embeddings
    for bad in (context + 1, 0):
        other = SimpleNamespace(runner=engine.runner, config=SchedulerConfig(max_model_len=bad))
        with pytest.raises(ValueError, match=f"--max-model-len {bad}: must be in 2..{context}"):
            max_model_len(other)


def test_overload_burst_gets_well_formed_429s_and_loses_nothing(small):
    """40 concurrent streams at a server holding 4 (2 running, 2 waiting): each is answered in full or refused
    with 429, Retry-After and the error JSON; none is lost or answered twice; the server is healthy after."""

    async def one(client: httpx.AsyncClient, i: int):
        body = {"model": MODEL, "prompt": "def fibonacci(n):\n", "max_tokens": 24, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code == 429:
                await response.aread()
                return i, 429, response
            events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
            return i, response.status_code, events

    async def burst():
        async with httpx.AsyncClient(base_url=small.url, timeout=60) as client:
            return await asyncio.gather(*(one(client, i) for i in range(40)))

    before = small.loop.finished
    results = asyncio.run(burst())
    assert sorted(i for i, _, _ in results) == list(range(40))
    served = [r for _, status, r in results if status == 200]
    refused = [r for _, status, r in results if status == 429]
    assert len(served) + len(refused) == 40 and len(served) >= 4 and refused
    for events in served:
        assert events[-1] == "data: [DONE]" and '"finish_reason":"length"' in events[-2]
    for response in refused:
        assert int(response.headers["Retry-After"]) >= 1
        error = _error(response, 429)
        assert error["code"] == "queue_full" and error["type"] == "rate_limit_exceeded"
    assert small.loop.finished - before == len(served) and small.loop.held == 0
    assert httpx.get(small.url + "/health").status_code == 200
    out = small.client().completions.create(model=MODEL, prompt="x = ", max_tokens=3)
    assert out.usage.completion_tokens == 3


def test_metrics_scrape_and_parse(served):
    served.client().completions.create(model=MODEL, prompt="def fibonacci(n):\n", max_tokens=24)
    text = httpx.get(served.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(name: str, **labels) -> float:
        return sum(s.value for s in families[name].samples
                   if s.name.endswith(("_total", name)) and all(s.labels.get(k) == v for k, v in labels.items()))

    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "spec_decode_num_drafts",
                 "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                 "spec_decode_num_accepted_tokens_per_pos", "time_to_first_token_seconds",
                 "request_time_per_output_token_seconds", "inter_token_latency_seconds",
                 "e2e_request_latency_seconds", "request_success",
                 "prompt_tokens", "generation_tokens"):
        assert f"specpilot:{name}" in families, name
    assert families["specpilot:e2e_request_latency_seconds"].type == "histogram"
    assert families["specpilot:spec_decode_num_drafts"].type == "counter"
    assert value("specpilot:num_requests_running") == 0 and value("specpilot:num_requests_waiting") == 0
    finished = value("specpilot:request_success")
    e2e_count = next(s.value for s in families["specpilot:e2e_request_latency_seconds"].samples
                     if s.name.endswith("_count"))
    assert finished >= 1 and e2e_count == finished
    generated = value("specpilot:generation_tokens")
    itl_count = next(s.value for s in families["specpilot:inter_token_latency_seconds"].samples
                     if s.name.endswith("_count"))
    assert itl_count == generated - finished  # every token but each request's first (each emitted one here)
    drafts, draft_tokens = value("specpilot:spec_decode_num_drafts"), value("specpilot:spec_decode_num_draft_tokens")
    accepted = value("specpilot:spec_decode_num_accepted_tokens")
    assert drafts >= 1 and draft_tokens >= drafts and accepted <= draft_tokens
    per_pos = [s for s in families["specpilot:spec_decode_num_accepted_tokens_per_pos"].samples
               if s.name.endswith("_total")]
    assert sum(s.value for s in per_pos) == accepted
    assert all(s.labels["model_name"] == MODEL and s.labels["position"].isdigit() for s in per_pos)
