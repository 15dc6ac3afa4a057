"""Speculative sampling is exact in distribution: the acceptance rules of spec_decode/rejection.py, checked
against plain sampling from the same filtered target distribution.

A "world" gives a target distribution p(. | context) and a draft distribution q(. | context) over a 5-token
vocabulary (random logits keyed by the context, filtered by the shared filtered_probs, so temperature, top-k
and top-p apply as in plain sampling). Two checks per case:
- exact: the joint probability of the first L emitted tokens (L = tree depth + 1; tokens after a step's output
  continue by plain sampling) summed over every draft outcome and every branch of the rule, equal to plain
  sampling's product of p to 1e-6;
- empirical: the implementation's own draws (several thousand, fixed seeds) against plain sampling's
  probabilities by a chi-square test.
Both checkers reject deliberately biased rules (a residual left unnormalised, a bonus drawn from p instead of the
residual, siblings drawn without replacement but their q recorded unconditional).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from functools import lru_cache

import pytest
import torch

from specpilot.runtime.sampling import SamplingParams, filtered_probs, race, race_scores
from specpilot.spec_decode.coupling import coupled_row_scores
from specpilot.spec_decode.rejection import (acceptance_probability, accept_raced, accept_recursive, point_mass,
                                             race_tokens, residual)
from specpilot.spec_decode.tree import DraftTree, TreeSpec, grow

V = 5
CTX = (1, 3)
SHAPES = {"chain:2": (-1, 0, 1), "static:3": (-1, 0, 0, 0), "static:2,1": (-1, 0, 0, 1, 2)}


class World:
    """p and q as functions of the token context; q differs from p (a drafter of a smaller model)."""

    def __init__(self, params: SamplingParams, spread: float = 1.0):
        self.params, self.spread = params, spread
        self.p = lru_cache(maxsize=None)(lambda ctx: self._probs(ctx, 0.0))
        self.q = lru_cache(maxsize=None)(lambda ctx: self._probs(ctx, self.spread))

    def _probs(self, ctx: tuple[int, ...], noise: float) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash(ctx) % (1 << 31))
        logits = 1.5 * torch.randn(V, generator=g, dtype=torch.float64)
        logits = logits + noise * torch.randn(V, generator=torch.Generator().manual_seed(7 + hash(ctx) % 1000),
                                              dtype=torch.float64)
        return filtered_probs(logits[None], self.params)[0].double()


# ---- drafting: how the children's tokens are drawn, and the q each one records ------------------------------

def draft_outcomes(world: World, parents: tuple[int, ...], mode: str):
    """Every draft tree the drafter can produce, with its probability: (prob, tokens, q per node)."""
    children = [[] for _ in parents]
    for i, p in enumerate(parents[1:], 1):
        children[p].append(i)

    def fill(i, tokens, qs, prob):
        if i == len(parents):
            yield prob, tuple(tokens), list(qs)
            return
        ctx = CTX + path_tokens(parents, tokens, parents[i])
        for x, px, qx in child_choices(world.q(ctx), tokens, children[parents[i]], i, mode):
            yield from fill(i + 1, tokens + [x], qs + [qx], prob * px)

    yield from fill(1, [CTX[-1]], [None], 1.0)


def child_choices(q: torch.Tensor, tokens: list[int], siblings: list[int], i: int, mode: str):
    """(token, probability it is drawn, q recorded) for node i, given its earlier siblings' tokens."""
    earlier = [tokens[s] for s in siblings if s < i]
    if mode == "top":  # deterministic: the drafter's i-th most likely token, no q
        x = int(q.argsort(descending=True, stable=True)[len(earlier)])
        return [(x, 1.0, None)]
    if mode == "iid":
        return [(x, float(q[x]), q) for x in range(V) if q[x] > 0]
    cond = q.clone()
    cond[earlier] = 0
    if cond.sum() == 0:
        return []
    cond = cond / cond.sum()
    record = cond if mode == "distinct" else q  # "distinct_unconditional": the bias the rule must not get
    return [(x, float(cond[x]), record) for x in range(V) if cond[x] > 0]


def draw_draft(world: World, parents: tuple[int, ...], mode: str, gen: torch.Generator):
    """One random draft tree drawn as draft_outcomes enumerates them."""
    children = [[] for _ in parents]
    for i, p in enumerate(parents[1:], 1):
        children[p].append(i)
    tokens, qs = [CTX[-1]], [None]
    for i in range(1, len(parents)):
        ctx = CTX + path_tokens(parents, tokens, parents[i])
        choices = child_choices(world.q(ctx), tokens, children[parents[i]], i, mode)
        weights = torch.tensor([c[1] for c in choices])
        x, _, qx = choices[int(race(weights, gen))]
        tokens.append(x)
        qs.append(qx)
    return tuple(tokens), qs


def path_tokens(parents, tokens, node: int) -> tuple[int, ...]:
    """Draft tokens from the root (excluded) down to `node`."""
    out = []
    while node > 0:
        out.append(tokens[node])
        node = parents[node]
    return tuple(out[::-1])


