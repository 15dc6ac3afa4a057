"""The server's overhead: one open-loop load against the engine driven directly and through `specpilot serve`.

The same Poisson arrivals (seeded, at --load x AR's measured capacity) of the same workload prompts go to the
engine driven in-process (`bench serve`'s open loop) and to `specpilot serve`'s app (uvicorn on a loopback port,
its engine-loop thread driving a fresh engine of the same configuration; the load client `specpilot.server.load`'s
open_loop_http in a process of its own, so the client never competes with the server for the interpreter lock),
speculation off (AR) and on (a random:SHAPE target, a random drafter in its published shape, SYNTHETIC acceptance
from --profile). Every HTTP answer must equal the direct run's tokens (AR's are the truth).

On a margin target (random:SHAPE) the synthetic drafter takes AR's tokens as the truth without probing the
verify (the verify answers what AR decode did), so the compared steps are the engine's own; a flat target
(flat:SHAPE) needs the probes, which run inside the server's steps where a client cannot take them out, so the
direct run is timed on the plain clock as well: both sides pay the same oracle work. The direct row records the
oracle's seconds, and `spec_vs_ar` the speedups with them taken out. The first engine of each kind is warmed at
every concurrency up to --batch (a drafter's proposal graphs are per batch size; later engines share them).

overhead_per_token: (HTTP mean request latency per generated token) / (direct) - 1, where a request's latency runs
from its arrival to its last token; tpot_ratio and ttft_ratio: HTTP / direct medians.

    python3 -m bench server_load --target random:Qwen3-8B --out bench/results/server_load_8b_h200.json
    python3 -m bench server_load --target random:tiny-dense --requests 6 --max-tokens 8 --batch 2 \
        --out /tmp/server_load.json   # CPU smoke run
    python3 -m bench server_load --target random:Qwen3-8B --loop-lag --out /tmp/server_load.json   # + the event
        # loop's lag per HTTP row (how late a 1 ms sleep on it wakes: time spent waiting for the interpreter lock)
    python3 -m bench server_load --simulate 1,6 --engines ar --repeats 2 --max-tokens 128 --device cpu \
        --out bench/results/server_load_simulated_cpu.json   # no model: the server's own overhead, any machine

--http-engines: where the HTTP rows' engine runs, one HTTP row per choice after each direct row: `thread` (rows
`http`: the engine-loop thread of the server's process, `specpilot serve`'s default) and `process` (rows
`http_process`: a process of its own, `specpilot serve --engine-process`, server/engine_process.py, built there
from the same flags, the stand-in of --simulate too, and warmed as the first engine of its kind). With both, their
order alternates per repeat, so that the two are compared side by side in one run; the direct rows are unchanged.
The comparison gives each engine's figures for its first HTTP path and, under `by_path`, for every path.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import torch

from bench.common import Report, run_record
from specpilot.bench.harness import load_workloads
from specpilot.bench.serving import (Engines, LoopResult, Record, ServeConfig, closed_loop, open_loop,
                                     poisson_arrivals, summarize, workload_prompts)
from specpilot.bench.shapes import RANDOM_DRAFTERS, ByteTokenizer, RandomTarget
from specpilot.bench.synthetic import AcceptanceProfile
from specpilot.engine.request import RequestOutput
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.engine.stats import SpecStats
from specpilot.runtime.sampling import SamplingParams
from specpilot.server.engine_process import RemoteEngine

HTTP_PATHS = {"thread": "http", "process": "http_process"}  # --http-engines choice -> its rows' path

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
    p.add_argument("--engines", nargs="+", default=["ar", "spec"], choices=("ar", "spec"),
                   help="spec needs ar first (its tokens are the truth)")
    p.add_argument("--repeats", type=int, default=1, help="direct / HTTP pairs per engine, interleaved")
    p.add_argument("--loop-lag", action="store_true",
                   help="record the server event loop's lag: how late a 1 ms sleep on it wakes (p50 / p99 / max in "
                        "each HTTP row; the probe itself wakes the loop 1,000 times a second)")
    p.add_argument("--clients", type=int, default=1,
                   help="load client processes (request i from client i mod N, on one clock); with --loop-lag each "
                        "HTTP row also records the worst client's own loop lag p99 (client_p99): a client that cannot "
                        "keep up with the chunks times them late")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="sys.setswitchinterval (s) for the run (default: the interpreter's, 0.005)")
    p.add_argument("--simulate", default=None, metavar="HOST_MS,GPU_MS",
                   help="no model: a stand-in engine whose step holds the interpreter lock HOST_MS, then waits GPU_MS "
                        "with it released (AR only; the server's own overhead on any machine)")
    p.add_argument("--http-engines", nargs="+", default=["thread"], choices=HTTP_PATHS,
                   help="where the HTTP rows' engine runs: thread (the server's engine-loop thread, rows http), "
                        "process (a process of its own as serve --engine-process, rows http_process), or both (side "
                        "by side)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.simulate is not None and (_simulated(args.simulate) is None or args.engines != ["ar"]):
        print(f"error: --simulate {args.simulate}: give HOST_MS,GPU_MS (two numbers >= 0) with --engines ar",
              file=sys.stderr)
        return 2
    target = RandomTarget.parse(args.target)
    if target is None:
        print(f"error: --target {args.target}: give random:SHAPE (the synthetic oracle needs a random target)",
              file=sys.stderr)
        return 2
    if len(set(args.http_engines)) != len(args.http_engines):
        print(f"error: --http-engines {' '.join(args.http_engines)}: name each of thread, process at most once",
              file=sys.stderr)
        return 2
    if min(args.batch, args.requests, args.max_tokens, args.repeats, args.clients) < 1 or args.load <= 0:
        print("error: --batch, --requests, --max-tokens, --repeats and --clients must be >= 1 and --load > 0",
              file=sys.stderr)
        return 2
    if args.engines[0] != "ar":
        print("error: --engines must start with ar (the speculative rows are checked against its tokens)",
              file=sys.stderr)
        return 2
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    report = Report(args.out, {**run_record(args.device), "config": vars(args), "rows": []})
    tokenizer = ByteTokenizer()
    prompts = workload_prompts(tokenizer, load_workloads(args.workloads), args.seed, shuffle=True)
    run(args, _all_engines(args), tokenizer, prompts, report)
    return 0


def _simulated(text: str) -> tuple[float, float] | None:
    """--simulate HOST_MS,GPU_MS -> (host_s, gpu_s), None if it is not two numbers >= 0."""
    try:
        host_ms, gpu_ms = (float(x) for x in text.split(","))
    except ValueError:
        return None
    return (host_ms / 1e3, gpu_ms / 1e3) if min(host_ms, gpu_ms) >= 0 else None


def _all_engines(args):
    """The run's engine builder: the stand-in of --simulate, else Engines over the random target."""
    if args.simulate is not None:
        return Simulated(args.batch, *_simulated(args.simulate))
    return _engines(args, RandomTarget.parse(args.target))


