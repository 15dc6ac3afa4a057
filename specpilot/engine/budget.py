"""The batch-aware node budget: how many draft nodes each request of a step verifies.

Three parts (node_gains and split_budget are pure functions of their inputs):
- AcceptanceTracker: one request's recent acceptance per draft depth, p_d = P(the draft at depth d is accepted |
  the one at depth d-1 was), as exponentially decayed counts over its steps plus a prior worth a few steps.
- node_gains: the expected accepted tokens that each extra draft node of a request adds, in the order the engine
  adds nodes (a chain's next depth; a tree's next node in topological order), non-increasing.
- split_budget: the draft nodes n_i of every request in one verify forward that maximise the expected emitted tokens
  per second, sum_i (1 + sum(gains_i[:n_i])) / (verify seconds of all the step's tokens + drafting seconds), read
  from the verify cost curve (engine/cost_curve.py). Where no node pays for its time every n_i is 0: plain decoding.
What split_budget guarantees and why: docs/budget.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from specpilot.engine.cost_curve import VerifyCostCurve
from specpilot.spec_decode.tree import TreeLayout, tree_layout

DEFAULT_PRIOR = 0.6  # p_d of a request with no history yet
PRIOR_WEIGHT = 2.0  # the prior counts as this many steps that reached each depth
SIBLING_DECAY = 0.5  # a tree node's acceptance against its elder sibling's


class AcceptanceTracker:
    """One request's per-depth acceptance. Each update first decays every count by 0.5 ** (1 / halflife) (a step
    `halflife` steps ago weighs half as much as this one), then counts depth d as reached when the step drafted at
    least d levels and accepted at least d - 1 drafts, and as accepted when it accepted at least d. The estimate is
    (accepted_d + w * prior_d) / (reached_d + w) with w = PRIOR_WEIGHT: a fresh request reads its prior, a depth
    not reached for a while drifts back to it (so a request that fell to plain decoding is tried again)."""

    def __init__(self, max_depth: int, prior: tuple[float, ...] = (), halflife: float = 8.0):
        if max_depth < 1:
            raise ValueError(f"AcceptanceTracker max_depth={max_depth}: must be >= 1")
        if not halflife > 0:
            raise ValueError(f"AcceptanceTracker halflife={halflife}: must be > 0 steps")
        prior = tuple(float(p) for p in prior) or (DEFAULT_PRIOR,)
        if not all(0.0 <= p <= 1.0 for p in prior):
            raise ValueError(f"AcceptanceTracker prior={prior}: every p_d must be in [0, 1]")
        # a prior shorter than max_depth repeats its last value
        self.prior = (prior + prior[-1:] * max_depth)[:max_depth]
        self.max_depth, self.halflife = max_depth, halflife
        self._decay = 0.5 ** (1.0 / halflife)
        self._reached = [0.0] * max_depth
        self._accepted = [0.0] * max_depth

    def update(self, drafted: int, accepted: int) -> None:
        """One step: the request drafted `drafted` levels (a chain's length, a tree's depth) and the target accepted
        `accepted` of its drafts. Depths past max_depth are not tracked."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"AcceptanceTracker.update(drafted={drafted}, accepted={accepted}): needs "
                             f"0 <= accepted <= drafted")
        k = self._decay
        reached, acc = self._reached, self._accepted
        for d in range(self.max_depth):
            reached[d] *= k
            acc[d] *= k
        for d in range(min(drafted, accepted + 1, self.max_depth)):
            reached[d] += 1.0
        for d in range(min(accepted, self.max_depth)):
            acc[d] += 1.0

    def conditional(self) -> tuple[float, ...]:
        """p_d for d = 1 .. max_depth."""
        w = PRIOR_WEIGHT
        return tuple((a + w * p) / (n + w) for a, n, p in zip(self._accepted, self._reached, self.prior))

    def reach(self) -> tuple[float, ...]:
        """The chance that the d-th draft is accepted (with all before it), d = 1 .. max_depth."""
        out, r = [], 1.0
        for p in self.conditional():
            r *= p
            out.append(r)
        return tuple(out)


