"""Serving benchmarks on the continuous-batching engine (`specpilot bench serve`): the closed and open loop drivers,
their latency and throughput metrics, and the runs that put the speculative engine beside plain AR decoding
(`SpecEngine` with no drafter, the same scheduler) on the same prompts in one process.

Closed loop: N clients, each sending its next request as soon as its last one finished, a fixed number of requests
each: throughput at a concurrency. Open loop: requests arrive at seeded Poisson times at a fraction of AR's measured
capacity (AR's closed-loop requests per second at the largest batch); the driver adds every request whose arrival
has passed before each engine step and, when nothing is in flight, jumps to the next arrival (the skipped idle time
still counts in the span): time to first token and time per output token under load.

TTFT is first token minus arrival (a request added late because a step was running waits from its arrival); TPOT is
(last token - first token) / (tokens - 1). Time is the driver's clock: time.perf_counter (on a GPU each engine step
ends in a host sync), minus the synthetic oracle's own seconds under synthetic acceptance (bench/harness.py's
OracleClock: the benchmark's work, not the engine's).

Under synthetic acceptance AR runs first: its outputs are the oracle's truth, keyed by prompt, and every token the
speculative engine emits is compared with AR's output for the same prompt ("exact" in the row; on margin targets it
must hold in bf16 too, bench/shapes.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from specpilot.bench.harness import OracleClock, encode_turn
from specpilot.bench.probing import ProbingEngine
from specpilot.bench.synthetic import AcceptanceProfile, SyntheticDrafter
from specpilot.config import EngineConfig
from specpilot.engine.engine import SpecEngine
from specpilot.prompts import Prompt
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.runtime.settings import Runtime
from specpilot.spec_decode.tree import TreeSpec

Clock = Callable[[], float]


# ------------------------------------------------------------------------------------------------------ metrics
def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default); None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def poisson_arrivals(count: int, rate: float, seed: int) -> list[float]:
    """Arrival times (s from 0) of `count` requests of a Poisson process of `rate` requests/s: exponential gaps."""
    if rate <= 0:
        raise ValueError(f"arrival rate {rate}: must be > 0 requests/s")
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out


@dataclass
class Record:
    """One request as the driver saw it: times on the driver's clock, the tokens it got, the engine's stats."""

    request_id: str
    prompt: int  # index in the run's prompt list
    prompt_len: int
    arrival: float
    first: float | None = None
    finish: float | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: object = None  # the engine's SpecStats, read when the request finished

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.finish is None or len(self.tokens) < 2:
            return None
        return (self.finish - self.first) / (len(self.tokens) - 1)


@dataclass
class LoopResult:
    records: list[Record]
    seconds: float  # the run's span on the driver's clock
    steps: int  # engine steps (one target forward each)


class _Driver:
    """Adds requests to an engine, runs its steps and keeps each request's Record."""

    def __init__(self, engine, prompts: list[list[int]], params: SamplingParams, now: Clock, on_finish=None):
        self.engine, self.prompts, self.params, self.now = engine, prompts, params, now
        self.on_finish = on_finish or (lambda record: None)
        self.records: dict[str, Record] = {}
        self.steps = 0

    def send(self, index: int, arrival: float) -> Record:
        prompt = self.prompts[index % len(self.prompts)]
        rid = self.engine.add_request(list(prompt), self.params)
        self.records[rid] = Record(rid, index % len(self.prompts), len(prompt), arrival)
        return self.records[rid]

    def step(self) -> list[Record]:
        """One engine step; returns the requests it finished."""
        outputs = self.engine.step()
        now = self.now()
        self.steps += 1
        done = []
        for out in outputs:
            r = self.records[out.request_id]
            if out.new_token_ids and r.first is None:
                r.first = now
            r.tokens.extend(out.new_token_ids)
            if out.finished:
                r.finish, r.finish_reason = now, out.finish_reason
                r.stats = self.engine.stats(out.request_id)
                done.append(r)
                self.on_finish(r)
        return done


