"""The server's overhead: one open-loop load against the engine driven directly and through `specpilot serve`.

The same Poisson arrivals (seeded, at --load x AR's measured capacity) of the same workload prompts go to the
engine driven in-process (`bench serve`'s open loop) and to `specpilot serve`'s app (uvicorn on a loopback port,
its engine-loop thread driving a fresh engine of the same configuration; the load client `specpilot.server.load`'s
open_loop_http in a process of its own, so the client never competes with the server for the interpreter lock),
speculation off (AR) and on (a random:SHAPE target, a random drafter in its published shape, SYNTHETIC acceptance
from --profile). Every HTTP answer must equal the direct run's tokens (AR's are the truth).

The synthetic oracle's probes run inside the server's steps, where a client cannot take them out, so the direct
run is timed on the plain clock as well: both sides pay the same probes and the comparison is like for like. The
direct row also records the oracle's seconds, and `spec_vs_ar` the speedups with them taken out.

overhead_per_token: (HTTP mean request latency per generated token) / (direct) - 1, where a request's latency runs
from its arrival to its last token; tpot_ratio and ttft_ratio: HTTP / direct medians.

    python3 -m bench server_load --target random:Qwen3-8B --out bench/results/server_load_8b_h200.json
    python3 -m bench server_load --target random:tiny-dense --requests 6 --max-tokens 8 --batch 2 \
        --out /tmp/server_load.json   # CPU smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch

from bench.common import Report, run_record
from specpilot.bench.harness import load_workloads
from specpilot.bench.serving import (Engines, LoopResult, Record, ServeConfig, closed_loop, open_loop,
                                     poisson_arrivals, summarize, workload_prompts)
from specpilot.bench.shapes import RANDOM_DRAFTERS, ByteTokenizer, RandomTarget
from specpilot.bench.synthetic import AcceptanceProfile
from specpilot.runtime.sampling import SamplingParams

MODEL = "bench"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--client"]:
        return client(*argv[1:3])
    p = argparse.ArgumentParser(prog="python3 -m bench server_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="random:Qwen3-8B", help="random:SHAPE[:layers=N]")
    p.add_argument("--drafter", default="random-dflash", choices=sorted(RANDOM_DRAFTERS))
    p.add_argument("--profile", default="dflash2-gsm8k", help="synthetic acceptance profile")
    p.add_argument("--tree", default="chain:7")
    p.add_argument("--batch", type=int, default=16, help="the engines' max_num_seqs (and AR's capacity clients)")
    p.add_argument("--load", type=float, default=0.6, help="arrival rate as a fraction of AR's capacity")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--workloads", nargs="+", default=["gsm8k"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    target = RandomTarget.parse(args.target)
    if target is None:
        print(f"error: --target {args.target}: give random:SHAPE (the synthetic oracle needs a random target)",
              file=sys.stderr)
        return 2
    if min(args.batch, args.requests, args.max_tokens) < 1 or args.load <= 0:
        print("error: --batch, --requests and --max-tokens must be >= 1 and --load > 0", file=sys.stderr)
        return 2
    report = Report(args.out, {**run_record(args.device), "config": vars(args), "rows": []})
    run(args, target, report)
    return 0


def run(args, target: RandomTarget, report: Report) -> None:
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = target.build(args.device, dtype)
    make = RANDOM_DRAFTERS[args.drafter]
    cfg = ServeConfig("open", (args.batch,), args.max_tokens, tree=args.tree, per_client=1, requests=args.requests,
                      seed=args.seed)
    engines = Engines(model, lambda runtime: make(model, target.shape, runtime), tuple(model.config.eos_token_ids),
                      cfg, AcceptanceProfile.load(args.profile))
    tokenizer = ByteTokenizer()
    prompts = workload_prompts(tokenizer, load_workloads(args.workloads), args.seed, shuffle=True)
    params = SamplingParams(max_new_tokens=args.max_tokens, ignore_eos=True)

    engine = warmed(engines.ar(args.batch), prompts, args.batch)
    capacity = closed_loop(engine, prompts, args.batch, 1, params)
    rate = args.load * len(capacity.records) / capacity.seconds
    report["capacity_req_s"] = rate / args.load
    arrivals = poisson_arrivals(args.requests, rate, args.seed)
    truth = None
    for kind in ("ar", "spec"):
        if kind == "spec":
            engine = warmed(engines.spec(args.batch, truth), prompts, args.batch)
        oracle = engines.oracle.seconds
        direct = in_thread(open_loop, engine, prompts, arrivals, params, time.perf_counter)
        oracle = engines.oracle.seconds - oracle
        if truth is None:
            truth = {tuple(prompts[r.prompt]): r.tokens for r in direct.records}
        del engine  # one engine's caches at a time
        fresh = engines.ar(args.batch) if kind == "ar" else engines.spec(args.batch, truth)
        http = over_http(warmed(fresh, prompts, args.batch), tokenizer, prompts, arrivals, args.max_tokens)
        del fresh
        report["rows"] += [row(kind, "direct", direct, truth, prompts, oracle), row(kind, "http", http, truth, prompts)]
        report.save()
        print(f"{kind}: direct {report['rows'][-2]['throughput_tok_s']:.1f} tok/s, "
              f"http {report['rows'][-1]['throughput_tok_s']:.1f} tok/s", flush=True)
    report["comparison"] = compare(report["rows"])
    print(json.dumps(report["comparison"], indent=1))


def in_thread(fn, *args):
    """fn(*args) on a worker thread, as the server's engine loop runs (on the CPU, torch's intra-op threads make
    the main thread's engine several times slower than a worker's)."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)))
    thread.start()
    thread.join()
    if not out:
        raise RuntimeError(f"{fn.__name__} failed (its traceback is above)")
    return out[0]


