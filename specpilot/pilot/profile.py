"""`specpilot profile`: a short workload on the engine, its step's components ranked by their distance from their
ceilings (the cost model, cost_model.py, on the calibration of this GPU and model, calibration.py), and what the
model predicts each known change would give.

Distance is measured - ceiling in ms (the time the component could still win) and measured / ceiling. The verify
forward is measured as one component; its parts (weights, LM head, attention, recurrent state, launches) are listed
under it with their ceilings and the measured time shared in proportion to them ("attributed", not measured).
Known changes: another tree spec (every request its full tree, the run's per-depth acceptance), the W12N weight
format, and each component brought to its ceiling (the most it could give).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from specpilot.pilot.cost_model import (COMPONENTS, VERIFY_PARTS, AcceptanceStats, Configuration, CostModel, Step,
                                        verify_width)
from specpilot.pilot.workload import StepRun
from specpilot.spec_decode.tree import TreeSpec

TREE_CHANGES = ("chain:3", "chain:5", "chain:7", "static:2,2,2", "static:3,2,1,1", "dynamic:4,7,15")


@dataclass(frozen=True)
class ProfileResult:
    run: StepRun
    step: Step
    model: CostModel
    acceptance: AcceptanceStats
    tree: str
    weight_format: str
    max_depth: int | None = None  # the drafter's: deeper tree changes are not offered

    def components(self) -> list[dict]:
        """One row per component (measured, ceiling, gap, ratio), ranked by gap, largest first."""
        measured = self.run.medians()
        parts = self.model.parts(self.step)
        rows = []
        for name in COMPONENTS:
            m, c = measured.get(name, 0.0), parts[name].seconds
            rows.append({"component": name, "measured_ms": m * 1e3, "ceiling_ms": c * 1e3, "gap_ms": (m - c) * 1e3,
                         "over_ceiling": m / c if c > 0 else None, "bytes": parts[name].bytes,
                         "flops": parts[name].flops})
        rows.sort(key=lambda r: r["gap_ms"], reverse=True)
        return rows

    def verify_parts(self) -> list[dict]:
        measured = self.run.medians().get("verify", 0.0)
        parts = self.model.verify_parts(self.step)
        total = sum(p.seconds for p in parts.values())
        return [{"part": f"verify.{k}", "ceiling_ms": parts[k].seconds * 1e3,
                 "attributed_ms": measured * parts[k].seconds / total * 1e3 if total > 0 else 0.0,
                 "bytes": parts[k].bytes, "flops": parts[k].flops} for k in VERIFY_PARTS]

    def prefill(self) -> dict | None:
        """The start's mixed steps (prefill chunks, with any decoding rows riding along): median chunk tokens and
        forward ms against the ceiling of a chunk that size."""
        recs = self.run.prefill
        if not recs:
            return None
        tokens = statistics.median(r["prefill"] for r in recs)
        measured = statistics.median(r["seconds"].get("verify", 0.0) for r in recs)
        ceiling = self.model.prefill_part(int(tokens), tokens / 2).seconds
        return {"steps": len(recs), "tokens_p50": tokens, "measured_ms": measured * 1e3, "ceiling_ms": ceiling * 1e3,
                "over_ceiling": measured / ceiling if ceiling > 0 else None}

    def configuration(self, tree: str | None = None, weight_format: str | None = None) -> Configuration:
        return Configuration(self.run.batch, tree or self.tree, self.run.context, self.acceptance,
                             weight_format or self.weight_format)

    def changes(self) -> list[dict]:
        """The model's tok/s now and after each known change, and the ratio of the two."""
        now = self.model.predict(self.configuration())
        out = [{"change": "none (this run)", "tok_s": now.tok_s, "vs_now": 1.0, "tau": now.tau}]
        for tree in TREE_CHANGES:
            if tree != self.tree and (self.max_depth is None or TreeSpec.parse(tree).depth <= self.max_depth):
                p = self.model.predict(self.configuration(tree=tree))
                out.append({"change": f"tree {tree}", "tok_s": p.tok_s, "vs_now": p.tok_s / now.tok_s, "tau": p.tau})
        if self.weight_format == "bf16":
            p = self.model.predict(self.configuration(weight_format="w12n"))
            out.append({"change": "weight format w12n", "tok_s": p.tok_s, "vs_now": p.tok_s / now.tok_s,
                        "tau": p.tau})
        parts = self.model.parts(now.step)
        for name in COMPONENTS:
            seconds = now.step_seconds - now.components[name] + parts[name].seconds
            tok_s = now.config.batch * now.tau / seconds
            out.append({"change": f"{name} at its ceiling", "tok_s": tok_s, "vs_now": tok_s / now.tok_s,
                        "tau": now.tau})
        return out

    def to_dict(self) -> dict:
        now = self.model.predict(self.configuration())
        return {"measured": self.run.to_dict(), "step": self.step.to_dict(), "tree": self.tree,
                "weight_format": self.weight_format,
                "acceptance": {"per_depth": list(self.acceptance.per_depth),
                               "sibling_decay": self.acceptance.sibling_decay,
                               "variation": self.acceptance.variation.to_dict() if self.acceptance.variation else None},
                "ceilings": self.model.ceilings.to_dict(), "components": self.components(),
                "verify_parts": self.verify_parts(), "prefill": self.prefill(), "predicted": now.to_dict(),
                "predicted_over_measured": now.tok_s / self.run.tok_s if self.run.tok_s else None,
                "changes": self.changes()}