def closed_loop(engine, prompts: list[list[int]], clients: int, per_client: int, params: SamplingParams,
                clock: Clock = time.perf_counter, on_finish=None) -> LoopResult:
    """`clients` clients, each with one request in flight, sending its next as soon as the last one finished, until
    each has sent `per_client`. Request k of client c takes prompt (k * clients + c) mod len(prompts)."""
    t0 = clock()
    d = _Driver(engine, prompts, params, lambda: clock() - t0, on_finish)
    owner, sent = {}, [0] * clients

    def send(c: int, at: float) -> None:
        owner[d.send(sent[c] * clients + c, at).request_id] = c
        sent[c] += 1

    for c in range(clients):
        send(c, 0.0)
    while engine.has_unfinished():
        for r in d.step():
            c = owner[r.request_id]
            if sent[c] < per_client:
                send(c, r.finish)
    return LoopResult(list(d.records.values()), clock() - t0, d.steps)


def open_loop(engine, prompts: list[list[int]], arrivals: list[float], params: SamplingParams,
              clock: Clock = time.perf_counter, on_finish=None) -> LoopResult:
    """Request i (prompt i mod len(prompts)) arrives at arrivals[i] s. Before each step every arrived request is
    added; when nothing is in flight the clock jumps to the next arrival (no sleeping through idle time)."""
    t0, skipped = clock(), [0.0]

    def now() -> float:
        return clock() - t0 + skipped[0]

    d = _Driver(engine, prompts, params, now, on_finish)
    i = 0
    while i < len(arrivals) or engine.has_unfinished():
        t = now()
        while i < len(arrivals) and arrivals[i] <= t:
            d.send(i, arrivals[i])
            i += 1
        if engine.has_unfinished():
            d.step()
        elif i < len(arrivals):
            skipped[0] += arrivals[i] - t
    return LoopResult(list(d.records.values()), now(), d.steps)


def verified_tokens(stats) -> int:
    """Tokens the target verified for a request: each step's root plus its drafted nodes."""
    return stats.steps + sum(stats.drafted_per_depth)


def summarize(result: LoopResult) -> dict:
    """A row's measurements: throughput, TTFT and TPOT percentiles (ms), steps, tau and the engine's split."""
    recs = result.records
    tokens = sum(len(r.tokens) for r in recs)
    ttft = [r.ttft for r in recs if r.ttft is not None]
    tpot = [r.tpot for r in recs if r.tpot is not None]
    row = {"requests": len(recs), "tokens": tokens, "seconds": result.seconds, "steps": result.steps,
           "throughput_tok_s": tokens / result.seconds if result.seconds > 0 else None,
           "throughput_req_s": len(recs) / result.seconds if result.seconds > 0 else None,
           "tokens_per_step": tokens / max(result.steps, 1)}
    for name, values in (("ttft", ttft), ("tpot", tpot)):
        for q in (50, 99):
            v = percentile(values, q)
            row[f"{name}_p{q}_ms"] = None if v is None else v * 1e3
    stats = [r.stats for r in recs if r.stats is not None]
    if stats:
        steps = sum(s.steps for s in stats)
        row["tau"] = sum(s.emitted for s in stats) / max(steps, 1)
        row["verified_tokens"] = sum(verified_tokens(s) for s in stats)
        row["tokens_per_verified"] = sum(s.emitted for s in stats) / max(row["verified_tokens"], 1)
        depth = max(len(s.drafted_per_depth) for s in stats)
        row["drafted_per_depth"] = [sum(s.drafted_per_depth[d] for s in stats if d < len(s.drafted_per_depth))
                                    for d in range(depth)]
        row["accepted_per_depth"] = [sum(s.accepted_per_depth[d] for s in stats if d < len(s.accepted_per_depth))
                                     for d in range(depth)]
        row["seconds_split"] = {k: sum(s.seconds.get(k, 0.0) for s in stats) for k in stats[0].seconds}
    return row