def node_gains(tracker_or_conditional: AcceptanceTracker | Sequence[float], layout_or_depth,
               sibling_decay: float = SIBLING_DECAY) -> list[float]:
    """Expected accepted tokens added by each draft node, in the order the engine adds nodes, non-increasing.

    layout_or_depth: an int D (a chain of D drafts: the gains are reach[0 .. D-1]) or a tree shape (a TreeLayout,
    a DraftTree, or its parents tuple), whose draft nodes are added in topological order (the engine keeps a
    proposed tree's first n nodes). A tree node's gain is its parent's times p at its depth times
    sibling_decay ** (its rank among its parent's children): along the first children it is reach at its
    depth. The sequence is then clipped to its running minimum. Depths past the conditionals' length take
    the last p_d."""
    if isinstance(tracker_or_conditional, AcceptanceTracker):
        p = tracker_or_conditional.conditional()
    else:
        p = tuple(float(x) for x in tracker_or_conditional)
    if not p:
        raise ValueError("node_gains needs at least one conditional acceptance p_d")
    if isinstance(layout_or_depth, int):
        out, r = [], 1.0
        for d in range(layout_or_depth):
            r *= p[min(d, len(p) - 1)]
            out.append(r)
        return out
    layout = _layout(layout_or_depth)
    prob = [1.0] * len(layout.parents)
    children_seen = [0] * len(layout.parents)
    out, run = [], math.inf
    for i in range(1, len(layout.parents)):
        parent = layout.parents[i]
        rank = children_seen[parent]
        children_seen[parent] += 1
        prob[i] = prob[parent] * p[min(layout.depths[i], len(p)) - 1] * sibling_decay ** rank
        run = min(run, prob[i])
        out.append(run)
    return out


def _layout(shape) -> TreeLayout:
    if isinstance(shape, TreeLayout):
        return shape
    if hasattr(shape, "layout"):  # a DraftTree
        return shape.layout
    return tree_layout(tuple(int(x) for x in shape))


@dataclass(frozen=True)
class BudgetPlan:
    nodes: tuple[int, ...]  # draft nodes per request (0: plain decoding)
    expected_tokens: float  # expected emitted tokens of the step: one per request plus the chosen nodes' gains
    predicted_seconds: float  # verify_seconds + draft_seconds
    verify_seconds: float  # the cost curve at the forward's tokens
    draft_seconds: float  # draft_seconds(max nodes), 0 without drafting
    tokens: int  # tokens of the verify forward: one per request, the draft nodes, the extra tokens
    plain_seconds: float  # the forward with every n_i = 0 (plain decoding), for comparison in the log

    @property
    def rate(self) -> float:
        """Expected emitted tokens per second."""
        return self.expected_tokens / self.predicted_seconds if self.predicted_seconds > 0 else 0.0

    @property
    def depth(self) -> int:
        return max(self.nodes, default=0)

    def to_dict(self) -> dict:
        """The step's log record."""
        return {**asdict(self), "rate": self.rate, "depth": self.depth}


