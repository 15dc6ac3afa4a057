"""The controller's keep/reject rule with stand-in measurements (fast, deterministic): a change faster on the tuning
prompts only is rejected, one that breaks forcing is rejected, a clearly faster exact one is kept; the prompt split
is disjoint and set by the seed; the interval arithmetic."""

from __future__ import annotations

import itertools
import math

import pytest

from specpilot.pilot.controller import Controller, ControllerConfig, Run, Split, interval
from specpilot.pilot.recipe import Choice

TUNING = [[1, 2], [3, 4]]
HELD_OUT = [[5, 6], [7, 8]]
STOCK = Choice("chain:7")
JITTER = (1.0, 1.01, 0.99, 1.0, 1.005, 0.995)  # run-to-run noise of about 1%


class StandIn:
    """tok/s = 100 x the candidate's speed-up (on the tuning prompts and on the held-out ones) x the next jitter;
    outputs [[9]] for a configuration that breaks forcing, else the prompts' own tokens."""

    def __init__(self, speedups: dict[str, tuple[float, float]], broken: tuple[str, ...] = ()):
        self.speedups, self.broken, self.jitter, self.calls = speedups, broken, itertools.cycle(JITTER), []

    def measure(self, choice: Choice, prompts) -> Run:
        self.calls.append((choice.tree, prompts is TUNING))
        tuning, held = self.speedups.get(choice.tree, (1.0, 1.0))
        outputs = [[9]] if choice.tree in self.broken else [list(p) for p in prompts]
        return Run(100.0 * (tuning if prompts is TUNING else held) * next(self.jitter), outputs)

    @staticmethod
    def force(prompts, outputs) -> dict:
        bad = outputs != [list(p) for p in prompts]
        return {"passed": not bad, "failures": int(bad)}


def _judge(stand_in: StandIn, tree: str, repeats: int = 3):
    c = Controller(stand_in.measure, stand_in.force, ControllerConfig(repeats=repeats))
    return c.judge(1, STOCK, Choice(tree), TUNING, HELD_OUT)


def test_faster_on_tuning_prompts_only_is_rejected():
    v = _judge(StandIn({"chain:3": (1.3, 1.0)}), "chain:3")
    assert not v.kept and v.tuning_ratio > 1.25
    assert v.reason.startswith("not faster on the held-out prompts") and v.interval[0] <= 1.0 <= v.interval[1]
    assert len(v.held_out) == 3 and v.forcing["passed"]


def test_a_change_that_breaks_forcing_is_rejected_at_once():
    s = StandIn({"chain:3": (1.5, 1.5)}, broken=("chain:3",))
    v = _judge(s, "chain:3")
    assert not v.kept and v.reason == "exact token forcing failed on the held-out prompts"
    assert len(v.held_out) == 1 and not v.forcing["passed"]  # no further repeats once forcing failed
    assert v.ratio is None


def test_a_sampled_change_that_differs_from_plain_sampling_is_rejected_at_once_saying_so():
    s = StandIn({"chain:3": (1.5, 1.5)}, broken=("chain:3",))

    def same_as_plain(prompts, outputs) -> dict:  # a sampled trial's check (trial.py: Trial.force)
        differ = sum(o != list(p) for o, p in zip(outputs, prompts))
        return {"check": "equal to AR sampling with the same seed", "passed": not differ,
                "failure": f"{differ} of {len(outputs)} outputs differ from plain sampling with the same seed"}

    v = Controller(s.measure, same_as_plain, ControllerConfig(repeats=3)).judge(1, STOCK, Choice("chain:3"), TUNING,
                                                                                HELD_OUT)
    assert not v.kept and len(v.held_out) == 1 and v.ratio is None
    assert v.reason == "1 of 1 outputs differ from plain sampling with the same seed on the held-out prompts"


def test_a_clearly_faster_exact_change_is_kept_with_its_interval():
    v = _judge(StandIn({"chain:3": (1.4, 1.4)}), "chain:3")
    assert v.kept and v.forcing["passed"]
    assert 1.0 < v.interval[0] < v.ratio < v.interval[1] and v.ratio == pytest.approx(1.4, rel=0.02)
    assert v.noise == pytest.approx(0.01, abs=0.011)
    doc = v.to_dict()
    assert doc["kept"] and doc["candidate"] == "chain:3" and doc["incumbent"] == "chain:7"
    assert len(doc["held_out_tok_s"]) == 3 and len(doc["interval"]) == 2


def test_not_faster_on_tuning_prompts_costs_no_held_out_runs():
    s = StandIn({"chain:3": (0.9, 2.0)})
    v = _judge(s, "chain:3")
    assert not v.kept and v.reason.startswith("not faster on the tuning prompts") and not v.held_out
    assert all(tuning for _, tuning in s.calls)


def test_a_gain_within_the_incumbents_noise_is_rejected():
    s = StandIn({"chain:3": (1.2, 1.02)})
    s.jitter = itertools.cycle((1.0, 1.0, 1.05, 1.071, 1.0, 1.02))  # the incumbent moves 5% between its runs
    v = _judge(s, "chain:3")
    assert not v.kept and "within the run-to-run noise" in v.reason and v.interval[0] > 1.0


def test_search_makes_a_kept_candidate_the_incumbent():
    s = StandIn({"chain:3": (1.4, 1.4), "chain:5": (1.2, 1.2), "static:2,2,2": (1.3, 1.0)})
    events, seen = [], []
    c = Controller(s.measure, s.force, ControllerConfig(repeats=2), on_event=events.append, on_verdict=seen.append)
    ranked = [(Choice("chain:3"), 1.5), (Choice("chain:5"), 1.3), (Choice("static:2,2,2"), 1.1)]
    best, verdicts = c.search(1, STOCK, ranked, TUNING, HELD_OUT)
    assert best == Choice("chain:3") and [v.kept for v in verdicts] == [True, False, False]
    assert verdicts[1].incumbent == Choice("chain:3")  # judged against the kept one, not stock
    assert verdicts[0].to_dict()["predicted_vs_stock"] == 1.5 and seen == verdicts
    assert any("held-out pair" in e for e in events)
    # each configuration's tuning run is measured once per batch size
    assert sum(1 for tree, tuning in s.calls if tuning and tree == "chain:3") == 1


def test_split_is_disjoint_covering_and_set_by_the_seed():
    a = Split.of(10, 0.5, seed=0)
    assert set(a.tuning).isdisjoint(a.held_out) and sorted(a.tuning + a.held_out) == list(range(10))
    assert Split.of(10, 0.5, seed=0) == a and Split.of(10, 0.5, seed=1) != a
    assert len(Split.of(2, 0.9).held_out) == 1 and len(Split.of(2, 0.1).tuning) == 1
    tuning, held = Split.of(4, 0.5, 3).pick([[0], [1], [2], [3]])
    assert len(tuning) == 2 and len(held) == 2 and not set(map(tuple, tuning)) & set(map(tuple, held))
    with pytest.raises(ValueError, match="tuning needs at least 2"):
        Split.of(1)
    with pytest.raises(ValueError, match="repeats 1: must be >= 2"):
        ControllerConfig(repeats=1)


def test_interval_by_hand():
    ratio, (lo, hi) = interval([1.1, 1.3])
    mean = (math.log(1.1) + math.log(1.3)) / 2
    half = 12.706 * abs(math.log(1.3) - math.log(1.1)) / math.sqrt(2) / math.sqrt(2)
    assert ratio == pytest.approx(math.exp(mean)) and lo == pytest.approx(math.exp(mean - half))
    assert hi == pytest.approx(math.exp(mean + half))