def analyse(run: StepRun, model: CostModel, tree: str, full_nodes: int, weight_format: str, graphs: bool,
            acceptance: AcceptanceStats, max_depth: int | None = None) -> ProfileResult:
    """The run's step shape (median verify width of its steps, its mean context and accepted drafts) against the
    model."""
    widths = [verify_width(max(r["nodes"], default=0) + 1, full_nodes, graphs) for r in run.records] or [1]
    accepted = sum(run.accepted) / max(run.steps * run.batch, 1)
    step = Step(run.batch, int(statistics.median(widths)), run.context, accepted, weight_format)
    return ProfileResult(run, step, model, acceptance, tree, weight_format, max_depth)


def tables(result: ProfileResult, synthetic: str | None) -> list[Table]:
    label = f" (SYNTHETIC acceptance: {synthetic})" if synthetic else ""
    run = result.run
    t = Table(title=f"step components by distance from their ceilings, batch {run.batch}, {result.tree}{label}")
    for col in ("component", "measured ms", "ceiling ms", "gap ms", "x ceiling"):
        t.add_column(col, justify="left" if col == "component" else "right")
    for r in result.components():
        ratio = f"{r['over_ceiling']:.2f}" if r["over_ceiling"] else "-"
        t.add_row(r["component"], f"{r['measured_ms']:.3f}", f"{r['ceiling_ms']:.3f}", f"{r['gap_ms']:.3f}", ratio)
        if r["component"] == "verify":
            for p in result.verify_parts():
                t.add_row(f"  {p['part']}", f"({p['attributed_ms']:.3f})", f"{p['ceiling_ms']:.3f}", "", "",
                          style="dim")
    pre = result.prefill()
    if pre is not None:
        ratio = f"{pre['over_ceiling']:.2f}" if pre["over_ceiling"] else "-"
        t.add_row(f"prefill ({pre['tokens_p50']:.0f}-token chunk)", f"{pre['measured_ms']:.3f}",
                  f"{pre['ceiling_ms']:.3f}", f"{pre['measured_ms'] - pre['ceiling_ms']:.3f}", ratio, style="italic")
    now = result.model.predict(result.configuration())
    t.caption = (f"measured {run.tok_s:.1f} tok/s, {run.step_s * 1e3:.2f} ms/step, {run.tau:.2f} tokens/request/step;"
                 f" model {now.tok_s:.1f} tok/s, {now.step_seconds * 1e3:.2f} ms/step. (x): verify attributed by "
                 f"ceiling, not measured; prefill: per chunk, not per step")
    c = Table(title="what the cost model predicts for each known change")
    for col in ("change", "tok/s", "vs now", "tokens/step"):
        c.add_column(col, justify="left" if col == "change" else "right")
    for r in result.changes():
        c.add_row(r["change"], f"{r['tok_s']:.1f}", f"{r['vs_now']:.3f}x", f"{r['tau']:.2f}")
    return [t, c]


def plot(result: ProfileResult, path: str | Path, synthetic: str | None) -> None:
    """Two panels: each component's measured ms beside its ceiling (ranked), and the predicted tok/s of each
    change."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.components()
    changes = result.changes()
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    ys = range(len(rows))
    a.barh([y + 0.2 for y in ys], [r["measured_ms"] for r in rows], 0.4, label="measured")
    a.barh([y - 0.2 for y in ys], [r["ceiling_ms"] for r in rows], 0.4, label="ceiling")
    a.set_yticks(list(ys))
    a.set_yticklabels([r["component"] for r in rows])
    a.invert_yaxis()
    a.set_xlabel("ms per step (median)")
    a.legend(loc="lower right")
    a.set_title(f"batch {result.run.batch}, {result.tree}" + (f"\nSYNTHETIC acceptance ({synthetic})"
                                                               if synthetic else ""))
    ys = range(len(changes))
    bars = b.barh(list(ys), [c["tok_s"] for c in changes], 0.6)
    b.bar_label(bars, labels=[f"{c['vs_now']:.2f}x" for c in changes], fontsize=8, padding=2)
    b.set_yticks(list(ys))
    b.set_yticklabels([c["change"] for c in changes], fontsize=8)
    b.invert_yaxis()
    b.set_xlabel("predicted tok/s")
    b.set_title("the cost model's prediction per change")
    b.margins(x=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
