"""`specpilot tune`'s search: per batch size, candidate configurations from a small space (tree shape, the adaptive
node budget on or off, weight format), ranked by the cost model (cost_model.py) at the acceptance the stock
configuration reaches on the tuning prompts, the best few judged by the controller (controller.py) in rank order,
each against the incumbent of the moment; the result is a Recipe (recipe.py) with every candidate's verdict. The
workload's sampling (pilot/sampling.py) is part of what is tuned: the acceptance, the timing and the exactness check
are the ones at its temperature, and the search space at temperature > 0 holds the best-first tree.

Stock is chain:7 (cut to the drafter's depth), bf16, every request its full tree (the node budget off). The cost
model predicts an adaptive candidate as its full tree (the budget's ragged trees are not modelled), so adaptive
candidates rank next to their full-tree twins and only the controller's measurement tells them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.table import Table

from specpilot.pilot.controller import Controller, Run, Split, Verdict
from specpilot.pilot.cost_model import AcceptanceStats, Configuration, CostModel
from specpilot.pilot.recipe import Choice
from specpilot.pilot.sampling import Sampling
from specpilot.spec_decode.tree import TreeSpec

TREES = ("chain:3", "chain:5", "chain:7", "static:2,2,2", "static:3,2,1,1", "dynamic:4,7,15")
# at temperature > 0 also the best-first 24-node tree: DFlash's coupled proposals keep most of the greedy tree's gain
# with it (docs/sampling.md)
SAMPLED_TREES = TREES + ("dynamic:24,7,24",)
STOCK_TREE = "chain:7"


def default_trees(sampling: Sampling) -> tuple[str, ...]:
    """The tree specs searched when --trees is not given: TREES, and SAMPLED_TREES at temperature > 0."""
    return TREES if sampling.greedy else SAMPLED_TREES


@dataclass(frozen=True)
class TunePlan:
    batch_sizes: tuple[int, ...] = (1,)
    trees: tuple[str, ...] = TREES
    adaptive: tuple[bool, ...] = (False, True)
    weight_formats: tuple[str, ...] = ("bf16",)
    measure: int = 3  # best-ranked candidates measured per batch size
    repeats: int = 3  # interleaved held-out pairs per measured candidate
    held_out_share: float = 0.5
    seed: int = 0

    def __post_init__(self):
        for flag, values in (("--batch-sizes", self.batch_sizes), ("--measure", (self.measure,)),
                             ("--repeats", (self.repeats,))):
            bad = [v for v in values if v < 1]
            if bad or not values:
                raise ValueError(f"{flag} {bad[0] if bad else 'missing'}: must be >= 1")
        if self.repeats < 2:
            raise ValueError(f"--repeats {self.repeats}: must be >= 2 (one pair gives no interval)")
        if not 0 < self.held_out_share < 1:
            raise ValueError(f"--held-out {self.held_out_share}: the share of prompts held out, in (0, 1)")
        for tree in self.trees:
            TreeSpec.parse(tree, "--trees")
        for fmt in self.weight_formats:
            if fmt not in ("bf16", "w12n", "w12n_only"):
                raise ValueError(f"--weight-formats {fmt}: use bf16, w12n or w12n_only")


def stock(max_depth: int | None) -> Choice:
    return Choice(_capped(STOCK_TREE, max_depth))


def space(plan: TunePlan, max_depth: int | None) -> list[Choice]:
    """Every candidate of the plan (trees cut to the drafter's depth, duplicates dropped), stock left out."""
    out, base = [], stock(max_depth)
    for fmt in plan.weight_formats:
        for tree in plan.trees:
            for adaptive in plan.adaptive:
                c = Choice(_capped(tree, max_depth), adaptive, fmt)
                if c != base and c not in out:
                    out.append(c)
    return out


def replayed(recipe, batch: int, max_depth: int | None) -> list[Choice]:
    """A recipe's kept changes for the entry that `batch` takes, in the order they were kept (trees cut to this
    drafter's depth): the candidates of a replay, each judged again where it runs now."""
    size, _ = recipe.choice_for(batch)
    out = []
    for entry in recipe.evidence.get(size, []):
        if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
            raise ValueError(f"recipe evidence of batch {size}: an entry without its 'config' object")
        c = Choice.from_dict(entry["config"])
        c = Choice(_capped(c.tree, max_depth), c.adaptive, c.weight_format, c.engine, c.scheduler)
        if c not in out:
            out.append(c)
    return out


def _capped(tree: str, max_depth: int | None) -> str:
    spec = TreeSpec.parse(tree)
    return str(spec.capped(max_depth) if max_depth else spec)


def acceptance_of(run: Run) -> AcceptanceStats:
    """Per-depth acceptance from a chain run's counts (Trial.measure's extra)."""
    e = run.extra
    return AcceptanceStats.from_counts(list(e.get("drafted", [])), list(e.get("accepted", [])), int(e.get("rows", 0)))


def rank(model: CostModel | None, candidates: Sequence[Choice], base: Choice, batch: int, context: float,
         acceptance: AcceptanceStats | None, graphs: bool = True) -> list[tuple[Choice, float | None]]:
    """Candidates by the cost model's predicted tok/s over stock's, best first (without a model: as given)."""
    if model is None or acceptance is None:
        return [(c, None) for c in candidates]

    def tok_s(c: Choice) -> float:
        return model.predict(Configuration(batch, c.tree, context, acceptance, c.weight_format, graphs)).tok_s

    ref = tok_s(base)
    scored = [(c, tok_s(c) / ref) for c in candidates]
    return sorted(scored, key=lambda s: -s[1])


@dataclass
class BatchResult:
    batch: int
    choice: Choice
    verdicts: list[Verdict]
    skipped: list[dict]  # candidates ranked but not measured

    def log(self) -> list[dict]:
        return [v.to_dict() for v in self.verdicts] + self.skipped

    def evidence(self) -> list[dict]:
        return [v.to_dict() for v in self.verdicts if v.kept]


def tune_batch(controller: Controller, plan: TunePlan, batch: int, prompts: Sequence[list[int]],
               candidates: Sequence[Choice], base: Choice,
               model_for: Callable[[Run], tuple[CostModel | None, AcceptanceStats | None, float]]) -> BatchResult:
    """One batch size: stock's tuning run (its acceptance feeds the ranking), the ranking, then the controller on the
    best `plan.measure` candidates. model_for(stock's tuning run) -> (cost model, acceptance, mean context)."""
    split = Split.of(len(prompts), plan.held_out_share, plan.seed)
    tuning, held_out = split.pick(prompts)
    for side, got in (("tuning", tuning), ("held-out", held_out)):
        if len(got) < batch:
            raise ValueError(f"--batch-sizes {batch}: only {len(got)} {side} prompts (of {len(prompts)}); raise "
                             f"--limit or add --workloads so that each side has at least {batch}")
    model, acceptance, context = model_for(controller.tuning_run(base, batch, tuning))
    ranked = rank(model, candidates, base, batch, context, acceptance)
    measured, rest = ranked[:plan.measure], ranked[plan.measure:]
    skipped = [{"batch": batch, "candidate": c.label, "config": c.to_dict(), "kept": False,
                "reason": (f"not measured: ranked {i} of {len(ranked)} by the cost model ({p:.3f}x stock predicted)"
                           if p is not None else f"not measured: beyond the first {plan.measure}"),
                "predicted_vs_stock": p} for i, (c, p) in enumerate(rest, start=plan.measure + 1)]
    choice, verdicts = controller.search(batch, base, measured, tuning, held_out)
    return BatchResult(batch, choice, verdicts, skipped)


def report(results: Sequence[BatchResult]) -> Table:
    """What was tried, kept and rejected, and why."""
    t = Table(title="specpilot tune: every candidate, in the order judged")
    for col in ("batch", "candidate", "predicted", "tuning", "held-out (95% interval)", "forcing", "verdict"):
        t.add_column(col, justify="left" if col in ("candidate", "verdict") else "right")
    for r in results:
        for v in r.verdicts:
            held = f"{v.ratio:.3f}x ({v.interval[0]:.3f}-{v.interval[1]:.3f})" if v.interval else "-"
            forcing = "-" if v.forcing is None else ("pass" if v.forcing.get("passed") else "FAIL")
            t.add_row(str(r.batch), v.candidate.label, _x(v.predicted), _x(v.tuning_ratio), held, forcing,
                      f"{'KEPT' if v.kept else 'rejected'}: {v.reason}", style="bold green" if v.kept else None)
        for s in r.skipped:
            t.add_row(str(r.batch), s["candidate"], _x(s["predicted_vs_stock"]), "-", "-", "-", s["reason"],
                      style="dim")
        t.add_row(str(r.batch), f"=> {r.choice.label}", "", "", "", "", "the batch size's choice", style="bold")
    return t


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"
