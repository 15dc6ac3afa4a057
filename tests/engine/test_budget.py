"""The node budget: AcceptanceTracker's per-depth estimate, node_gains for chains and trees, and split_budget's
properties on seeded random cases (bounds, monotone in acceptance, the flat and steep limits, the exact optimum
against brute force)."""

import itertools
import math
import random

import numpy as np
import pytest

from specpilot.engine.budget import AcceptanceTracker, BudgetPlan, node_gains, split_budget
from specpilot.engine.cost_curve import VerifyCostCurve
from specpilot.spec_decode.tree import DraftTree, tree_layout

# --- AcceptanceTracker ---


def test_a_fresh_tracker_reads_its_prior():
    assert AcceptanceTracker(3).conditional() == pytest.approx((0.6, 0.6, 0.6))
    t = AcceptanceTracker(4, prior=(0.9, 0.5))
    assert t.conditional() == pytest.approx((0.9, 0.5, 0.5, 0.5))  # a short prior repeats its last value
    assert t.reach() == pytest.approx((0.9, 0.45, 0.225, 0.1125))


def test_update_counts_reached_and_accepted_per_depth():
    t = AcceptanceTracker(5, halflife=8.0)
    t.update(drafted=4, accepted=2)
    w, p = 2.0, 0.6  # the prior's weight and value
    want = ((1 + w * p) / (1 + w), (1 + w * p) / (1 + w), (0 + w * p) / (1 + w), p, p)
    assert t.conditional() == pytest.approx(want)
    t2 = AcceptanceTracker(5)
    t2.update(drafted=2, accepted=2)  # depth 3 not drafted: not reached
    assert t2.conditional()[2:] == pytest.approx((p, p, p))


def test_recent_steps_weigh_more():
    fast, slow = AcceptanceTracker(2, halflife=2.0), AcceptanceTracker(2, halflife=32.0)
    for t in (fast, slow):
        for _ in range(100):
            t.update(2, 2)
        for _ in range(6):
            t.update(2, 0)
    assert fast.conditional()[0] < 0.35 < 0.7 < slow.conditional()[0]
    # one step `halflife` steps ago weighs half of this step's
    t = AcceptanceTracker(1, prior=(0.5,), halflife=1.0)
    t.update(1, 1)
    t.update(1, 0)
    assert t.conditional()[0] == pytest.approx((0.5 + 1.0) / (1.5 + 2.0))


def test_an_unreached_depth_drifts_back_to_the_prior():
    t = AcceptanceTracker(2, halflife=4.0)
    for _ in range(20):
        t.update(2, 2)
    high = t.conditional()[1]
    for _ in range(40):
        t.update(0, 0)  # plain decoding steps: nothing drafted
    assert high > 0.9 and t.conditional()[1] == pytest.approx(0.6, abs=0.01)


@pytest.mark.parametrize("args, match", [
    (dict(max_depth=0), "max_depth"), (dict(max_depth=2, halflife=0.0), "halflife"),
    (dict(max_depth=2, prior=(1.5,)), "prior"),
])
def test_bad_tracker_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        AcceptanceTracker(**args)


@pytest.mark.parametrize("drafted, accepted", [(2, 3), (2, -1)])
def test_bad_update(drafted, accepted):
    with pytest.raises(ValueError, match="0 <= accepted <= drafted"):
        AcceptanceTracker(4).update(drafted, accepted)


# --- node_gains ---


def test_chain_gains_are_reach():
    t = AcceptanceTracker(4, prior=(0.9, 0.8, 0.5, 0.4))
    assert node_gains(t, 4) == pytest.approx(list(t.reach()))
    assert node_gains(t, 2) == pytest.approx(list(t.reach()[:2]))
    assert node_gains((0.5,), 3) == pytest.approx([0.5, 0.25, 0.125])  # past the given depths: the last p
    assert node_gains(t, 0) == []


def test_a_chain_layout_gives_the_chain_gains():
    p = (0.9, 0.7, 0.6)
    parents = (-1, 0, 1, 2)
    want = node_gains(p, 3)
    assert node_gains(p, tree_layout(parents)) == pytest.approx(want)
    assert node_gains(p, parents) == pytest.approx(want)
    assert node_gains(p, DraftTree((5, 6, 7, 8), parents)) == pytest.approx(want)