def step_profile(records: list[dict]) -> dict:
    """The engine's step log (SpecEngine.step_log) summarised per kind of step, decode (no prefill chunk) and mixed
    (prefill chunks ride along): steps, steps with no draft node (plain), medians of the batch, the forward's tokens
    and the draft nodes, the median ms per component (the steps measured so far) and the measured verify time over
    the cost curve's prediction (median)."""
    out = {}
    kinds = (("decode", [r for r in records if r["batch"] and not r["prefill"]]),
             ("mixed", [r for r in records if r["prefill"]]))
    for kind, recs in kinds:
        if not recs:
            continue
        timed = [r for r in recs if "seconds" in r]
        comps = sorted({c for r in timed for c in r["seconds"]})
        ratio = [r["seconds"]["verify"] / r["predicted"] for r in timed if r.get("predicted") and "verify" in r["seconds"]]
        out[kind] = {"steps": len(recs), "plain_steps": sum(not any(r["nodes"]) for r in recs),
                     "batch_p50": percentile([r["batch"] for r in recs], 50),
                     "tokens_p50": percentile([r["batch"] + sum(r["nodes"]) + r["prefill"] for r in recs], 50),
                     "nodes_p50": percentile([sum(r["nodes"]) for r in recs], 50),
                     "ms_p50": {c: percentile([r["seconds"].get(c, 0.0) * 1e3 for r in timed], 50) for c in comps},
                     "verify_ms_p90": percentile([r["seconds"].get("verify", 0.0) * 1e3 for r in timed], 90),
                     "verify_over_predicted_p50": percentile(ratio, 50)}
    return out


def mismatches(result: LoopResult, truth: dict[tuple[int, ...], list[int]], prompts: list[list[int]]) -> int:
    """Requests whose tokens differ from the truth (AR's output) for their prompt."""
    return sum(r.tokens != truth.get(tuple(prompts[r.prompt])) for r in result.records)


# --------------------------------------------------------------------------------------------------- the runs
class Progress:
    """What the runs report as they go; silent here (the CLI's RichProgress shows a bar and a line per row)."""

    def begin(self, label: str, requests: int) -> None:
        pass

    def finished(self, record: Record) -> None:
        pass

    def row(self, row: dict) -> None:
        pass


class RichProgress(Progress):
    """A rich progress bar of finished requests per run, and a line per row, on stderr."""

    def __init__(self, console, on_row=None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

        self.console, self.on_row = console, on_row or (lambda row: None)
        self.bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                       TimeElapsedColumn(), console=console)
        self.task = None

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def begin(self, label: str, requests: int) -> None:
        if self.task is not None:
            self.bar.remove_task(self.task)
        self.task = self.bar.add_task(label, total=requests)

    def finished(self, record: Record) -> None:
        self.bar.advance(self.task)

    def row(self, row: dict) -> None:
        self.on_row(row)
        where = f"batch {row['batch']}" if row["mode"] == "closed" else f"load {row['load']:.2f}"
        if "error" in row:
            self.console.print(f"[red]{row['engine']} {where}: FAILED {row['error'][:500]}[/]")
            return
        vs = f", {row['speedup_vs_ar']:.2f}x AR" if "speedup_vs_ar" in row else ""
        exact = "" if "exact" not in row else (", exact" if row["exact"] else ", NOT EXACT")
        self.console.print(f"[dim]{row['engine']} {where}: {row['throughput_tok_s']:.1f} tok/s{vs}, TPOT p50 "
                           f"{row['tpot_p50_ms'] or 0:.2f} ms, TTFT p99 {row['ttft_p99_ms'] or 0:.1f} ms{exact}[/]")


@dataclass(frozen=True)
class ServeConfig:
    """What a serving run measures. batches: closed-loop client counts (open loop: the engines' max_num_seqs is the
    largest); loads: open-loop arrival rates as fractions of AR's capacity; scheduler / engine: SchedulerConfig and
    EngineConfig fields; warmup_tokens: new tokens of the untimed warm-up round (one request per client)."""

    mode: str
    batches: tuple[int, ...]
    max_new_tokens: int
    tree: str = "chain:7"
    per_client: int = 2
    loads: tuple[float, ...] = ()
    requests: int = 64
    seed: int = 0
    scheduler: tuple[tuple[str, object], ...] = ()
    engine: tuple[tuple[str, object], ...] = ()
    warmup_tokens: int = 16

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "scheduler": dict(self.scheduler), "engine": dict(self.engine)}