def node_probs(world: World, tree: DraftTree) -> torch.Tensor:
    return torch.stack([world.p(CTX + path_tokens(tree.parents, tree.tokens, i)) for i in range(tree.num_nodes)])


# ---- the exact check -------------------------------------------------------------------------------------------

def step_distribution(tree: DraftTree, probs: torch.Tensor, q, rule=residual) -> dict[tuple, float]:
    """The rule's output distribution for one draft tree, by summing over its branches (accept_recursive's
    probabilities, not its draws)."""
    children, tokens = tree.layout.children, tree.tokens

    def from_node(node, p):
        out, reach = defaultdict(float), 1.0
        for child in children[node]:
            x, qc = tokens[child], q[child]
            a = acceptance_probability(p, x, qc)
            if reach * a > 0:
                for seq, pr in from_node(child, probs[child]).items():
                    out[(x,) + seq] += reach * a * pr
            reach *= 1 - a
            p = rule(p, qc if qc is not None else point_mass(x, p))
        bonus = p / p.sum()  # the race normalises whatever it is handed
        for y in range(V):
            out[(y,)] += reach * float(bonus[y])
        return out

    return from_node(0, probs[0])


def plain_joint(world: World, seq: tuple[int, ...], start: int = 0) -> float:
    """Plain sampling's probability of emitting seq[start:] after CTX + seq[:start]."""
    prob = 1.0
    for j in range(start, len(seq)):
        prob *= float(world.p(CTX + seq[:j])[seq[j]])
    return prob


def exact_error(world: World, parents: tuple[int, ...], mode: str, rule=residual) -> float:
    """max over L-token sequences of |speculative probability - plain probability|, L = depth + 1."""
    L = max(DraftTree(tuple(range(len(parents))), parents).depths) + 1
    spec = defaultdict(float)
    for prob, tokens, q in draft_outcomes(world, parents, mode):
        tree = DraftTree(tokens, parents)
        for seq, pr in step_distribution(tree, node_probs(world, tree), q, rule).items():
            spec[seq] += prob * pr
    full = defaultdict(float)  # extended to L tokens by plain sampling
    for seq, pr in spec.items():
        for tail in itertools.product(range(V), repeat=L - len(seq)):
            full[seq + tail] += pr * plain_joint(world, seq + tail, len(seq))
    return max(abs(full[s] - plain_joint(world, s)) for s in itertools.product(range(V), repeat=L))


PARAMS = {"T1": SamplingParams(temperature=1.0), "T0.7": SamplingParams(temperature=0.7),
          "top_k3": SamplingParams(temperature=1.0, top_k=3), "top_p0.8": SamplingParams(temperature=0.9, top_p=0.8)}
MODES = ["iid", "distinct", "top"]  # with replacement, without replacement (conditional q), deterministic


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("params", list(PARAMS))
def test_rule_is_exact_by_enumeration(params, shape, mode):
    if shape.startswith("chain") and mode == "distinct":
        pytest.skip("a chain has no siblings: distinct is iid")
    assert exact_error(World(PARAMS[params]), SHAPES[shape], mode) < 1e-6


def _unnormalised(p, q):
    return (p - q).clamp_min(0)


def _from_p(p, q):
    return p


@pytest.mark.parametrize("case", [("static:3", "iid", _unnormalised), ("static:2,1", "top", _unnormalised),
                                  ("chain:2", "iid", _from_p), ("static:3", "distinct_unconditional", residual)])
def test_exact_check_rejects_a_biased_rule(case):
    shape, mode, rule = case
    assert exact_error(World(PARAMS["T1"]), SHAPES[shape], mode, rule) > 1e-3


# ---- the empirical check ---------------------------------------------------------------------------------------

def chi_square_pvalue(counts: dict[tuple, int], expected: dict[tuple, float], n: int) -> float:
    """Pearson's chi-square p-value; cells expected below 5 draws are pooled into one."""
    stat, df, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for cell, prob in expected.items():
        e = prob * n
        if e < 5:
            pooled_obs, pooled_exp = pooled_obs + counts.get(cell, 0), pooled_exp + e
            continue
        stat += (counts.get(cell, 0) - e) ** 2 / e
        df += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        df += 1
    assert not set(counts) - set(expected), "a sequence plain sampling never emits"
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def empirical_pvalue(world: World, parents, mode: str, draws: int, seed: int, rule=residual) -> float:
    """accept_recursive's own draws (the first L tokens, continued by plain sampling) against plain sampling."""
    L = max(DraftTree(tuple(range(len(parents))), parents).depths) + 1
    gen = torch.Generator().manual_seed(seed)
    counts = defaultdict(int)
    for _ in range(draws):
        tokens, q = draw_draft(world, parents, mode, gen)
        tree = DraftTree(tokens, parents)
        seq = accept_recursive(tree, node_probs(world, tree), gen, q, rule).tokens[:L]
        while len(seq) < L:
            seq += (int(race(world.p(CTX + seq), gen)),)
        counts[seq] += 1
    expected = {s: plain_joint(world, s) for s in itertools.product(range(V), repeat=L)}
    return chi_square_pvalue(counts, expected, draws)