def child_engine(args, kind: str, truth, prompts):
    """--http-engines process: the HTTP run's engine, built in the engine process from the run's flags and warmed there
    as the first engine of its kind (every concurrency up to --batch)."""
    return warmed(build(_all_engines(args), kind, args, truth), prompts, args.batch, sweep=True)


def _engines(args, target: RandomTarget) -> Engines:
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = target.build(args.device, dtype)
    make = RANDOM_DRAFTERS[args.drafter]
    cfg = ServeConfig("open", (args.batch,), args.max_tokens, tree=args.tree, per_client=1, requests=args.requests,
                      seed=args.seed)
    # a margin target's verify answers what AR decode did: the truth needs no probe, and the steps that the
    # direct and HTTP runs compare are the engine's own
    return Engines(model, lambda runtime: make(model, target.shape, runtime), tuple(model.config.eos_token_ids),
                   cfg, AcceptanceProfile.load(args.profile), probe=target.kind != "margin")


def run(args, engines, tokenizer, prompts, report: Report) -> None:
    params = SamplingParams(max_new_tokens=args.max_tokens, ignore_eos=True)

    engine = warmed(engines.ar(args.batch), prompts, args.batch)
    capacity = closed_loop(engine, prompts, args.batch, 1, params)
    rate = args.load * len(capacity.records) / capacity.seconds
    report["capacity_req_s"] = rate / args.load
    arrivals = poisson_arrivals(args.requests, rate, args.seed)
    truth = None
    for kind in args.engines:
        for repeat in range(args.repeats):
            if kind == "spec" or repeat:
                engine = warmed(build(engines, kind, args, truth), prompts, args.batch, sweep=not repeat)
            oracle = engines.oracle.seconds if engines.oracle is not None else 0.0
            direct = in_thread(open_loop, engine, prompts, arrivals, params, time.perf_counter)
            oracle = engines.oracle.seconds - oracle if engines.oracle is not None else 0.0
            if truth is None:
                truth = {tuple(prompts[r.prompt]): r.tokens for r in direct.records}
            del engine  # one engine's caches at a time
            report["rows"].append(row(kind, "direct", direct, truth, prompts, repeat, oracle_s=oracle))
            order = args.http_engines if repeat % 2 == 0 else args.http_engines[::-1]
            for where in order:
                if where == "process":
                    fresh = RemoteEngine(functools.partial(child_engine, args, kind, truth, prompts))
                else:
                    fresh = warmed(build(engines, kind, args, truth), prompts, args.batch)
                http, specs, lag = over_http(fresh, tokenizer, prompts, arrivals, args.max_tokens, args.loop_lag,
                                             args.clients)
                del fresh
                report["rows"].append(row(kind, HTTP_PATHS[where], http, truth, prompts, repeat, specs=specs))
                if lag is not None:
                    report["rows"][-1]["loop_lag_ms"] = lag
                report.save()
            d = report["rows"][-1 - len(order)]
            line = ", ".join(f"{h['path']} {h['throughput_tok_s']:.1f} tok/s {h['latency_per_token_ms']:.3f} ms/tok"
                             for h in report["rows"][-len(order):])
            print(f"{kind} #{repeat}: direct {d['throughput_tok_s']:.1f} tok/s {d['latency_per_token_ms']:.3f} ms/tok, "
                  f"{line}", flush=True)
    report["comparison"] = compare(report["rows"])
    print(json.dumps(report["comparison"], indent=1))


