"""Draft trees for the benchmarks: random trees of N nodes, and a drafter that proposes a tree spec's full shape
at no device cost (a step is then the engine's own work: verify, accept, commit, emit)."""

from __future__ import annotations

import random

from specpilot.bench.synthetic import AcceptanceProfile
from specpilot.bench.synthetic import shape as full_shape
from specpilot.spec_decode.tree import DraftTree, TreeSpec


def random_tree(n: int, vocab: int, rng: random.Random) -> DraftTree:
    """N nodes in topological order, each under one of the 8 nodes before it, at most 8 deep; random tokens."""
    parents, depth = [-1], [0]
    for i in range(1, n):
        p = rng.randrange(max(0, i - 8), i)
        while depth[p] >= 8:
            p = parents[p]
        parents.append(p)
        depth.append(depth[p] + 1)
    return DraftTree(tuple(rng.randrange(vocab) for _ in range(n)), tuple(parents))


class FullTreeDrafter:
    """Proposes the tree spec's full shape with random tokens, at no device cost: a step is then the engine's
    own work (verify, accept, commit, emit) plus a trivial draft. The tokens come from a pool drawn per spec
    up front (dynamic:4,7,28's 28 draws a step would add ~10-15 us of the benchmark's own host time)."""

    name = "full-tree"
    target_layers = ()
    POOL = 61  # rows of draft tokens, cycled

    def __init__(self, vocab: int, seed: int = 0):
        self.vocab, self.rng, self.shapes, self.step = vocab, random.Random(seed), {}, 0

    def allocate(self, num_slots: int, max_seq_len: int) -> None:
        pass

    def start(self, slot: int, prompt_ids: list[int], features=None) -> None:
        pass

    def commit(self, slot: int, accepted: list[int], features=None) -> None:
        pass

    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]:
        key = str(spec)
        if key not in self.shapes:
            par = full_shape(spec, 0, AcceptanceProfile.load("dflash2-gsm8k")).parents
            self.shapes[key] = par, [tuple(self.rng.randrange(self.vocab) for _ in par[1:]) for _ in range(self.POOL)]
        par, pool = self.shapes[key]
        trees = []
        for root in roots:
            self.step += 1
            trees.append(DraftTree((root,) + pool[self.step % self.POOL], par))
        return trees
