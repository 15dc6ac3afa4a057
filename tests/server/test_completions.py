"""/v1/completions and /v1/chat/completions through the official openai client: streamed and whole answers equal
offline `generate` token for token at temperature 0 (alone and with other requests in the batch), stop strings,
usage and spec_stats, a load of 64 concurrent streams, and a client that goes away frees its slot at once."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from specpilot.runtime.sampling import SamplingParams
from tests.server.conftest import CHAT_TEMPLATE, MODEL, build_engine

PROMPTS = ["def fibonacci(n):\n", "import os\n\n\ndef list_files(directory):\n",
           "class Stack:\n    def __init__(self):\n"]


@pytest.fixture(scope="module")
def offline(zoo):
    """Offline generate on a fresh engine of the same flags as the main server: prompt ids -> (token ids, text)."""
    from specpilot.demo import zoo_dir

    engine = build_engine(zoo, ["--drafter", str(zoo_dir() / "hybrid-dflash"), "--tree", "chain:7"], 8)
    cache = {}

    def run(ids: list[int], max_tokens: int, stop: tuple[str, ...] = (), **sampling):
        key = (tuple(ids), max_tokens, stop, tuple(sorted(sampling.items())))
        if key not in cache:
            result, _ = engine.generate([ids], SamplingParams(max_new_tokens=max_tokens, stop=stop, **sampling))[0]
            cache[key] = (result.token_ids, result.text, result.finish_reason)
        return cache[key]

    return run


def _encode(zoo, prompt: str) -> list[int]:
    return zoo[1].encode(prompt, add_special_tokens=True)


def test_streamed_completion_equals_offline_generate(served, zoo, offline):
    client = served.client()
    for prompt in PROMPTS:
        ids, text, _ = offline(_encode(zoo, prompt), 32)
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0,
                                                stream=True, extra_body={"return_token_ids": True}))
        streamed = "".join(c.choices[0].text for c in chunks)
        tokens = [t for c in chunks for t in c.choices[0].model_extra["token_ids"]]
        assert tokens == ids and streamed == text
        last = chunks[-1]
        assert last.choices[0].finish_reason == "length" and all(c.choices[0].finish_reason is None
                                                                 for c in chunks[:-1])
        spec = last.model_extra["spec_stats"]
        assert spec["steps"] >= 1 and spec["tau"] >= 1 and spec["accepted_tokens"] <= spec["draft_tokens"]


def test_sampled_completion_is_offline_sampling_with_the_same_seed(served, zoo, offline):
    """temperature > 0 with the drafter: the served tokens are what offline generate samples with the same seed."""
    prompt = PROMPTS[2]
    ids, text, _ = offline(_encode(zoo, prompt), 24, temperature=0.8, top_p=0.95, seed=11, ignore_eos=True)
    greedy, _, _ = offline(_encode(zoo, prompt), 24, ignore_eos=True)
    out = served.client().completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0.8, top_p=0.95,
                                             seed=11, extra_body={"return_token_ids": True, "ignore_eos": True})
    assert out.choices[0].model_extra["token_ids"] == ids and out.choices[0].text == text
    assert ids != greedy  # it sampled


def test_whole_completion_has_usage_and_spec_stats(served, zoo, offline):
    prompt = PROMPTS[1]
    ids, text, _ = offline(_encode(zoo, prompt), 32)
    out = served.client().completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0,
                                             extra_body={"return_token_ids": True})
    assert out.object == "text_completion" and out.model == MODEL and out.id.startswith("cmpl-")
    assert out.choices[0].text == text and out.choices[0].model_extra["token_ids"] == ids
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(_encode(zoo, prompt)), 32)
    assert out.usage.total_tokens == out.usage.prompt_tokens + 32
    spec = out.model_extra["spec_stats"]
    assert set(spec) >= {"tau", "steps", "drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos"}
    # the first token comes from the prefill, the other 31 from the target's steps (tau per step)
    assert round(spec["tau"] * spec["steps"]) == 32 - 1 and spec["accepted_tokens"] >= 31 - spec["steps"]


def test_token_id_prompt_and_batch_of_one(served, zoo, offline):
    ids = _encode(zoo, PROMPTS[0])
    expected = offline(ids, 32)[1]
    client = served.client()
    assert client.completions.create(model=MODEL, prompt=ids, max_tokens=32).choices[0].text == expected
    assert client.completions.create(model=MODEL, prompt=[PROMPTS[0]], max_tokens=32).choices[0].text == expected


def test_chat_streamed_and_whole_equal_offline_generate(served, zoo, offline):
    messages = [{"role": "system", "content": "You write Python."},
                {"role": "user", "content": [{"type": "text", "text": "A function that adds "},
                                             {"type": "text", "text": "two numbers."}]}]
    conversation = [messages[0], {"role": "user", "content": "A function that adds two numbers."}]
    prompt_ids = zoo[1].apply_chat_template(conversation, chat_template=CHAT_TEMPLATE, add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
    ids, text, _ = offline(list(prompt_ids), 24)
    client = served.client()
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == text
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(prompt_ids), len(ids))
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=24,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-2].choices[0].finish_reason == "length" and "spec_stats" in chunks[-2].model_extra
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)


def test_stop_string_cuts_the_text_as_offline_generate_does(served, zoo, offline):
    ids = _encode(zoo, PROMPTS[0])
    full = offline(ids, 32)[1]
    stop = full[len(full) // 2:len(full) // 2 + 2]  # a string the completion reaches
    _, text, reason = offline(ids, 32, (stop,))
    assert reason == "stop" and stop not in text
    client = served.client()
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=32, stop=stop)
    streamed = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=32, stop=[stop],
                                              stream=True))
    assert whole.choices[0].text == text and whole.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].text for c in streamed) == text and streamed[-1].choices[0].finish_reason == "stop"


def test_64_concurrent_streams_all_answered_in_full(served, zoo, offline):
    """Every stream ends with its finish reason and [DONE], with the text it has alone, whatever shares its batch."""
    expected = [offline(_encode(zoo, p), 8)[1] for p in PROMPTS]
    client = served.async_client()

    async def one(i: int):
        stream = await client.completions.create(model=MODEL, prompt=PROMPTS[i % 3], max_tokens=8, stream=True)
        chunks = [c async for c in stream]
        return i, "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason

    async def burst():
        async with client:
            return await asyncio.gather(*(one(i) for i in range(64)))

    before = served.loop.finished
    results = asyncio.run(burst())
    assert sorted(i for i, _, _ in results) == list(range(64))
    assert all(text == expected[i % 3] and reason == "length" for i, text, reason in results)
    assert served.loop.finished - before == 64 and served.loop.held == 0


def _wait(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _aborted(served) -> float:
    return served.app.state.metrics._success.labels(MODEL, "abort")._value.get()


def test_a_client_gone_mid_stream_frees_its_slot(small):
    engine, aborted = small.engine, _aborted(small)
    body = {"model": MODEL, "prompt": "def fibonacci(n):\n", "max_tokens": 200, "stream": True}
    with httpx.stream("POST", small.url + "/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert len(engine.scheduler.running) == 1
    # the connection is closed: the request is aborted, not run to its 200 tokens
    _wait(lambda: not engine.scheduler.running and small.loop.held == 0)
    assert _aborted(small) == aborted + 1
    assert len(engine.scheduler.free) == engine.scheduler.num_slots


def test_a_client_gone_before_a_whole_answer_frees_its_slot(small):
    engine, aborted = small.engine, _aborted(small)
    body = {"model": MODEL, "prompt": "def fibonacci(n):\n", "max_tokens": 200}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(small.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
    _wait(lambda: not engine.scheduler.running and small.loop.held == 0)
    assert _aborted(small) == aborted + 1