class SimulatedEngine:
    """SpecEngine's client API with no model: each step holds the interpreter lock for host_s (the host's share of a
    step), calls while_verifying, then waits gpu_s with the lock released (the GPU's share), and gives every running
    request one token, its prompt's next id (cycling), until max_new_tokens."""

    def __init__(self, slots: int, host_s: float, gpu_s: float):
        self.host_s, self.gpu_s = host_s, gpu_s
        self.runner = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=1 << 20, vocab_size=256))
        self.config = SchedulerConfig(max_num_seqs=slots, max_model_len=1 << 16)
        self.scheduler = SimpleNamespace(running=[], waiting=[], num_slots=slots)
        self.while_verifying = None
        self.live: dict[str, list] = {}  # id -> [prompt, params, stats]
        self.done: dict[str, SpecStats] = {}
        self._ids = itertools.count()

    def warmup(self) -> dict:
        return {"graphs": 0, "bytes": 0}

    def add_request(self, prompt_ids, params, request_id=None, priority=0) -> str:
        rid = request_id or f"sim-{next(self._ids)}"
        self.live[rid] = [list(prompt_ids), params, SpecStats()]
        self._sync()
        return rid

    def step(self) -> list[RequestOutput]:
        t = time.perf_counter()
        while time.perf_counter() - t < self.host_s:
            pass
        if self.while_verifying is not None:
            self.while_verifying()
        time.sleep(self.gpu_s)
        outputs = []
        for rid in self.scheduler.running:
            prompt, params, stats = self.live[rid]
            token = prompt[stats.steps % len(prompt)]
            stats.steps += 1
            stats.emitted += 1
            done = stats.emitted >= params.max_new_tokens
            outputs.append(RequestOutput(rid, [token], done, "length" if done else None))
            if done:
                self.done[rid] = self.live.pop(rid)[2]
        self._sync()
        return outputs

    def abort(self, request_id: str) -> None:
        self.done[request_id] = self.live.pop(request_id)[2]
        self._sync()

    def stats(self, request_id: str) -> SpecStats:
        return self.done[request_id] if request_id in self.done else self.live[request_id][2]

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def _sync(self) -> None:
        ids = list(self.live)
        self.scheduler.running = ids[:self.config.max_num_seqs]
        self.scheduler.waiting = ids[self.config.max_num_seqs:]


