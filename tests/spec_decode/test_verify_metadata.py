"""The packed verify metadata and the cached tree layouts equal the plain per-tree torch construction they replace."""

import random

import pytest
import torch

from specpilot.layers.metadata import BatchMetadata
from specpilot.spec_decode.tree import DraftTree, TreeLayout, tree_layout
from specpilot.spec_decode.verify import accept_greedy, tree_metadata


def _random_tree(rng: random.Random, n: int, vocab: int = 6) -> DraftTree:
    # a small vocabulary gives siblings equal tokens: acceptance must then take the first of them
    parents = tuple([-1] + [rng.randrange(i) for i in range(1, n)])
    return DraftTree(tuple(rng.randrange(vocab) for _ in range(n)), parents)


def _reference_mask(parents) -> torch.Tensor:
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        mask[i] |= mask[parents[i]]
    return mask


def _reference_metadata(trees, prefix_len, slots, width=None, chains_as_trees=False) -> BatchMetadata:
    """tree_metadata as it was built before packing (per-tree torch ops, one tensor per field)."""
    B, T = len(trees), max([t.num_nodes for t in trees] + [width or 0])
    ids = torch.zeros(B, T, dtype=torch.long)
    pos = torch.zeros(B, T, dtype=torch.long)
    mask = torch.eye(T, dtype=torch.bool).repeat(B, 1, 1)
    parents = torch.full((B, T), -1, dtype=torch.long)
    for b, (tree, p) in enumerate(zip(trees, prefix_len)):
        n = tree.num_nodes
        ids[b, :n] = torch.tensor(tree.tokens)
        parents[b, :n] = torch.tensor(tree.parents)
        depths = [0] * n
        for i in range(1, n):
            depths[i] = depths[tree.parents[i]] + 1
        pos[b, :n] = p + torch.tensor(depths)
        pos[b, n:] = p
        mask[b, :n, :n] = _reference_mask(tree.parents)
    prefix = torch.tensor(prefix_len, dtype=torch.long)
    loc = prefix[:, None] + torch.arange(T)[None, :]
    if all(t.parents == tuple(range(-1, t.num_nodes - 1)) for t in trees) and not chains_as_trees:
        mask = parents = None
    return BatchMetadata(ids, pos, loc, torch.tensor(slots), prefix, max(prefix_len), mask, parents=parents)


def _reference_accept(trees, argmax):
    out = []
    for tree, best in zip(trees, argmax):
        children = {}
        for i in range(1, tree.num_nodes):
            children.setdefault((tree.parents[i], tree.tokens[i]), i)
        path = [0]
        while (path[-1], best[path[-1]]) in children:
            path.append(children[(path[-1], best[path[-1]])])
        out.append((tuple(path), tuple(tree.tokens[i] for i in path[1:]) + (best[path[-1]],)))
    return out


FIELDS = ("input_ids", "positions", "cache_loc", "slots", "prefix_len", "block_mask", "parents")


def _assert_same(meta: BatchMetadata, ref: BatchMetadata) -> None:
    assert meta.max_prefix_len == ref.max_prefix_len
    for name in FIELDS:
        got, want = getattr(meta, name), getattr(ref, name)
        if want is None:
            assert got is None, name
            continue
        assert got.dtype == want.dtype and torch.equal(got, want), name


