"""DraftTree geometry, tree shapes and greedy acceptance (pure functions, no model)."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.spec_decode.tree import DraftTree, TreeSpec, grow
from specpilot.spec_decode.verify import accept_greedy, tree_metadata


@st.composite
def trees(draw, max_nodes: int = 24):
    n = draw(st.integers(1, max_nodes))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens = [draw(st.integers(0, 9)) for _ in range(n)]
    return DraftTree(tuple(tokens), tuple(parents))


@given(trees())
@settings(max_examples=60, deadline=None)
def test_mask_positions_and_paths_agree(tree):
    mask, depths = tree.ancestor_mask(), tree.depths
    for i in range(tree.num_nodes):
        chain, j = [], i
        while j >= 0:
            chain.append(j)
            j = tree.parents[j]
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == set(chain)
        assert depths[i] == len(chain) - 1
    assert tree.positions(7).tolist() == [7 + d for d in depths]
    paths = tree.paths()
    assert sorted({n for p in paths for n in p}) == list(range(tree.num_nodes))
    assert all(p[0] == 0 and all(tree.parents[b] == a for a, b in zip(p, p[1:])) for p in paths)


@given(trees(), st.lists(st.integers(0, 9), min_size=24, max_size=24))
@settings(max_examples=60, deadline=None)
def test_greedy_acceptance_is_the_longest_agreeing_path(tree, best):
    acc = accept_greedy([tree], [best[:tree.num_nodes]])[0]
    for a, b in zip(acc.path, acc.path[1:]):
        assert tree.parents[b] == a and tree.tokens[b] == best[a]
    last = acc.path[-1]
    assert all(tree.tokens[c] != best[last] for c in tree.children(last))
    assert acc.tokens == tuple(tree.tokens[i] for i in acc.path[1:]) + (best[last],)


def test_invalid_trees_are_rejected():
    with pytest.raises(ValueError, match="topological"):
        DraftTree((1, 2, 3), (-1, 2, 0))
    with pytest.raises(ValueError, match="one parent per token"):
        DraftTree((1, 2), (-1,))


@pytest.mark.parametrize("text,nodes", [("chain:4", 5), ("static:3,2,1", 1 + 3 + 6 + 6), ("dynamic:4,5,12", 13)])
def test_tree_specs_parse_round_trip_and_size(text, nodes):
    spec = TreeSpec.parse(text)
    assert str(spec) == text and spec.max_tree_nodes == nodes


@pytest.mark.parametrize("text", ["chain", "chain:0", "static:", "dynamic:1,2", "beam:3", "chain:x"])
def test_bad_tree_specs_name_the_forms(text):
    with pytest.raises(ValueError, match="chain:D, static"):
        TreeSpec.parse(text)


def _scorer(tree, frontier):
    # deterministic fake draft: children tokens 0..3 with decreasing log-probs that depend on the parent
    return [([(tree.tokens[f] + j) % 10 for j in range(4)], [-0.1 * (j + 1) - 0.01 * f for j in range(4)])
            for f in frontier]


def test_static_tree_has_the_requested_branching():
    tree = grow(TreeSpec.parse("static:3,2"), 5, _scorer)
    assert tree.num_nodes == 1 + 3 + 6
    assert tree.draft_count_per_depth() == [3, 6]
    assert all(len(tree.children(i)) == 2 for i in tree.children(0))


def test_dynamic_tree_keeps_the_best_nodes_closed_under_ancestors():
    tree = grow(TreeSpec.parse("dynamic:3,4,7"), 5, _scorer)
    assert tree.num_nodes == 8
    assert max(tree.depths) <= 4


def _reference_grow(spec: TreeSpec, root: int, score_children) -> DraftTree:
    """grow, plainly: sort every level's candidates by score (stable), keep the best max_nodes by (score, index),
    drop any kept node with an ancestor left out."""
    tokens, parents, scores, frontier = [root], [-1], [0.0], [0]
    for level in range(spec.depth):
        if not frontier:
            break
        width = spec.top_k if spec.kind == "dynamic" else spec.branching[level]
        candidates = [(scores[node] + float(lp), node, int(tok))
                      for node, (toks, logps) in zip(frontier, score_children(DraftTree(tuple(tokens), tuple(parents)),
                                                                             frontier))
                      for tok, lp in list(zip(toks, logps))[:width]]
        if spec.kind == "dynamic":
            candidates = sorted(candidates, key=lambda c: -c[0])[:spec.top_k]
        frontier = list(range(len(tokens), len(tokens) + len(candidates)))
        for score, parent, tok in candidates:
            tokens.append(tok), parents.append(parent), scores.append(score)
    if spec.kind != "dynamic":
        return DraftTree(tuple(tokens), tuple(parents))
    best = sorted(range(1, len(tokens)), key=lambda i: (-scores[i], i))[:spec.max_nodes]

    def rooted(i):
        return i == 0 or (i in best and rooted(parents[i]))

    kept = [i for i in range(len(tokens)) if rooted(i)]
    return DraftTree(tuple(tokens[i] for i in kept), tuple(-1 if i == 0 else kept.index(parents[i]) for i in kept))


def _tied_scorer(seed: int):
    rng = random.Random(seed)

    def score(tree, frontier):
        # few distinct log-probs, 0 among them: ties everywhere, and children as good as their parent
        return [([rng.randrange(9) for _ in range(4)], sorted((-0.5 * rng.randint(0, 2) for _ in range(4)),
                                                              reverse=True)) for _ in frontier]

    return score


@pytest.mark.parametrize("seed", range(10))
def test_grow_equals_the_plain_construction_with_tied_scores(seed):
    rng = random.Random(seed)
    for i in range(20):
        spec = rng.choice([TreeSpec.parse(f"dynamic:{rng.randint(1, 4)},{rng.randint(1, 5)},{rng.randint(1, 20)}"),
                           TreeSpec("static", 3, tuple(rng.randint(1, 3) for _ in range(3)))])
        got, want = grow(spec, 1, _tied_scorer(i)), _reference_grow(spec, 1, _tied_scorer(i))
        assert (got.tokens, got.parents) == (want.tokens, want.parents), spec


def test_tree_metadata_pads_and_masks():
    chain = DraftTree.chain([1, 2, 3])
    star = DraftTree((4, 5, 6, 7), (-1, 0, 0, 0))
    meta = tree_metadata([chain, star], [10, 3], [1, 0], "cpu")
    assert meta.input_ids.shape == (2, 4) and meta.max_prefix_len == 10
    assert meta.positions[0, :3].tolist() == [10, 11, 12] and meta.positions[1].tolist() == [3, 4, 4, 4]
    assert meta.cache_loc[1].tolist() == [3, 4, 5, 6]
    assert meta.block_mask[0, 3].tolist() == [False, False, False, True]  # padding sees itself only
    assert meta.block_mask[1, 2].tolist() == [True, False, True, False]
    chains = tree_metadata([chain, DraftTree.chain([9])], [4, 4], [0, 1], "cpu")
    assert chains.block_mask is None  # chains verify causally (recurrent layers need it)
