"""A short measured workload on the speculative engine: B requests started together, warm-up steps, then timed
steps, read back as the engine's own step log (component seconds per step) and the wall time of the timed steps.

The engine is the one a deployment runs (SpecEngine), or under synthetic acceptance (random-weight targets) a
ProbingEngine around a SyntheticDrafter (bench/probing.py, bench/synthetic.py): the drafter runs at full cost, the
oracle's own work is left out of the components and, through the OracleClock, out of the wall time. Every request
decodes its full tree unless the scheduler is adaptive. The timed steps run back to back with one device sync at the
end: host work overlaps the device as in a real run. A workload decodes greedily or samples (pilot/sampling.py: each
prompt with its own seed).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from specpilot.bench.harness import OracleClock
from specpilot.bench.probing import ProbingEngine
from specpilot.bench.synthetic import AcceptanceProfile, SyntheticDrafter
from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.engine.request import Status
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.pilot.sampling import Sampling
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.tree import TreeSpec

COMPONENTS = ("draft", "verify", "accept", "commit", "other")


@dataclass
class StepRun:
    """What the timed steps did."""

    batch: int
    steps: int
    wall_s: float  # the timed steps, the oracle's seconds taken out
    emitted: int  # tokens the timed steps emitted
    context: float  # mean committed tokens per request over the timed steps
    records: list[dict] = field(default_factory=list)  # their step-log records, each with "seconds" per component
    drafted: list[int] = field(default_factory=list)  # per depth, over the timed steps and every request
    accepted: list[int] = field(default_factory=list)
    taus: list[float] = field(default_factory=list)  # per request: tokens per step over the timed steps
    prefill: list[dict] = field(default_factory=list)  # the start's step-log records that carried prefill chunks

    @property
    def tok_s(self) -> float:
        return self.emitted / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def step_s(self) -> float:
        return self.wall_s / max(self.steps, 1)

    @property
    def tau(self) -> float:
        """Tokens per request per step."""
        return self.emitted / max(self.steps * self.batch, 1)

    def medians(self) -> dict[str, float]:
        """Median seconds per component over the timed steps, and host_gap: the mean step wall minus the sum of
        the components' means (the device idle between steps)."""
        timed = [r["seconds"] for r in self.records if "seconds" in r]
        out = {c: statistics.median(s.get(c, 0.0) for s in timed) for c in COMPONENTS} if timed else {}
        if timed:
            means = sum(statistics.fmean(s.get(c, 0.0) for s in timed) for c in COMPONENTS)
            out["host_gap"] = max(self.step_s - means, 0.0)
        return out

    def to_dict(self) -> dict:
        return {"batch": self.batch, "steps": self.steps, "wall_s": self.wall_s, "emitted": self.emitted,
                "tok_s": self.tok_s, "step_ms": self.step_s * 1e3, "tau": self.tau, "context": self.context,
                "components_ms": {k: v * 1e3 for k, v in self.medians().items()},
                "drafted_per_depth": self.drafted, "accepted_per_depth": self.accepted,
                "tau_per_request": self.taus}


def truth_for(model, runner, prompts: list[list[int]], tokens: int,
              sampling: Sampling = Sampling()) -> dict[tuple[int, ...], list[int]]:
    """Each prompt's plain continuation of `tokens` tokens (EOS ignored). Greedy: a margin target's chain computed on
    the host from its codebook (bench/shapes.py), else plain greedy decoding on the runner. Sampling: plain sampling
    on the runner, each prompt alone with its own seed (the output every speculative run of it must equal)."""
    if not sampling.greedy:
        gen = Generator(runner)
        plain = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
        return {tuple(p): list(gen.generate([p], sampling.apply(plain, p))[0].token_ids) for p in prompts}
    codes = getattr(model, "margin_codes", None)
    if codes is not None and all(len(p) >= 2 for p in prompts):
        memory = model.config.is_hybrid and codes.gammas > 1
        return {tuple(p): codes.chain(p, tokens, memory) for p in prompts}
    outs = Generator(runner).generate(prompts, SamplingParams(max_new_tokens=tokens, ignore_eos=True))
    return {tuple(p): list(o.token_ids) for p, o in zip(prompts, outs)}