class Simulated:
    """Engines' interface over SimulatedEngine (AR only, no oracle)."""

    oracle = None

    def __init__(self, slots: int, host_s: float, gpu_s: float):
        self.args = (slots, host_s, gpu_s)

    def ar(self, batch: int) -> SimulatedEngine:
        return SimulatedEngine(*self.args)


def build(engines: Engines, kind: str, args, truth=None):
    """A fresh engine; the speculative ones all start their synthetic acceptance from --seed, so the direct and
    HTTP runs draw alike."""
    if kind == "ar":
        return engines.ar(args.batch)
    engines.seeds = itertools.count(args.seed)
    return engines.spec(args.batch, truth)


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


def warmed(engine, prompts, batch: int, sweep: bool = False):
    """Verify graphs captured, then one short untimed request per slot (compiled kernels); sweep: at every
    concurrency up to the slots instead, for the first engine of a kind (a drafter's proposal graphs are per
    batch size, an open loop passes through them all, and the drafter and runner keep them for later engines)."""
    engine.warmup()
    for clients in range(batch, 0 if sweep else batch - 1, -1):
        closed_loop(engine, prompts, clients, 1, SamplingParams(max_new_tokens=16, ignore_eos=True))
    return engine


def over_http(engine, tokenizer, prompts, arrivals, max_tokens: int, loop_lag: bool = False, clients: int = 1):
    """The load through the real app on a loopback port, the client in processes of its own (`clients` of them,
    request i from client i mod clients, on one clock) -> (LoopResult, the answers' spec_stats, the event loop's lag
    in ms {p50, p99, max, samples} with loop_lag, else None; with it also "client_p99": the worst client's own loop
    lag p99, which says whether the clients kept up with the chunks)."""
    import uvicorn

    from specpilot.server.app import create_app
    from specpilot.server.config import ServerConfig
    from specpilot.server.uvicorn_server import address, bind

    app = create_app(engine, tokenizer, ServerConfig(MODEL, max_waiting=len(arrivals)))
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    lags: list[float] = []

    async def serve_probed():
        probe = asyncio.create_task(_lag_probe(lags))
        await server.serve(sockets=[sock])
        probe.cancel()

    if loop_lag:  # on asyncio's own loop, which the probe shares
        thread = threading.Thread(target=asyncio.run, args=(serve_probed(),), daemon=True)
    else:
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.time() + 1.0 + 0.5 * clients  # the clients' interpreters start before the load's clock
            procs, outs = [], []
            for c in range(clients):
                job, out = os.path.join(tmp, f"job{c}.json"), os.path.join(tmp, f"out{c}.json")
                with open(job, "w") as f:
                    json.dump({"url": address(sock), "prompts": prompts, "arrivals": arrivals,
                               "max_tokens": max_tokens, "indices": list(range(c, len(arrivals), clients)),
                               "start": start, "lag": loop_lag}, f)
                procs.append(subprocess.Popen([sys.executable, "-m", "bench", "server_load", "--client", job, out],
                                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
                outs.append(out)
            codes = [p.wait() for p in procs]
            if any(codes):
                raise RuntimeError(f"a load client failed (exit statuses {codes})")
            done = []
            for out in outs:
                with open(out) as f:
                    done.append(json.load(f))
    finally:
        server.should_exit = True
        thread.join(60)
    records = [Record(**r) for d in done for r in d["records"]]
    lag = None
    if loop_lag and lags:
        q = statistics.quantiles(lags, n=100)
        lag = {"p50": q[49] * 1e3, "p99": q[98] * 1e3, "max": max(lags) * 1e3, "samples": len(lags),
               "client_p99": max(d["client_lag_p99_ms"] for d in done)}
    return LoopResult(records, max(d["seconds"] for d in done), 0), [x for d in done for x in d["specs"]], lag


async def _lag_probe(lags: list[float]) -> None:
    """How late a 1 ms sleep on the event loop wakes, over and over: the time the loop waited for the interpreter
    lock or for its other work."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - t - 0.001)


def client(job_path: str, out_path: str) -> int:
    """The load client's process: open_loop_http with the job's prompts and arrivals; records as JSON."""
    from specpilot.server.load import open_loop_http

    with open(job_path) as f:
        job = json.load(f)
    lags: list[float] = []

    async def probed():
        probe = asyncio.create_task(_lag_probe(lags)) if job.get("lag") else None
        try:
            return await open_loop_http(job["url"], MODEL, job["prompts"], job["arrivals"], job["max_tokens"],
                                        indices=job.get("indices"), start=job.get("start"))
        finally:
            if probe is not None:
                probe.cancel()

    result, refused, specs = asyncio.run(probed())
    if refused:
        raise RuntimeError(f"{refused} requests refused with 429")
    records = [{k: getattr(r, k) for k in ("request_id", "prompt", "prompt_len", "arrival", "first", "finish",
                                           "tokens", "finish_reason")} for r in result.records]
    lag_p99 = statistics.quantiles(lags, n=100)[98] * 1e3 if len(lags) > 1 else None
    with open(out_path, "w") as f:
        json.dump({"records": records, "seconds": result.seconds, "specs": specs, "client_lag_p99_ms": lag_p99}, f)
    return 0


def row(kind: str, path: str, result: LoopResult, truth, prompts, repeat: int, oracle_s: float | None = None,
        specs: list[dict] | None = None) -> dict:
    out = {"engine": kind, "path": path, "repeat": repeat, **summarize(result)}
    if specs:  # the server's spec_stats of each answer: tau over the run
        steps = sum(s.get("steps", 0) for s in specs)
        out["tau"] = sum(max(len(r.tokens) - 1, 0) for r in result.records) / steps if steps else None
    out.pop("seconds_split", None)
    latency = [(r.finish - r.arrival) / len(r.tokens) for r in result.records if r.tokens]
    out["latency_per_token_ms"] = statistics.mean(latency) * 1e3 if latency else None
    out["mismatched_requests"] = sum(r.tokens != truth[tuple(prompts[r.prompt])] for r in result.records)
    if oracle_s is not None:
        out["oracle_seconds"] = oracle_s
    return out


def compare(rows: list[dict]) -> dict:
    """Per engine and HTTP path, each repeat's HTTP row against its direct row (overhead per token: latency per
    token, HTTP / direct - 1) and their median; an engine's top-level figures are its first HTTP path's, every
    path's under `by_path`. spec against AR on each path (latency per token, AR / spec)."""
    pairs = {}
    for r in rows:
        pairs.setdefault((r["engine"], r["repeat"]), {})[r["path"]] = r
    paths = [p for p in HTTP_PATHS.values() if any(r["path"] == p for r in rows)]
    out = {}
    for kind in dict.fromkeys(r["engine"] for r in rows):
        runs = [p for (k, _), p in sorted(pairs.items()) if k == kind and "direct" in p]
        by_path = {path: _overhead([p for p in runs if path in p], path) for path in paths}
        out[kind] = {**by_path[paths[0]], "exact": all(p[x]["mismatched_requests"] == 0 for p in runs for x in p),
                     "by_path": by_path}
    if "spec" in out:
        out["spec_vs_ar"] = {path: statistics.median(r["latency_per_token_ms"] for r in rows
                                                     if r["engine"] == "ar" and r["path"] == path) /
                             statistics.median(r["latency_per_token_ms"] for r in rows
                                               if r["engine"] == "spec" and r["path"] == path)
                             for path in ("direct", *paths)}
    return out


def _overhead(runs: list[dict], path: str) -> dict:
    over = [p[path]["latency_per_token_ms"] / p["direct"]["latency_per_token_ms"] - 1 for p in runs]
    return {"overhead_per_token": over, "overhead_per_token_median": statistics.median(over),
            "tpot_ratio": [_ratio(p[path]["tpot_p50_ms"], p["direct"]["tpot_p50_ms"]) for p in runs],
            "ttft_ratio": [_ratio(p[path]["ttft_p50_ms"], p["direct"]["ttft_p50_ms"]) for p in runs]}


def _ratio(a, b):
    return None if a is None or not b else a / b


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
