"""A trial: one configuration (a recipe Choice) run on the speculative engine over a prompt list at one batch size,
timed, and its outputs checked by exact token forcing (the bench's check, bench/harness.py: forcing).

One runner per engine configuration (weight format and EngineConfig fields), built on first use with its own drafter
and caches sized for the largest tree to come; the first run of each configuration at a batch size is an untimed
warm-up (graph captures, compiles). Greedy decoding, EOS ignored: every run emits the same token count, so tok/s
compares configurations on equal work. Checkpoint targets only (synthetic acceptance on random targets is not wired
in yet).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence

import torch

from specpilot.bench.harness import Tolerance, calibrate, forcing, run_generation
from specpilot.config import EngineConfig
from specpilot.engine.engine import SpecEngine
from specpilot.pilot.controller import Run
from specpilot.pilot.recipe import Choice
from specpilot.pilot.workload import reserve
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.runtime.settings import Runtime
from specpilot.spec_decode.tree import TreeSpec


class Trial:
    def __init__(self, model, make_drafter: Callable, batch: int, max_new_tokens: int, longest_prompt: int,
                 trees: Sequence[str], tie_tolerance: float = 1e-3):
        """make_drafter(runtime): the drafter for a runner's runtime. trees: every tree spec that will run (the caches
        are sized once for the largest)."""
        self.model, self.make_drafter, self.batch = model, make_drafter, batch
        self.params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
        self.max_len = longest_prompt + max_new_tokens + 1
        self.trees = list(trees)
        self.device = next(model.parameters()).device
        self.stated = tie_tolerance
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
        return SpecEngine(runner, drafter, TreeSpec.parse(choice.tree), scheduler=sched)

    def measure(self, choice: Choice, prompts: Sequence[list[int]]) -> Run:
        """tok/s of the choice over the prompts in groups of the batch size, with its per-depth acceptance counts."""
        label = repr(choice.to_dict())
        make = lambda _truth: self.engine(choice)  # noqa: E731
        if label not in self._warm:
            warm = SamplingParams(max_new_tokens=min(16, self.params.max_new_tokens), ignore_eos=True)
            run_generation(make, list(prompts[:self.batch]), self.batch, warm, self.device)
            self._warm.add(label)
        outputs, stats, seconds = run_generation(make, list(prompts), self.batch, self.params, self.device)
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

    def force(self, prompts: Sequence[list[int]], outputs: Sequence[list[int]]) -> dict:
        """The bench's forcing check against the plain model (fp32 targets at the stated tie tolerance; half-precision
        ones at one calibrated on the target's own path noise, set at the first check)."""
        if self._stock is None:  # its own runner: forcing's allocations leave the engines' caches and graphs alone
            self._stock = ModelRunner(self.model, Runtime.build(EngineConfig(), self.device))
        stock = self._stock
        if self.tolerance is None:
            half = next(self.model.parameters()).dtype != torch.float32
            self.tolerance = (calibrate(stock, list(prompts), list(outputs), self.stated) if half
                              else Tolerance(self.stated, "stated", self.stated))
        return forcing(stock, list(prompts), list(outputs), self.tolerance)
