"""The keep/reject rule of the tuner: a candidate configuration replaces the incumbent only if it is faster on prompts
it was not chosen on, by more than the run-to-run noise, and its output is still exactly the plain model's.

The prompts are split once, by seed, into tuning prompts (where candidates are screened: a candidate not faster
there is rejected without further runs) and held-out prompts (where the decision is made). On the held-out prompts
the incumbent (A) and the candidate (B) run interleaved, A B A B ..., `repeats` pairs; each pair gives a ratio
B / A. The candidate is kept only if
- B's first held-out outputs are exact (checked before the other repeats run): greedy, exact token forcing passes;
  sampling, every output equals plain sampling with the same seed (the check's "failure" names what broke),
- the 95% interval of the pairs' geometric-mean ratio (Student t over the log ratios) lies above 1, and
- that ratio exceeds 1 by more than the incumbent's own run-to-run noise (the largest relative change between its
  consecutive held-out runs).
What is measured and how forcing is checked are functions handed in (trial.py runs the engine; tests use stand-ins).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specpilot.pilot.recipe import Choice

# two-sided 95% Student t quantiles by degrees of freedom; a df between entries takes the smaller df's (wider) value
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000}


@dataclass(frozen=True)
class Run:
    """One measured run of a configuration over a prompt list."""

    tok_s: float
    outputs: list[list[int]] = field(default_factory=list, compare=False)
    extra: dict = field(default_factory=dict, compare=False)  # what else the run measured (acceptance counts)


Measure = Callable[[Choice, Sequence[list[int]]], Run]  # (configuration, prompts) -> Run
Force = Callable[[Sequence[list[int]], Sequence[list[int]]], dict]  # (prompts, outputs) -> {"passed": bool, ...}


@dataclass(frozen=True)
class Split:
    tuning: tuple[int, ...]  # prompt indices
    held_out: tuple[int, ...]

    @staticmethod
    def of(count: int, held_out_share: float = 0.5, seed: int = 0) -> Split:
        """A deterministic disjoint split of `count` prompts (a shuffle by `seed`), each side at least one prompt."""
        if count < 2:
            raise ValueError(f"{count} prompt(s): tuning needs at least 2 (some to tune on, some held out)")
        if not 0 < held_out_share < 1:
            raise ValueError(f"held-out share {held_out_share}: must be in (0, 1)")
        order = list(range(count))
        random.Random(seed).shuffle(order)
        k = min(max(round(count * held_out_share), 1), count - 1)
        return Split(tuple(sorted(order[k:])), tuple(sorted(order[:k])))

    def pick(self, prompts: Sequence[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
        return [prompts[i] for i in self.tuning], [prompts[i] for i in self.held_out]


@dataclass(frozen=True)
class ControllerConfig:
    repeats: int = 3  # interleaved A/B pairs on the held-out prompts

    def __post_init__(self):
        if self.repeats < 2:
            raise ValueError(f"repeats {self.repeats}: must be >= 2 (one pair gives no interval)")


@dataclass(frozen=True)
class Verdict:
    """Why a candidate was kept or rejected, with the figures behind it."""

    batch: int
    candidate: Choice
    incumbent: Choice
    kept: bool
    reason: str
    tuning_ratio: float | None = None  # candidate / incumbent tok/s on the tuning prompts
    ratio: float | None = None  # geometric mean of the held-out pairs' ratios
    interval: tuple[float, float] | None = None  # its 95% interval
    noise: float | None = None  # the incumbent's largest relative change between consecutive held-out runs
    held_out: tuple[tuple[float, float], ...] = ()  # (incumbent, candidate) tok/s per pair
    forcing: dict | None = None
    predicted: float | None = None  # the cost model's tok/s of the candidate over stock's, when it ranked it

    def to_dict(self) -> dict:
        return {"batch": self.batch, "candidate": self.candidate.label, "config": self.candidate.to_dict(),
                "incumbent": self.incumbent.label, "kept": self.kept, "reason": self.reason,
                "tuning_ratio": self.tuning_ratio, "ratio": self.ratio,
                "interval": list(self.interval) if self.interval else None, "noise": self.noise,
                "held_out_tok_s": [list(p) for p in self.held_out], "forcing": self.forcing,
                "predicted_vs_stock": self.predicted}


def interval(ratios: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """Geometric mean of the ratios and its 95% interval (t over the log ratios); needs two ratios or more."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    if n < 2:
        raise ValueError("an interval needs at least two pairs")
    mean = statistics.fmean(logs)
    half = _t95(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half))