def parse_fields(text: str, flag: str) -> dict:
    """`FIELD:VALUE;FIELD:VALUE` -> {field: value}, values as true/false, integers, numbers or text."""
    out = {}
    for item in filter(None, (s.strip() for s in text.split(";"))):
        key, sep, value = item.partition(":")
        if not sep or not key:
            raise ValueError(f"{flag} {text!r}: use FIELD:VALUE;FIELD:VALUE, got {item!r}")
        out[key] = _coerce(value)
    return out


def _coerce(value: str):
    if value in ("true", "false"):
        return value == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def scheduler_config(fields: dict, max_num_seqs: int):
    """The engine's SchedulerConfig: the given fields, max_num_seqs the run's concurrency."""
    from specpilot.engine.scheduler import SchedulerConfig

    known = [f.name for f in dataclasses.fields(SchedulerConfig)]
    unknown = [k for k in fields if k not in known or k == "max_num_seqs"]
    if unknown:
        raise ValueError(f"--scheduler: unknown field {unknown[0]!r} (max_num_seqs comes from --batch); fields: "
                         f"{', '.join(k for k in known if k != 'max_num_seqs')}")
    return SchedulerConfig(**{**fields, "max_num_seqs": max_num_seqs})


class Engines:
    """Builds the run's engines on one runner: AR (no drafter) and speculative (the drafter, or under synthetic
    acceptance a SyntheticDrafter around it in a ProbingEngine), each with a SchedulerConfig for its concurrency.
    clock(): the driver's clock, the oracle's seconds taken out. probe=False: the synthetic drafter takes the truth
    as given, in a plain SpecEngine (on a margin target the verify answers what AR decode did, so a probe only
    confirms the truth; without one the step is the engine's alone)."""

    def __init__(self, model, make_drafter, eos: tuple[int, ...], cfg: ServeConfig,
                 profile: AcceptanceProfile | None, probe: bool = True):
        device = next(model.parameters()).device
        self.model, self.eos, self.cfg, self.profile, self.probe = model, eos, cfg, profile, probe
        self.runner = ModelRunner(model, Runtime.build(EngineConfig.from_dict(dict(cfg.engine)), device))
        self.make_drafter, self._drafter = make_drafter, None
        self.oracle = OracleClock(device) if profile is not None else None
        self.seeds = itertools.count(cfg.seed)
        self.drafters: list[SyntheticDrafter] = []  # the synthetic drafters built so far (their probe counts)

    def clock(self) -> float:
        return time.perf_counter() - (self.oracle.seconds if self.oracle is not None else 0.0)

    def ar(self, batch: int):
        return SpecEngine(self.runner, None, None, self.eos, scheduler=scheduler_config(dict(self.cfg.scheduler), batch))

    def spec(self, batch: int, truth: dict[tuple[int, ...], list[int]]):
        if self._drafter is None:  # built once, outside any timing, on the runner's runtime
            self._drafter = self.make_drafter(self.runner.runtime)
        tree, sched = TreeSpec.parse(self.cfg.tree), scheduler_config(dict(self.cfg.scheduler), batch)
        if self.profile is None:
            return SpecEngine(self.runner, self._drafter, tree, self.eos, scheduler=sched)
        # a seed per engine, so runs do not replay one acceptance pattern; a copy of the truth (the oracle learns)
        drafter = SyntheticDrafter(self._drafter, dict(truth), self.profile, self.model.config.vocab_size,
                                   seed=next(self.seeds), untimed=self.oracle)
        self.drafters.append(drafter)
        return (ProbingEngine if self.probe else SpecEngine)(self.runner, drafter, tree, self.eos, scheduler=sched)

    def oracle_mark(self) -> tuple[float, int]:
        if self.oracle is None:
            return 0.0, 0
        return self.oracle.seconds, sum(d.probes for d in self.drafters)


def _warm(engines: Engines, engine, prompts: list[list[int]], clients: int) -> dict:
    """The engine's verify graphs captured for every bucket (SpecEngine.warmup), then one untimed request per client
    (the drafter's graphs, compiled kernels, caches at size); returns warmup's report."""
    report = engine.warmup()
    params = SamplingParams(max_new_tokens=engines.cfg.warmup_tokens, ignore_eos=True)
    closed_loop(engine, prompts, clients, 1, params, engines.clock)
    return report