def test_tree_gains_by_hand():
    # root: children 1, 2; node 1: children 3, 4; node 2: child 5
    parents = (-1, 0, 0, 1, 1, 2)
    p1, p2, s = 0.8, 0.5, 0.5
    raw = [p1, p1 * s, p1 * p2, p1 * p2 * s, p1 * s * p2]
    assert node_gains((p1, p2), parents, sibling_decay=s) == pytest.approx(np.minimum.accumulate(raw).tolist())


def test_tree_gains_are_non_increasing():
    rng = random.Random(3)
    for _ in range(200):
        parents = [-1] + [rng.randrange(i) for i in range(1, rng.randrange(2, 20))]
        p = [rng.random() for _ in range(rng.randrange(1, 6))]
        g = node_gains(p, tuple(parents), sibling_decay=rng.random())
        assert len(g) == len(parents) - 1
        assert all(a >= b for a, b in zip(g, g[1:])) and all(0 <= x <= 1 for x in g)


# --- split_budget ---


def _steppy_curve(rng: random.Random, step: float | None = None) -> VerifyCostCurve:
    """Batches 1..8, contexts 0 and 4096; time = floor + slope * tokens + a step every `size` tokens."""
    floor, slope = rng.uniform(2e-3, 5e-3), rng.uniform(1e-6, 2e-4)
    step = rng.uniform(0, 1e-3) if step is None else step
    size = rng.choice([4, 8, 16])
    batches, contexts = (1, 2, 4, 8), (0, 4096)
    tokens, grid = [], []
    for b in batches:
        toks = tuple(range(b, 24 * b + 1))
        tokens.append(toks)
        grid.append(tuple(tuple(floor + slope * t + step * (t // size) + c * b * 1e-8 for t in toks)
                          for c in contexts))
    return VerifyCostCurve(batches, contexts, tuple(tokens), tuple(grid))


def _flat_curve(seconds: float = 0.01) -> VerifyCostCurve:
    return VerifyCostCurve((1,), (0,), ((1, 2),), (((seconds, seconds),),))


def _steep_curve() -> VerifyCostCurve:
    """Every extra token costs as much as the whole forward of one."""
    return VerifyCostCurve((1,), (0,), ((1, 2),), (((0.01, 0.02),),))


def _random_gains(rng: random.Random, batch: int, depth: int) -> list[list[float]]:
    return [node_gains([rng.uniform(0.05, 1.0) for _ in range(depth)], rng.randrange(depth + 1)) for _ in range(batch)]


def _draft(rng: random.Random):
    a, b = rng.choice([0.0, rng.uniform(0, 2e-3)]), rng.uniform(0, 5e-4)
    return (lambda d: a + b * d) if rng.random() < 0.7 else None


def _rate(gains, nodes, cost, contexts, draft=None, extra=0) -> float:
    B = len(gains)
    expected = B + sum(sum(g[:n]) for g, n in zip(gains, nodes))
    seconds = cost.seconds(B + extra + sum(nodes), B, sum(contexts) / B)
    if draft is not None and max(nodes) > 0:
        seconds += draft(max(nodes))
    return expected / seconds


def _cases(seed: int, count: int, max_batch: int = 8, depth: int = 8):
    rng = random.Random(seed)
    for _ in range(count):
        B = rng.randrange(1, max_batch + 1)
        gains = _random_gains(rng, B, depth)
        yield rng, gains, _steppy_curve(rng), [rng.randrange(0, 4096) for _ in range(B)], _draft(rng)


def test_the_plan_is_within_bounds_and_says_what_it_predicts():
    for rng, gains, cost, ctx, draft in _cases(0, 150):
        max_total = rng.choice([None, 0, 1, rng.randrange(0, 40)])
        extra = rng.choice([0, 0, rng.randrange(1, 64)])
        plan = split_budget(gains, cost, ctx, draft, max_total, extra_tokens=extra)
        assert isinstance(plan, BudgetPlan) and len(plan.nodes) == len(gains)
        assert all(0 <= n <= len(g) for n, g in zip(plan.nodes, gains))
        assert max_total is None or sum(plan.nodes) <= max_total
        assert plan.rate == pytest.approx(_rate(gains, plan.nodes, cost, ctx, draft, extra))
        assert plan.tokens == len(gains) + extra + sum(plan.nodes)
        assert plan.rate >= len(gains) / plan.plain_seconds
        if max(plan.nodes) == 0:
            assert plan.predicted_seconds == plan.plain_seconds and plan.expected_tokens == len(gains)


def _dominates(hi: list[float], lo: list[float]) -> bool:
    return len(hi) >= len(lo) and all(a >= b for a, b in zip(hi, lo))


def test_higher_acceptance_never_gets_fewer_nodes():
    checked = 0
    for rng, gains, cost, ctx, draft in _cases(1, 150):
        # some requests dominated by another: its gains scaled down pointwise, perhaps shorter
        for _ in range(len(gains) // 2):
            src = gains[rng.randrange(len(gains))]
            cut = rng.randrange(len(src) + 1)
            if rng.random() < 0.5:  # the same gains, fewer of them: ties with the longer one at every depth
                lower = list(src[:cut])
            else:
                lower = [x * rng.uniform(0.5, 1.0) ** (k + 1) for k, x in enumerate(src[:cut])]
            at = rng.randrange(len(gains) + 1)  # before or after the request it copies
            gains.insert(at, lower)
            ctx.insert(at, rng.randrange(0, 4096))
        plan = split_budget(gains, cost, ctx, draft)
        for i, j in itertools.permutations(range(len(gains)), 2):
            if _dominates(gains[i], gains[j]):
                if gains[i] == gains[j]:
                    assert abs(plan.nodes[i] - plan.nodes[j]) <= 1
                else:
                    assert plan.nodes[i] >= plan.nodes[j], (gains[i], gains[j], plan.nodes)
                checked += 1
    assert checked > 100


def test_scaling_every_gain_up_never_lowers_the_total():
    for rng, gains, cost, ctx, draft in _cases(2, 150):
        s = rng.uniform(1.0, 3.0)
        before = split_budget(gains, cost, ctx)
        after = split_budget([[x * s for x in g] for g in gains], cost, ctx)
        assert sum(after.nodes) >= sum(before.nodes)
        if draft is not None:  # with drafting cost: the plan may trade nodes for depth, never for a cheaper step
            before = split_budget(gains, cost, ctx, draft)
            after = split_budget([[x * s for x in g] for g in gains], cost, ctx, draft)
            assert after.predicted_seconds >= before.predicted_seconds - 1e-15


def test_raising_a_chains_acceptance_never_shortens_it():
    rng = random.Random(4)
    for _ in range(300):
        depth = rng.randrange(1, 10)
        p = [rng.uniform(0.05, 1.0) for _ in range(depth)]
        q = [min(1.0, x * rng.uniform(1.0, 1.5)) if rng.random() < 0.5 else x for x in p]
        cost, draft = _steppy_curve(rng), _draft(rng)
        ctx = [rng.randrange(4096)]
        lo = split_budget([node_gains(p, depth)], cost, ctx, draft)
        hi = split_budget([node_gains(q, depth)], cost, ctx, draft)
        assert hi.nodes[0] >= lo.nodes[0]


def test_raising_one_early_gain_can_lower_the_total():
    """Not a guarantee: a higher rate raises the bar for every further node (see docs/budget.md)."""
    cost = VerifyCostCurve((1,), (0,), ((1, 2, 3),), (((1.0, 1.5, 2.0),),))
    assert split_budget([[0.55, 0.55]], cost, [0]).nodes == (2,)
    assert split_budget([[1.0, 0.55]], cost, [0]).nodes == (1,)


def test_a_flat_curve_gives_every_node():
    for rng, gains, _, ctx, _ in _cases(5, 50):
        plan = split_budget(gains, _flat_curve(), ctx)
        assert plan.nodes == tuple(len(g) for g in gains)
        cap = rng.randrange(sum(map(len, gains)) + 1)
        assert sum(split_budget(gains, _flat_curve(), ctx, max_total=cap).nodes) == cap


def test_a_steep_curve_or_zero_gains_give_plain_decoding():
    for rng, gains, cost, ctx, draft in _cases(6, 50):
        plan = split_budget(gains, _steep_curve(), ctx, draft)
        assert plan.nodes == (0,) * len(gains) and plan.predicted_seconds == plan.plain_seconds
        zero = split_budget([[0.0] * len(g) for g in gains], cost, ctx, draft)
        assert zero.nodes == (0,) * len(gains)
        assert zero.expected_tokens == len(gains) and zero.draft_seconds == 0.0


def test_costly_drafting_gives_plain_decoding():
    gains = [[0.9, 0.8, 0.7]] * 4
    assert max(split_budget(gains, _flat_curve(0.01), [0] * 4).nodes) == 3
    assert split_budget(gains, _flat_curve(0.01), [0] * 4, draft_seconds=lambda d: 1.0).nodes == (0,) * 4


def _all_plans(gains, max_total):
    for nodes in itertools.product(*[range(len(g) + 1) for g in gains]):
        if max_total is None or sum(nodes) <= max_total:
            yield nodes


def test_the_plan_is_the_brute_force_optimum():
    """Non-increasing gains, non-decreasing drafting cost: the exact optimum, so no single request's other choice
    does better either."""
    for rng, gains, cost, ctx, draft in _cases(7, 200, max_batch=3, depth=4):
        max_total = rng.choice([None, rng.randrange(0, 8)])
        plan = split_budget(gains, cost, ctx, draft, max_total)
        best = max(_rate(gains, n, cost, ctx, draft) for n in _all_plans(gains, max_total))
        assert plan.rate == pytest.approx(best, rel=1e-12)
        for i, g in enumerate(gains):  # local optimality, spelled out
            for n in range(len(g) + 1):
                other = plan.nodes[:i] + (n,) + plan.nodes[i + 1:]
                if max_total is None or sum(other) <= max_total:
                    assert _rate(gains, other, cost, ctx, draft) <= plan.rate * (1 + 1e-12)


def test_the_first_local_maximum_is_not_taken():
    """A step in the curve: one node does not pay, four do."""
    cost = VerifyCostCurve((1,), (0,), ((1, 2, 5, 6),), (((1.0, 1.6, 1.6, 2.0),),))
    plan = split_budget([[0.5, 0.5, 0.5, 0.5, 0.5]], cost, [0])
    assert plan.nodes == (4,)
    assert plan.rate == pytest.approx(3.0 / 1.6)


def test_gains_that_rise_are_clipped_and_a_zero_ends_them():
    flat = _flat_curve()
    plan = split_budget([[0.2, 0.9, 0.9], [0.5, 0.0, 0.4]], flat, [0, 0])
    assert plan.nodes == (3, 1)
    assert plan.expected_tokens == pytest.approx(2 + 0.6 + 0.5)
    assert split_budget([[math.nan, 0.9]], flat, [0]).nodes == (0,)


def test_extra_tokens_cost_time_and_emit_nothing():
    cost = VerifyCostCurve((1,), (0,), ((1, 101),), (((1.0, 2.0),),))
    plain = split_budget([[]], cost, [0], extra_tokens=50)
    assert plain.nodes == (0,) and plain.verify_seconds == pytest.approx(1.5) and plain.expected_tokens == 1


def test_an_empty_batch_and_bad_arguments():
    plan = split_budget([], _flat_curve(), [])
    assert plan.nodes == () and plan.expected_tokens == 0
    with pytest.raises(ValueError, match="one per request"):
        split_budget([[0.5]], _flat_curve(), [0, 0])
    with pytest.raises(ValueError, match="max_total"):
        split_budget([[0.5]], _flat_curve(), [0], max_total=-1)
    with pytest.raises(ValueError, match="extra_tokens"):
        split_budget([[0.5]], _flat_curve(), [0], extra_tokens=-1)


def test_the_log_record():
    plan = split_budget([[0.9, 0.8], [0.1]], _flat_curve(), [0, 0])
    rec = plan.to_dict()
    assert rec["nodes"] == (2, 1) and rec["depth"] == 2 and rec["rate"] == pytest.approx(plan.rate)


def test_equal_requests_share_the_nodes():
    plan = split_budget([[0.5] * 4, [0.5] * 4], _flat_curve(), [0, 0], max_total=3)
    assert plan.nodes == (2, 1)