def split_budget(gains: list[list[float]], cost: VerifyCostCurve, contexts: list[int],
                 draft_seconds: Callable[[int], float] | None = None, max_total: int | None = None,
                 extra_tokens: int = 0) -> BudgetPlan:
    """Draft nodes per request, 0 <= n_i <= len(gains[i]) and sum n_i <= max_total, maximising

        sum_i (1 + sum(gains[i][:n_i])) / (cost.seconds(B + extra_tokens + sum n_i, B, mean context)
                                           + draft_seconds(max n_i))

    with draft_seconds(0) = 0 (no drafting) and B = len(gains). extra_tokens: tokens the same forward carries that
    emit nothing counted here (piggybacked prefill chunks). Each request's gains are taken as non-increasing (a
    running minimum is applied) and stop at its first gain <= 0.

    For each cap m on the nodes of any one request, nodes are added greedily by marginal gain across requests
    (ties: the shallower node, then the request whose gains are larger) and the rate is evaluated after each
    addition; the plan is the best prefix over every cap (steps in the cost curve make the first local maximum
    the wrong one). Every plan with total N and largest n_i <= m gains at most that prefix's and costs at least as
    much when draft_seconds is non-decreasing, so the result is the exact optimum then. Ties keep fewer nodes."""
    B = len(gains)
    if len(contexts) != B:
        raise ValueError(f"split_budget: {B} gain lists but {len(contexts)} contexts (one per request)")
    if max_total is not None and max_total < 0:
        raise ValueError(f"split_budget max_total={max_total}: must be >= 0")
    if extra_tokens < 0:
        raise ValueError(f"split_budget extra_tokens={extra_tokens}: must be >= 0")
    context = sum(contexts) / B if B else 0.0
    base = B + extra_tokens
    G = _clipped(gains)  # [B, width]: gains > 0 where a node may be added, 0 past each request's last
    g, req, j = _greedy_order(G)
    total = len(g) if max_total is None else min(max_total, len(g))
    verify = np.asarray(cost.seconds(np.arange(base, base + total + 1), max(B, 1), context), dtype=np.float64)
    plain = float(verify[0])
    chosen, chosen_gains = req[:0], g[:0]
    if total:
        depth = int(j.max()) + 1
        drafting = np.array([0.0] + [float(draft_seconds(d)) if draft_seconds else 0.0 for d in range(1, depth + 1)])
        # row m - 1: the greedy order with at most m nodes per request; entry e: the plan after its e-th node
        keep = j[None, :] < np.arange(1, depth + 1)[:, None]
        count = np.cumsum(keep, axis=1)
        expected = B + np.cumsum(np.where(keep, g, 0.0), axis=1)
        deepest = np.maximum.accumulate(np.where(keep, j + 1, 0), axis=1)
        seconds = verify[np.minimum(count, total)] + drafting[deepest]
        rates = np.where(keep & (count <= total), expected / seconds, -np.inf)
        cap, e = np.unravel_index(int(np.argmax(rates)), rates.shape)
        if rates[cap, e] > B / plain:  # a tie keeps plain decoding
            picked = keep[cap, :e + 1]
            chosen, chosen_gains = req[:e + 1][picked], g[:e + 1][picked]
    nodes = tuple(int(n) for n in np.bincount(chosen, minlength=B))
    n_total = len(chosen)
    expected = B + float(chosen_gains.sum())
    verify_s = float(verify[n_total])
    draft_s = float(draft_seconds(max(nodes))) if draft_seconds and n_total else 0.0
    return BudgetPlan(nodes, expected, verify_s + draft_s, verify_s, draft_s, base + n_total, plain)


def _clipped(gains: list[Sequence[float]]) -> np.ndarray:
    """[B, width] gains, each row its running minimum up to its first value <= 0 (or NaN), zeros after."""
    G = np.zeros((len(gains), max(map(len, gains), default=0)), dtype=np.float64)
    for i, row in enumerate(gains):
        G[i, :len(row)] = row
    G = np.minimum.accumulate(np.nan_to_num(G, nan=0.0), axis=1) if G.size else G
    return np.where(G > 0, G, 0.0)


def _greedy_order(G: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every node with a gain > 0 as (gain, request, index in its request), sorted by gain, descending; ties go to
    the lower index, then to the request whose gains are larger in lexicographic order, then to the lower request
    number. A request whose gains are pointwise >= another's is then never behind it."""
    B, W = G.shape
    rank = np.empty(B, dtype=np.int64)
    rank[np.lexsort((np.arange(B), *(-G[:, k] for k in reversed(range(W)))))] = np.arange(B)
    req, j = np.nonzero(G > 0)
    g = G[req, j]
    perm = np.lexsort((req, rank[req], j, -g))
    return g[perm], req[perm], j[perm]