def _measure(engines: Engines, kind: str, batch: int, prompts, run, truth=None,
             on_finish=None) -> tuple[dict, LoopResult]:
    """Builds the engine, warms it, runs `run(engine, on_finish)` and summarizes it; the oracle's work is out."""
    engine = engines.ar(batch) if kind == "ar" else engines.spec(batch, truth)
    warm = _warm(engines, engine, prompts, batch)
    seconds, probes = engines.oracle_mark()
    logged = len(engine.step_log)
    result = run(engine, on_finish)
    row = summarize(result)
    row["step_profile"] = step_profile(list(engine.step_log)[logged:])
    row["warmup_graphs"], row["warmup_graph_bytes"] = warm["graphs"], warm["bytes"]
    if engines.oracle is not None and kind == "spec":  # the engine's split leaves the oracle's work out itself
        after, probes_after = engines.oracle_mark()
        count = probes_after - probes
        row["oracle"] = {"probes": count, "probes_per_step": count / max(row["steps"], 1),
                         "seconds_excluded": after - seconds}
    return row, result


def _labels(engines: Engines, target_kind: str) -> dict:
    p = engines.profile
    return {"target_kind": target_kind, "tree": engines.cfg.tree,
            "synthetic": (getattr(p, "label", None) or f"synthetic:{p.name}") if p is not None else False}


def _error(e: Exception) -> dict:
    traceback.print_exc()
    return {"error": f"{type(e).__name__}: {e}"[:2000]}


def serve_closed(engines: Engines, prompts: list[list[int]], target_kind: str = "checkpoint",
                 progress: Progress | None = None) -> list[dict]:
    """Per batch size: AR, then the speculative engine on the same prompts (AR's outputs are its truth), each in a
    closed loop of `batch` clients x per_client requests."""
    cfg, progress = engines.cfg, progress or Progress()
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, ignore_eos=engines.profile is not None)
    rows = []
    for batch in cfg.batches:
        base = {"mode": "closed", "batch": batch, **_labels(engines, target_kind)}

        def run(engine, on_finish, batch=batch):
            return closed_loop(engine, prompts, batch, cfg.per_client, params, engines.clock, on_finish)

        rows += _pair(engines, base, batch, prompts, run, progress, f"b{batch}")
    return rows


def serve_open(engines: Engines, prompts: list[list[int]], target_kind: str = "checkpoint",
               progress: Progress | None = None, capacity: float | None = None) -> list[dict]:
    """AR's capacity first (its closed-loop requests/s at the largest batch, unless given), then per load: Poisson
    arrivals (seeded; the same draws at every load, scaled) at load x capacity, AR then the speculative engine."""
    cfg, progress = engines.cfg, progress or Progress()
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, ignore_eos=engines.profile is not None)
    batch = max(cfg.batches)
    rows = []
    if capacity is None:
        def closed(engine, on_finish):
            return closed_loop(engine, prompts, batch, cfg.per_client, params, engines.clock, on_finish)

        progress.begin(f"AR capacity b{batch}", batch * cfg.per_client)
        row, _ = _measure(engines, "ar", batch, prompts, closed, on_finish=progress.finished)
        row = {"mode": "closed", "engine": "ar", "batch": batch, "role": "capacity", **_labels(engines, target_kind),
               **row}
        rows.append(row)
        progress.row(row)
        capacity = row["throughput_req_s"]
    for load in cfg.loads:
        rate = load * capacity
        arrivals = poisson_arrivals(cfg.requests, rate, cfg.seed)
        base = {"mode": "open", "batch": batch, "load": load, "rate_req_s": rate, "capacity_req_s": capacity,
                **_labels(engines, target_kind)}

        def run(engine, on_finish, arrivals=arrivals):
            return open_loop(engine, prompts, arrivals, params, engines.clock, on_finish)

        rows += _pair(engines, base, batch, prompts, run, progress, f"load {load:.2f}")
    return rows