def reserve(runner, drafter, batch: int, max_model_len: int, trees: list[str]) -> None:
    """Sizes the runner's and the drafter's caches for the largest workload to come (`batch` requests of up to
    `max_model_len` tokens, the largest of the tree specs' full trees), as the engine would size them: later engines
    on the same runner and drafter then never reallocate them smaller. (A drafter's context extension left pending
    by an aborted request is flushed at its next proposal, into whatever slot number it had: past a smaller cache.)"""
    specs = [TreeSpec.parse(t) for t in trees]
    slot_len = max_model_len + 1
    runner.allocate(batch + 1, slot_len + max(s.max_tree_nodes for s in specs))
    if drafter is not None:
        drafter.allocate(batch + 1, slot_len + max(s.max_grown_nodes for s in specs))


def build_engine(runner, drafter, tree: str, batch: int, max_model_len: int, profile: AcceptanceProfile | None = None,
                 truth: dict | None = None, clock: OracleClock | None = None, adaptive: bool = False,
                 seed: int = 0) -> SpecEngine:
    """The engine of one workload: `batch` slots, the tree spec's full tree for every request (adaptive=False) or
    the node budget; under a profile a ProbingEngine whose SyntheticDrafter wraps `drafter`."""
    sched = SchedulerConfig(max_num_seqs=batch, adaptive=adaptive, max_model_len=max_model_len)
    spec = TreeSpec.parse(tree)
    if profile is None:
        return SpecEngine(runner, drafter, spec, scheduler=sched)
    synthetic = SyntheticDrafter(drafter, dict(truth or {}), profile, runner.config.vocab_size, seed=seed,
                                 untimed=clock)
    return ProbingEngine(runner, synthetic, spec, scheduler=sched)


def start(engine: SpecEngine, prompts: list[list[int]], params: SamplingParams,
          sampling: Sampling = Sampling()) -> list:
    """Adds the prompts (each sampling as the workload samples it) and steps until every one decodes; returns the
    requests."""
    ids = [engine.add_request(p, sampling.apply(params, p)) for p in prompts]
    engine.step()
    while any(r.status is not Status.DECODING for r in engine.scheduler.running):
        engine.step()
    reqs = [engine.scheduler.by_id.get(i) for i in ids]
    if any(r is None for r in reqs):
        raise RuntimeError("a request finished while the workload started: raise max_new_tokens")
    return reqs


def run_steps(engine: SpecEngine, prompts: list[list[int]], warmup: int, steps: int, max_new_tokens: int,
              clock: OracleClock | None = None, sampling: Sampling = Sampling()) -> StepRun:
    """Starts the prompts as requests, runs `warmup` steps, then `steps` timed steps (and one more, untimed, so that
    the last timed step's component times are read), then aborts the requests."""
    device = engine.runner.device
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    started = len(engine.step_log)
    reqs = start(engine, prompts, params, sampling)
    for _ in range(warmup):
        engine.step()
    _sync(device)
    emitted0 = [len(r.result.token_ids) for r in reqs]
    steps0 = [r.stats.steps for r in reqs]
    drafted0 = [list(r.stats.drafted_per_depth) for r in reqs]
    accepted0 = [list(r.stats.accepted_per_depth) for r in reqs]
    ctx0 = [r.committed for r in reqs]
    logged = len(engine.step_log)
    hidden = clock.seconds if clock is not None else 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    _sync(device)
    wall = time.perf_counter() - t0 - ((clock.seconds - hidden) if clock is not None else 0.0)
    if any(r.status is Status.FINISHED for r in reqs):
        raise RuntimeError("a request finished during the timed steps: raise max_new_tokens")
    emitted = [len(r.result.token_ids) - e for r, e in zip(reqs, emitted0)]
    stepped = [r.stats.steps - s for r, s in zip(reqs, steps0)]
    ctx1 = [r.committed for r in reqs]
    drafted = _diff([r.stats.drafted_per_depth for r in reqs], drafted0)
    accepted = _diff([r.stats.accepted_per_depth for r in reqs], accepted0)
    engine.step()  # the timed steps' last component times are read at the next step
    log = list(engine.step_log)
    records = log[logged:logged + steps]
    prefill = [r for r in log[started:logged] if r["prefill"] and "seconds" in r]
    run = StepRun(len(reqs), steps, wall, sum(emitted), (sum(ctx0) + sum(ctx1)) / (2 * len(reqs)), records,
                  drafted, accepted, [e / max(n, 1) for e, n in zip(emitted, stepped)], prefill)
    for r in reqs:
        if r.status is not Status.FINISHED:
            engine.abort(r.request_id)
    return run


def _diff(after: list[list[int]], before: list[list[int]]) -> list[int]:
    depth = max((len(a) for a in after), default=0)
    return [sum((a[d] if d < len(a) else 0) - (b[d] if d < len(b) else 0) for a, b in zip(after, before))
            for d in range(depth)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
