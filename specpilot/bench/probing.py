"""ProbingEngine: the SpecEngine of a synthetic-acceptance run, which answers the oracle's probes (bench/synthetic.py)
with a verify pass over the step's trees that commits nothing: the target's token after every node, the argmax for a
greedy request and the raced token for a sampling one."""

from __future__ import annotations

import torch

from specpilot.bench.synthetic import SyntheticDrafter
from specpilot.engine.engine import SpecEngine
from specpilot.engine.request import Request
from specpilot.runtime.runner import inference
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.rejection import step_tokens
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
        """The target's token after every node of the proposing requests' trees (a greedy request's argmax, a
        sampling one's race with its own noise rows, as accept draws them), from the step's own verify (the verify
        the step then runs on these trees answers the same, bit for bit) that commits nothing: read back as accept
        reads a step's (a sync that frees the staged metadata buffer), the recurrent state a replayed chain
        advanced in place rewound."""
        by_slot = {r.slot: r for r in self._proposing}
        active = [by_slot[s] for s in slots]
        out = self.verify(active, trees)
        if out.is_floating_point():  # logits [rows, T, vocab]: a request of the step samples
            flat, answers = self.runner.staging.read_tokens(torch.cat(step_tokens(trees, list(out),
                                                                                  *_draws(active, trees, out)))), []
            for t in trees:
                answers.append(flat[:t.num_nodes])
                flat = flat[t.num_nodes:]
        else:
            answers = self.runner.staging.read_tokens(out)
        self.rewind()
        return [row[:t.num_nodes] for row, t in zip(answers, trees)]


def _draws(active: list[Request], trees: list[DraftTree], logits: torch.Tensor):
    """Per request, the sampling parameters and noise rows accept draws its nodes with (SpecEngine.accept):
    greedy parameters and no noise for a greedy request."""
    vocab = logits.shape[-1]
    params = [SamplingParams() if r.params.greedy else r.params for r in active]
    noise = [None if r.params.greedy else r.noise_rows(max(t.depths) + 1, vocab, logits.device)
             for r, t in zip(active, trees)]
    return params, noise