def _pair(engines: Engines, base: dict, batch: int, prompts, run, progress: Progress, label: str) -> list[dict]:
    """AR then the speculative engine under `run`; the speculative row with its speedups and exactness."""
    total = batch * engines.cfg.per_client if base["mode"] == "closed" else engines.cfg.requests
    try:
        progress.begin(f"AR {label}", total)
        ar_row, ar = _measure(engines, "ar", batch, prompts, run, on_finish=progress.finished)
    except (ValueError, NotImplementedError):
        raise
    except Exception as e:  # noqa: BLE001 - AR failed: no truth for the speculative run at this point
        row = {**base, "engine": "ar", **_error(e)}
        progress.row(row)
        return [row]
    ar_row = {**base, "engine": "ar", **ar_row}
    progress.row(ar_row)
    truth = {tuple(prompts[r.prompt]): r.tokens for r in ar.records}
    row = {**base, "engine": "spec"}
    try:
        progress.begin(f"spec {label}", total)
        spec_row, spec = _measure(engines, "spec", batch, prompts, run, truth, progress.finished)
        bad = mismatches(spec, truth, prompts)
        row.update(spec_row, exact=bad == 0, mismatched_requests=bad)
        row.update(_speedups(row, ar_row))
    except (ValueError, NotImplementedError):
        raise
    except Exception as e:  # noqa: BLE001 - recorded; the next batch size or load still runs
        row.update(_error(e))
    progress.row(row)
    return [ar_row, row]


def _speedups(spec: dict, ar: dict) -> dict:
    """Throughput ratio spec / AR; latency ratios AR / spec (above 1: the speculative engine is faster)."""
    out = {}
    if spec.get("throughput_tok_s") and ar.get("throughput_tok_s"):
        out["speedup_vs_ar"] = spec["throughput_tok_s"] / ar["throughput_tok_s"]
    for key in ("tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "ttft_p99_ms"):
        if spec.get(key) and ar.get(key):
            out[f"{key[:-3]}_vs_ar"] = ar[key] / spec[key]
    return out


APPEND_KEYS = ("target", "target_kind", "drafter", "profile", "workloads")


def appended(doc: dict, extra: dict, cfg: ServeConfig, measures_capacity: bool) -> tuple[list[dict], list[dict]]:
    """`--append`: the rows of an earlier run's report `doc` that this run does not measure again (its batch sizes
    or loads, and AR's capacity when this run measures it), and the earlier runs' records (command, commit, date,
    GPU). The earlier run must have the same target, drafter, profile, workloads and configuration, batch sizes and
    loads aside."""
    mine = {k: v for k, v in extra["config"].items() if k not in ("batches", "loads")}
    theirs = {k: v for k, v in doc.get("config", {}).items() if k not in ("batches", "loads")}
    for key, old, new in [(k, doc.get(k), extra[k]) for k in APPEND_KEYS] + [("config", theirs, mine)]:
        if old != new:
            raise ValueError(f"--append: the report there is of another run ({key}: {old!r}, now {new!r}); give "
                             "another --out")
    runs = doc.get("runs") or [{k: doc.get(k) for k in ("command", "commit", "date", "gpu")}]
    again = set(cfg.batches) if cfg.mode == "closed" else set(cfg.loads)
    rows = [r for r in doc.get("results", [])
            if not (r.get("role") == "capacity" and measures_capacity)
            and (r.get("role") == "capacity" or (r["batch"] if cfg.mode == "closed" else r.get("load")) not in again)]
    earlier = next((r["capacity_req_s"] for r in rows if "capacity_req_s" in r), None)
    if measures_capacity and earlier is not None:
        raise ValueError(f"--append: the earlier loads are fractions of a capacity of {earlier:.6g} requests/s; give "
                         f"--capacity {earlier:.6g}")
    return rows, runs


def workload_prompts(tokenizer, workloads: dict[str, list[Prompt]], seed: int, chat: bool = True,
                     shuffle: bool = False) -> list[list[int]]:
    """Token ids of each conversation's first turn, the workloads interleaved (one of each in turn); shuffled with
    the seed for the open loop (prompt lengths drawn from the workloads' mix)."""
    lists = [[encode_turn(tokenizer, [p.turns[0]], [], chat) for p in ps] for ps in workloads.values()]
    mixed = [p for group in itertools.zip_longest(*lists) for p in group if p is not None]
    if shuffle:
        random.Random(seed).shuffle(mixed)
    return mixed

