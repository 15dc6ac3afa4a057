"""Open-loop HTTP load against a running `specpilot serve` (or any OpenAI-compatible server that takes vLLM's
`return_token_ids` and `ignore_eos`), for comparing the server with the engine driven directly
(`specpilot bench serve --mode open`): the same workload prompts as token ids, requests at seeded Poisson arrival
times, each a streamed /v1/completions of exactly max_tokens tokens, timed on the client (TTFT: send to first
token; TPOT: (last token - first token) / (tokens - 1)) and summarized as `bench serve` summarizes its rows.

    python3 -m specpilot.server.load --url http://127.0.0.1:8000 --model NAME --tokenizer TARGET \\
        --workloads gsm8k --requests 200 --rate 4 --max-tokens 256 --out load.json

A 429 is counted as refused, never retried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import httpx

from specpilot.bench.harness import load_workloads
from specpilot.bench.serving import LoopResult, Record, poisson_arrivals, summarize, workload_prompts


async def open_loop_http(url: str, model: str, prompts: list[list[int]], arrivals: list[float], max_tokens: int,
                         timeout: float = 600.0, indices: list[int] | None = None, start: float | None = None
                         ) -> tuple[LoopResult, int, list[dict]]:
    """Request i (prompt i mod len(prompts)) is sent at arrivals[i] s -> (records of the answered requests on the
    load's clock, requests refused with 429, each answered request's spec_stats). indices: the requests this client
    sends (default: all); start: the wall-clock time (time.time()) at which the load's clock reads 0, so that
    several client processes share one clock (default: now)."""
    if start is not None:
        await asyncio.sleep(max(0.0, start - time.time()))
    t0 = time.perf_counter()
    records, specs, refused = [], [], [0]

    async def one(client: httpx.AsyncClient, i: int) -> None:
        await asyncio.sleep(max(0.0, arrivals[i] - (time.perf_counter() - t0)))
        prompt = prompts[i % len(prompts)]
        record = Record(f"load-{i}", i % len(prompts), len(prompt), time.perf_counter() - t0)
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "ignore_eos": True, "return_token_ids": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code == 429:
                refused[0] += 1
                return
            if response.status_code != 200:
                raise RuntimeError(f"request {i}: HTTP {response.status_code}: {(await response.aread()).decode()}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"request {i}: {chunk['error']['message']}")
                choice = chunk["choices"][0]
                if choice.get("token_ids"):
                    now = time.perf_counter() - t0
                    record.first = now if record.first is None else record.first
                    record.tokens += choice["token_ids"]
                    record.finish = now
                if choice.get("finish_reason"):
                    record.finish_reason = choice["finish_reason"]
                    specs.append(chunk.get("spec_stats") or {})
        records.append(record)

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        await asyncio.gather(*(one(client, i) for i in (range(len(arrivals)) if indices is None else indices)))
    return LoopResult(records, time.perf_counter() - t0, 0), refused[0], specs


def report(result: LoopResult, refused: int, specs: list[dict]) -> dict:
    """`bench serve`'s row fields that a client can measure, the refusals and the server's tau over the run."""
    row = {k: v for k, v in summarize(result).items() if k not in ("steps", "tokens_per_step")}
    steps = sum(s.get("steps", 0) for s in specs)
    emitted = sum(max(len(r.tokens) - 1, 0) for r in result.records)  # each request's first token is the prefill's
    return row | {"refused": refused, "tau": emitted / steps if steps else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m specpilot.server.load", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--tokenizer", required=True, help="the target's directory or Hub id (prompts go as token ids)")
    p.add_argument("--workloads", default="gsm8k", help="comma-separated workloads (bench serve's names and default)")
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--rate", type=float, required=True, help="mean arrivals per second (Poisson)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-chat", action="store_true", help="prompts without the chat template")
    p.add_argument("--out", default=None, help="write the report as JSON here (default: stdout)")
    args = p.parse_args(argv)
    try:
        return _run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from specpilot.models.loader import load_tokenizer

    if args.requests < 1 or args.max_tokens < 1:
        raise ValueError(f"--requests {args.requests} --max-tokens {args.max_tokens}: both must be >= 1")
    arrivals = poisson_arrivals(args.requests, args.rate, args.seed)
    workloads = load_workloads([w for w in args.workloads.split(",") if w])
    prompts = workload_prompts(load_tokenizer(args.tokenizer), workloads, args.seed, chat=not args.no_chat,
                               shuffle=True)
    result, refused, specs = asyncio.run(open_loop_http(args.url, args.model, prompts, arrivals, args.max_tokens))
    text = json.dumps({"config": vars(args), "result": report(result, refused, specs)}, indent=1)
    if args.out is None:
        print(text)
        return 0
    with open(args.out + ".tmp", "w") as f:  # written whole, then renamed: never half a report
        f.write(text + "\n")
    os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