@pytest.mark.parametrize("seed", range(12))
def test_packed_metadata_equals_the_plain_construction(seed):
    rng = random.Random(seed)
    B = rng.choice([1, 2, 5])
    chains = seed % 4 == 0  # all chains: causal, no mask
    trees = [DraftTree.chain([rng.randrange(9) for _ in range(rng.randint(1, 7))]) if chains
             else _random_tree(rng, rng.randint(1, 20)) for _ in range(B)]
    prefix = [rng.randint(0, 300) for _ in range(B)]
    slots = rng.sample(range(8), B)
    width = rng.choice([None, max(t.num_nodes for t in trees) + rng.randint(0, 5)])
    for as_trees in (False, True):
        meta = tree_metadata(trees, prefix, slots, "cpu", width, chains_as_trees=as_trees)
        _assert_same(meta, _reference_metadata(trees, prefix, slots, width, as_trees))
        # one buffer holds every field, in the layout pack() and unpack() agree on
        assert torch.equal(meta.pack(), meta.packed)
        assert all(getattr(meta, f) is None or getattr(meta, f).untyped_storage().data_ptr()
                   == meta.packed.untyped_storage().data_ptr() for f in FIELDS)
        again = BatchMetadata.unpack(meta.pack(), B, meta.num_tokens, meta.block_mask is not None, 7)
        _assert_same(again, BatchMetadata(*(getattr(meta, f) for f in FIELDS[:5]), 7, meta.block_mask,
                                          parents=meta.parents))


def test_cached_template_takes_each_steps_tokens_slots_and_prefixes():
    """The same shapes step after step (a template cache hit) with new tokens, slots and prefix lengths."""
    rng = random.Random(7)
    shapes = [_random_tree(rng, 9).parents, tuple(range(-1, 4)), _random_tree(rng, 6).parents]
    for _ in range(4):
        trees = [DraftTree(tuple(rng.randrange(50) for _ in p), p) for p in shapes]
        prefix, slots = [rng.randint(0, 300) for _ in trees], rng.sample(range(8), len(trees))
        _assert_same(tree_metadata(trees, prefix, slots, "cpu", 12), _reference_metadata(trees, prefix, slots, 12))


def test_unpack_views_a_buffer_at_an_offset():
    """A packed buffer that is itself a slice (as_strided offsets are absolute in the storage)."""
    trees = [_random_tree(random.Random(1), 9), _random_tree(random.Random(2), 4)]
    meta = tree_metadata(trees, [5, 50], [1, 0], "cpu", 11)
    big = torch.cat([torch.full((3,), 99), meta.packed])
    _assert_same(BatchMetadata.unpack(big[3:], 2, 11, True, 50), meta)


@pytest.mark.parametrize("seed", range(6))
def test_tree_layout_equals_per_tree_walks(seed):
    rng = random.Random(seed)
    tree = _random_tree(rng, rng.randint(1, 30))
    lay = tree.layout
    assert torch.equal(tree.ancestor_mask(), _reference_mask(tree.parents))
    assert tree.children(0) == [i for i, p in enumerate(tree.parents) if p == 0]
    depths, parents, mask = lay.padded(tree.num_nodes + 3)
    assert depths.tolist() == list(tree.depths) + [0] * 3 and parents.tolist() == list(tree.parents) + [-1] * 3
    assert mask[tree.num_nodes:].tolist() == torch.eye(tree.num_nodes + 3, dtype=torch.bool)[tree.num_nodes:].tolist()
    assert sum(tree.draft_count_per_depth()) == tree.num_nodes - 1
    # one layout per shape, shared by every tree of it
    assert DraftTree(tuple(range(tree.num_nodes)), tuple(tree.parents)).layout is lay is tree_layout(tree.parents)


def test_tree_layout_rejects_bad_parents():
    with pytest.raises(ValueError, match="topological"):
        TreeLayout((-1, 1))
    with pytest.raises(ValueError, match="topological"):
        DraftTree((1, 2), (0, -1))


@pytest.mark.parametrize("seed", range(8))
def test_acceptance_takes_the_first_matching_child(seed):
    rng = random.Random(seed)
    trees = [_random_tree(rng, rng.randint(1, 25), vocab=3) for _ in range(4)]
    width = max(t.num_nodes for t in trees)
    argmax = [[rng.randrange(3) for _ in range(width)] for _ in trees]
    got = [(a.path, a.tokens) for a in accept_greedy(trees, argmax)]
    assert got == _reference_accept(trees, argmax)
