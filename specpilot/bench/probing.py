"""ProbingEngine: the SpecEngine of a synthetic-acceptance run, which answers the oracle's probes (bench/synthetic.py)
with a verify pass over the step's trees that commits nothing."""

from __future__ import annotations

from specpilot.bench.synthetic import SyntheticDrafter
from specpilot.engine.engine import SpecEngine
from specpilot.runtime.runner import inference
from specpilot.spec_decode.tree import DraftTree


class ProbingEngine(SpecEngine):
    """A SpecEngine whose drafter is a SyntheticDrafter: built, it hands the drafter its probe (set_probe). The
    other arguments are SpecEngine's."""

    def __init__(self, runner, drafter: SyntheticDrafter, *args, **kwargs):
        super().__init__(runner, drafter, *args, **kwargs)
        self._proposing = []  # the requests whose trees the drafter is choosing (the probe verifies those)
        drafter.set_probe(self.probe)
        # the oracle's work is the benchmark's: the step's component times (and the budget's draft cost) leave it out
        untimed = drafter.untimed
        drafter.untimed = lambda fn, *args: self._timer.excluded(untimed, fn, *args)

    def propose(self, active, nodes) -> list[DraftTree]:
        self._proposing = active
        try:
            return super().propose(active, nodes)
        finally:
            self._proposing = []

    @inference
    def probe(self, slots: list[int], trees: list[DraftTree]) -> list[list[int]]:
        """The target's greedy token after every node of the proposing requests' trees, from the step's own verify
        (the verify the step then runs on these trees answers the same, bit for bit) that commits nothing: read
        back as accept reads a step's (a sync that frees the staged metadata buffer), the recurrent state a
        replayed chain advanced in place rewound."""
        by_slot = {r.slot: r for r in self._proposing}
        greedy = self.runner.staging.read_tokens(self.verify([by_slot[s] for s in slots], trees))
        self.rewind()
        return [row[:t.num_nodes] for row, t in zip(greedy, trees)]