@pytest.mark.parametrize("params,shape,mode", [("T1", "chain:2", "iid"), ("top_k3", "static:3", "distinct"),
                                               ("top_p0.8", "static:2,1", "iid"), ("T0.7", "static:2,1", "top")])
def test_rule_draws_match_plain_sampling(params, shape, mode):
    assert empirical_pvalue(World(PARAMS[params]), SHAPES[shape], mode, 3000, seed=11) > 1e-3


def test_chi_square_rejects_a_biased_rule():
    """A chain whose bonus after a rejection comes from p instead of the residual: the draws give it away."""
    assert empirical_pvalue(World(PARAMS["T1"], spread=2.0), SHAPES["chain:2"], "iid", 3000, seed=11,
                            rule=_from_p) < 1e-3


# ---- the raced rule (deterministic proposals) ------------------------------------------------------------------

def test_raced_rule_emits_what_plain_sampling_draws_with_the_same_noise():
    """Deterministic proposals under accept_raced: the emitted tokens are the plain race's tokens with the same
    noise rows, whichever tree proposes (so its distribution is plain sampling's, and a tree that matches more
    only emits more per step)."""
    world = World(PARAMS["top_p0.8"])
    gen = torch.Generator().manual_seed(5)
    for _ in range(200):
        noise = torch.empty(3, V).exponential_(generator=gen)
        plain = ()
        for d in range(3):
            plain += (int(race(world.p(CTX + plain).float(), None, noise[d])),)
        for parents in SHAPES.values():
            tokens, _ = draw_draft(world, parents, "top", gen)
            tree = DraftTree(tokens, parents)
            raced = race_tokens(tree, node_probs(world, tree).float(), noise)
            (acc,) = accept_raced([tree], [raced.tolist()])
            assert acc.tokens == plain[:len(acc.tokens)]


# ---- coupled proposals scored at a logit error scale, grown into a wide dynamic tree ----------------------------

WIDE = TreeSpec.parse("dynamic:4,2,6")  # more nodes at depth 1 than below: where a sampled target diverges


def coupled_tree(world: World, noise: torch.Tensor, score=coupled_row_scores) -> DraftTree:
    """A drafter coupled to the request's noise (spec_decode/coupling.py): at each node its race over q(. | context)
    with the noise row of the node's output position, scored at logit error 1.2, grown into WIDE."""
    params = world.params

    def children(tree, frontier):
        out = []
        for f in frontier:
            q = world.q(CTX + path_tokens(tree.parents, tree.tokens, f)).float()
            top = score(params.temperature * q.log(), params, noise[tree.depths[f]], logit_error=1.2).topk(V)
            out.append((top.indices.tolist(), top.values.tolist()))
        return out

    return grow(WIDE, 0, children)


def coupled_pvalue(world: World, draws: int, seed: int, score=coupled_row_scores) -> float:
    """accept_raced over coupled wide trees (the first 3 tokens, continued by the plain race with the next rows)
    against plain sampling; each draw also emits the plain race's tokens with the same noise."""
    gen, counts, widths = torch.Generator().manual_seed(seed), defaultdict(int), 0
    for _ in range(draws):
        noise = torch.empty(3, V).exponential_(generator=gen)
        plain = ()
        for d in range(3):
            plain += (int(race(world.p(CTX + plain).float(), None, noise[d])),)
        tree = coupled_tree(world, noise, score)
        widths += len(tree.children(0)) > 1
        (acc,) = accept_raced([tree], [race_tokens(tree, node_probs(world, tree).float(), noise).tolist()])
        seq = acc.tokens[:3]
        while len(seq) < 3:
            seq += (int(race(world.p(CTX + seq).float(), None, noise[len(seq)])),)
        if score is coupled_row_scores:
            assert seq == plain
        counts[seq] += 1
    assert widths > draws // 2  # siblings at depth 1 in most trees
    return chi_square_pvalue(counts, {s: plain_joint(world, s) for s in itertools.product(range(V), repeat=3)}, draws)


def _scales_the_shared_noise(logits, params, noise, logit_error=None):
    """The scale moved onto the race's noise (log q / s - log(E^(1/s)) = (log q + g) / s), in place: the rows are
    the target's too."""
    noise.pow_(params.temperature / logit_error)
    return torch.log_softmax(race_scores(logits, params, noise) * params.temperature / logit_error, dim=-1)


def test_coupled_wide_tree_with_logit_error_draws_match_plain_sampling():
    assert coupled_pvalue(World(PARAMS["T0.7"]), 3000, seed=13) > 1e-3


def test_chi_square_rejects_coupled_scores_that_rescale_the_shared_noise():
    assert coupled_pvalue(World(PARAMS["T0.7"]), 3000, seed=13, score=_scales_the_shared_noise) < 1e-3
