"""SpecStats: what one request's speculation did (steps, tokens per step, per-depth acceptance, the budget's
draft nodes per step, time per step component)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specpilot.spec_decode.tree import DraftTree
from specpilot.spec_decode.verify import Acceptance

# "start": the request's prefill and drafter start (wall time from arrival to its first token)
COMPONENTS = ("start", "draft", "verify", "accept", "commit", "other")


@dataclass(slots=True)
class SpecStats:
    steps: int = 0
    emitted: int = 0
    drafted_per_depth: list[int] = field(default_factory=list)
    accepted_per_depth: list[int] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)  # per step: draft nodes verified (the budget's choice)
    accepted: list[int] = field(default_factory=list)  # per step: draft tokens accepted
    preempted: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 0.0))

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target step, bonus included."""
        return self.emitted / self.steps if self.steps else 0.0

    def add(self, tree: DraftTree, acc: Acceptance, emitted: int) -> None:
        self.steps += 1
        self.emitted += emitted
        self.nodes.append(tree.num_nodes - 1)
        self.accepted.append(acc.num_accepted)
        for d, n in enumerate(tree.draft_count_per_depth()):
            _bump(self.drafted_per_depth, d, n)
        for d in range(acc.num_accepted):
            _bump(self.accepted_per_depth, d, 1)

    def to_dict(self) -> dict:
        return {"steps": self.steps, "emitted": self.emitted, "tau": round(self.tau, 4),
                "drafted_per_depth": self.drafted_per_depth,
                "accepted_per_depth": self.accepted_per_depth, "preempted": self.preempted,
                "mean_nodes": round(sum(self.nodes) / len(self.nodes), 3) if self.nodes else 0.0,
                "seconds": {k: round(v, 6) for k, v in self.seconds.items()}}


def _bump(counts: list[int], index: int, n: int) -> None:
    counts.extend([0] * (index + 1 - len(counts)))
    counts[index] += n