def warmed(engine, prompts, batch: int):
    """Verify graphs captured, then one short untimed request per slot (drafter graphs, compiled kernels)."""
    engine.warmup()
    closed_loop(engine, prompts, batch, 1, SamplingParams(max_new_tokens=16, ignore_eos=True))
    return engine


def over_http(engine, tokenizer, prompts, arrivals, max_tokens: int) -> LoopResult:
    """The load through the real app on a loopback port, the client in its own process."""
    import uvicorn

    from specpilot.server.app import create_app
    from specpilot.server.config import ServerConfig
    from specpilot.server.uvicorn_server import address, bind

    app = create_app(engine, tokenizer, ServerConfig(MODEL, max_waiting=len(arrivals)))
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            job, out = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
            with open(job, "w") as f:
                json.dump({"url": address(sock), "prompts": prompts, "arrivals": arrivals, "max_tokens": max_tokens},
                          f)
            subprocess.run([sys.executable, "-m", "bench", "server_load", "--client", job, out], check=True,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            with open(out) as f:
                done = json.load(f)
    finally:
        server.should_exit = True
        thread.join(60)
    records = [Record(**r) for r in done["records"]]
    return LoopResult(records, done["seconds"], 0)


def client(job_path: str, out_path: str) -> int:
    """The load client's process: open_loop_http with the job's prompts and arrivals; records as JSON."""
    from specpilot.server.load import open_loop_http

    with open(job_path) as f:
        job = json.load(f)
    result, refused, _ = asyncio.run(open_loop_http(job["url"], MODEL, job["prompts"], job["arrivals"],
                                                    job["max_tokens"]))
    if refused:
        raise RuntimeError(f"{refused} requests refused with 429")
    records = [{k: getattr(r, k) for k in ("request_id", "prompt", "prompt_len", "arrival", "first", "finish",
                                           "tokens", "finish_reason")} for r in result.records]
    with open(out_path, "w") as f:
        json.dump({"records": records, "seconds": result.seconds}, f)
    return 0


def row(kind: str, path: str, result: LoopResult, truth, prompts, oracle_s: float | None = None) -> dict:
    out = {"engine": kind, "path": path, **summarize(result)}
    out.pop("seconds_split", None)
    latency = [(r.finish - r.arrival) / len(r.tokens) for r in result.records if r.tokens]
    out["latency_per_token_ms"] = statistics.mean(latency) * 1e3 if latency else None
    out["mismatched_requests"] = sum(r.tokens != truth[tuple(prompts[r.prompt])] for r in result.records)
    if oracle_s is not None:
        out["oracle_seconds"] = oracle_s
    return out


def compare(rows: list[dict]) -> dict:
    """Per engine: HTTP against direct; and spec against AR on each path."""
    by = {(r["engine"], r["path"]): r for r in rows}
    out = {}
    for kind in ("ar", "spec"):
        d, h = by[(kind, "direct")], by[(kind, "http")]
        out[kind] = {"overhead_per_token": h["latency_per_token_ms"] / d["latency_per_token_ms"] - 1,
                     "throughput_ratio": h["throughput_tok_s"] / d["throughput_tok_s"],
                     "tpot_ratio": _ratio(h["tpot_p50_ms"], d["tpot_p50_ms"]),
                     "ttft_ratio": _ratio(h["ttft_p50_ms"], d["ttft_p50_ms"]),
                     "exact": h["mismatched_requests"] == 0 and d["mismatched_requests"] == 0}
    spec, ar = by[("spec", "direct")], by[("ar", "direct")]
    oracle_free = spec["seconds"] - spec.get("oracle_seconds", 0.0)
    out["spec_vs_ar"] = {
        "latency_per_token_http": by[("ar", "http")]["latency_per_token_ms"] / by[("spec", "http")][
            "latency_per_token_ms"],
        "latency_per_token_direct": ar["latency_per_token_ms"] / spec["latency_per_token_ms"],
        "busy_seconds_direct_oracle_excluded": {"ar": ar["seconds"], "spec": oracle_free}}
    return out


def _ratio(a, b):
    return None if a is None or not b else a / b


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