def _t95(df: int) -> float:
    return T95[max(k for k in T95 if k <= df)] if df < 120 else 1.96


class Controller:
    """Judges candidates against an incumbent with `measure` and `force` (see the module docstring)."""

    def __init__(self, measure: Measure, force: Force, config: ControllerConfig = ControllerConfig(),
                 on_event: Callable[[str], None] = lambda msg: None,
                 on_verdict: Callable[[Verdict], None] = lambda v: None):
        """on_event(message): what is being measured; on_verdict(verdict): each candidate's, as it is judged."""
        self.measure, self.force, self.config = measure, force, config
        self.on_event, self.on_verdict = on_event, on_verdict
        self._tuning: dict[tuple[str, int], Run] = {}  # (configuration, batch) -> its tuning run

    def tuning_run(self, choice: Choice, batch: int, prompts: Sequence[list[int]]) -> Run:
        """The configuration's run on the tuning prompts (measured once per configuration and batch size)."""
        key = (repr(choice.to_dict()), batch)
        if key not in self._tuning:
            self._tuning[key] = self.measure(choice, prompts)
        return self._tuning[key]

    def judge(self, batch: int, incumbent: Choice, candidate: Choice, tuning: Sequence[list[int]],
              held_out: Sequence[list[int]], predicted: float | None = None) -> Verdict:
        base = dict(batch=batch, candidate=candidate, incumbent=incumbent, predicted=predicted)
        a, b = self.tuning_run(incumbent, batch, tuning), self.tuning_run(candidate, batch, tuning)
        screen = b.tok_s / a.tok_s
        if screen <= 1.0:
            return Verdict(**base, kept=False, reason=f"not faster on the tuning prompts ({screen:.3f}x)",
                           tuning_ratio=screen)
        pairs, forcing = [], None
        for i in range(self.config.repeats):
            self.on_event(f"b{batch} {candidate.label}: held-out pair {i + 1}/{self.config.repeats}")
            ra = self.measure(incumbent, held_out)
            rb = self.measure(candidate, held_out)
            pairs.append((ra.tok_s, rb.tok_s))
            if forcing is None:
                forcing = self.force(held_out, rb.outputs)
                if not forcing.get("passed"):
                    what = forcing.get("failure", "exact token forcing failed")
                    return Verdict(**base, kept=False, reason=f"{what} on the held-out prompts",
                                   tuning_ratio=screen, held_out=tuple(pairs), forcing=forcing)
        ratio, ci = interval([rb / ra for ra, rb in pairs])
        incumbents = [ra for ra, _ in pairs]
        noise = max(abs(y / x - 1.0) for x, y in zip(incumbents, incumbents[1:]))
        figures = dict(tuning_ratio=screen, ratio=ratio, interval=ci, noise=noise, held_out=tuple(pairs),
                       forcing=forcing)
        if ci[0] <= 1.0:
            reason = f"not faster on the held-out prompts ({ratio:.3f}x, 95% interval {ci[0]:.3f}-{ci[1]:.3f})"
            return Verdict(**base, kept=False, reason=reason, **figures)
        if ratio - 1.0 <= noise:
            reason = f"held-out gain {ratio - 1.0:+.1%} within the run-to-run noise ({noise:.1%})"
            return Verdict(**base, kept=False, reason=reason, **figures)
        reason = f"faster on the held-out prompts ({ratio:.3f}x, 95% interval {ci[0]:.3f}-{ci[1]:.3f}), exact"
        return Verdict(**base, kept=True, reason=reason, **figures)

    def search(self, batch: int, stock: Choice, ranked: Sequence[tuple[Choice, float | None]],
               tuning: Sequence[list[int]], held_out: Sequence[list[int]]) -> tuple[Choice, list[Verdict]]:
        """Judges the ranked candidates in order, each against the incumbent of the moment (a kept one becomes it);
        returns the final incumbent and every verdict."""
        incumbent, verdicts = stock, []
        for candidate, predicted in ranked:
            v = self.judge(batch, incumbent, candidate, tuning, held_out, predicted)
            verdicts.append(v)
            self.on_verdict(v)
            if v.kept:
                incumbent = candidate
        return incumbent, verdicts
