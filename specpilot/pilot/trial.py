"""A trial: one configuration (a recipe Choice) run on the speculative engine over a prompt list at one batch size,
timed, and its outputs checked for exactness: greedy, by exact token forcing (the bench's check, bench/harness.py:
forcing); sampling, every output equal to plain (AR) sampling of its prompt with the same seed, token for token (the
bench's check of a sampled row, bench/harness.py: same_as_ar).

One runner per engine configuration (weight format and EngineConfig fields), built on first use with its own drafter
and caches sized for the largest tree to come; the first run of each configuration at a batch size is an untimed
warm-up (graph captures, compiles). The workload's decoding (pilot/sampling.py: greedy, or sampling with each
prompt's own seed), EOS ignored: every run emits the same token count, so tok/s compares configurations on equal work.

Under synthetic acceptance (random-weight targets, bench/synthetic.py) the engine is a ProbingEngine around a
SyntheticDrafter of the trial's drafter: the oracle follows each prompt's stock continuation (workload.truth_for,
computed once per prompt) at the profile's rates, its seconds are taken out of the timing (OracleClock), and the
n-th group of every run draws the oracle seed n, so that the two sides of a pair see the same acceptance pattern.
Sampling, the oracle's guess is each prompt's plain sampled output (the probe answers the target's raced token).
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Callable, Sequence

import torch

from specpilot.bench.harness import OracleClock, Tolerance, calibrate, forcing, run_generation, same_as_ar
from specpilot.bench.probing import ProbingEngine
from specpilot.bench.synthetic import AcceptanceProfile, SyntheticDrafter
from specpilot.config import EngineConfig
from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import GenerationResult
from specpilot.pilot.controller import Run
from specpilot.pilot.recipe import Choice
from specpilot.pilot.sampling import Sampling
from specpilot.pilot.workload import reserve, truth_for
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.runtime.settings import Runtime
from specpilot.spec_decode.tree import TreeSpec


class Trial:
    def __init__(self, model, make_drafter: Callable, batch: int, max_new_tokens: int, longest_prompt: int,
                 trees: Sequence[str], tie_tolerance: float = 1e-3, calibrate_tolerance: bool = False,
                 profile: AcceptanceProfile | None = None, sampling: Sampling = Sampling()):
        """make_drafter(runtime): the drafter for a runner's runtime. trees: every tree spec that will run (the caches
        are sized once for the largest). calibrate_tolerance (flat random targets, half-precision checkpoints):
        forcing's tie tolerance from the target's own path noise. profile: synthetic acceptance (random targets).
        sampling: the workload's decoding (default greedy)."""
        self.model, self.make_drafter, self.batch, self.sampling = model, make_drafter, batch, sampling
        self.params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
        self.max_len = longest_prompt + max_new_tokens + 1
        self.trees = list(trees)
        self.device = next(model.parameters()).device
        self.stated, self.calibrate_tolerance, self.profile = tie_tolerance, calibrate_tolerance, profile
        self.clock = OracleClock(self.device) if profile is not None else None
        self._truth: dict[tuple[int, ...], list[int]] = {}  # the oracle's guesses (it corrects them as it learns)
        self._plain: dict[tuple[int, ...], list[int]] = {}  # sampling: each prompt's plain sampled output
        self._groups = itertools.count()
        self.tolerance: Tolerance | None = None
        self._runners: dict[str, tuple[ModelRunner, object]] = {}
        self._warm: set[str] = set()
        self._stock: ModelRunner | None = None

    def pair(self, choice: Choice) -> tuple[ModelRunner, object]:
        """The runner and drafter of the choice's engine configuration (built on first use)."""
        key = json.dumps(choice.engine_config().to_dict(), sort_keys=True)
        if key not in self._runners:
            runner = ModelRunner(self.model, Runtime.build(choice.engine_config(), self.device))
            drafter = self.make_drafter(runner.runtime)
            reserve(runner, drafter, self.batch, self.max_len, self.trees)
            self._runners[key] = (runner, drafter)
        return self._runners[key]

    def engine(self, choice: Choice) -> SpecEngine:
        runner, drafter = self.pair(choice)
        sched = choice.scheduler_config(self.batch, max_model_len=self.max_len)
        if self.profile is None:
            return SpecEngine(runner, drafter, TreeSpec.parse(choice.tree), scheduler=sched)
        synthetic = SyntheticDrafter(drafter, self._truth, self.profile, self.model.config.vocab_size,
                                     seed=next(self._groups), untimed=self.clock)
        return ProbingEngine(runner, synthetic, TreeSpec.parse(choice.tree), scheduler=sched)

    def measure(self, choice: Choice, prompts: Sequence[list[int]]) -> Run:
        """tok/s of the choice over the prompts in groups of the batch size, with its per-depth acceptance counts."""
        label = repr(choice.to_dict())
        make = lambda _truth: PerPrompt(self.engine(choice), self.sampling)  # noqa: E731
        if self.profile is not None:
            missing = [list(p) for p in dict.fromkeys(map(tuple, prompts)) if p not in self._truth]
            if missing and self.sampling.greedy:
                self._truth.update(truth_for(self.model, self._stock_runner(), missing, self.params.max_new_tokens + 1))
            elif missing:
                self._truth.update({tuple(p): list(self.plain([p])[0]) for p in missing})
        if label not in self._warm:
            warm = SamplingParams(max_new_tokens=min(16, self.params.max_new_tokens), ignore_eos=True)
            run_generation(make, list(prompts[:self.batch]), self.batch, warm, self.device, clock=self.clock)
            self._warm.add(label)
        self._groups = itertools.count()  # group n of every run draws oracle seed n: paired runs, paired patterns
        outputs, stats, seconds = run_generation(make, list(prompts), self.batch, self.params, self.device,
                                                 clock=self.clock)
        tokens = sum(map(len, outputs))
        real = [s for s in stats if s is not None]
        depth = max((len(s.drafted_per_depth) for s in real), default=0)
        extra = {"drafted": [sum(s.drafted_per_depth[d] for s in real if d < len(s.drafted_per_depth))
                             for d in range(depth)],
                 "accepted": [sum(s.accepted_per_depth[d] for s in real if d < len(s.accepted_per_depth))
                              for d in range(depth)],
                 "rows": sum(s.steps for s in real), "tau": statistics.fmean(s.tau for s in real) if real else 1.0,
                 "seconds": seconds, "tokens": tokens}
        return Run(tokens / seconds if seconds > 0 else 0.0, outputs, extra)

    def _stock_runner(self) -> ModelRunner:
        """The plain model on its own runner: forcing's (and the oracle's truth's) allocations leave the engines'
        caches and graphs alone."""
        if self._stock is None:
            self._stock = ModelRunner(self.model, Runtime.build(EngineConfig(), self.device))
        return self._stock

    def close(self) -> None:
        """Frees the runners' caches and graphs now (graphs reference their runner: a cycle the next gc would break)."""
        for runner, _ in self._runners.values():
            runner.graphs.clear()
            runner.verify_graphs.clear()
            runner.cache = None
        self._runners.clear()
        self._stock = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def plain(self, prompts: Sequence[list[int]]) -> list[list[int]]:
        """Sampling: each prompt's plain (AR) sampled output with its seed, on the plain model's runner (computed
        once per prompt)."""
        missing = [list(p) for p in dict.fromkeys(map(tuple, prompts)) if p not in self._plain]
        if missing:
            self._plain.update(truth_for(self.model, self._stock_runner(), missing, self.params.max_new_tokens,
                                         self.sampling))
        return [self._plain[tuple(p)] for p in prompts]

    def force(self, prompts: Sequence[list[int]], outputs: Sequence[list[int]]) -> dict:
        """The exactness check. Greedy: the bench's forcing check against the plain model (fp32 targets at the stated
        tie tolerance; half-precision ones at one calibrated on the target's own path noise, set at the first check).
        Sampling: every output equals the prompt's plain sampled output with the same seed, token for token (a
        "failure" line says how many differ)."""
        if not self.sampling.greedy:
            verdict = {**same_as_ar(list(outputs), self.plain(prompts)), "sampling": self.sampling.to_dict()}
            if not verdict["passed"]:
                verdict["failure"] = (f"{verdict['failures']} of {len(outputs)} outputs differ from plain sampling "
                                      f"with the same seed")
            return verdict
        stock = self._stock_runner()
        if self.tolerance is None:
            self.tolerance = (calibrate(stock, list(prompts), list(outputs), self.stated) if self.calibrate_tolerance
                              else Tolerance(self.stated, "stated", self.stated))
        return forcing(stock, list(prompts), list(outputs), self.tolerance)


class PerPrompt:
    """A SpecEngine as run_generation drives it, each prompt sampling as the workload samples it (its own seed):
    generate adds every prompt with its own params, steps until all finish, and returns (result, stats) per prompt
    in order."""

    def __init__(self, engine: SpecEngine, sampling: Sampling):
        self.engine, self.sampling = engine, sampling

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[tuple[GenerationResult, object]]:
        ids = [self.engine.add_request(p, self.sampling.apply(params, p)) for p in prompts]
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                tokens[out.request_id].extend(out.new_token_ids)
        return [(GenerationResult(len(p), tokens[i]), self.engine.stats(i)) for p, i in zip(prompts, ids)]
