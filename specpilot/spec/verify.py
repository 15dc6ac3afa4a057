"""Greedy acceptance over a batch of draft trees, and the verify pass's batch layout.

The verify pass runs every request's tree as one block (padded to the largest tree). Acceptance walks each
tree from the root: while a child carries the target's argmax at the current node, move to it. The emitted
tokens are the accepted draft tokens plus the bonus token (the target's argmax at the last accepted node).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.layers.metadata import BatchMetadata
from specpilot.spec.tree import DraftTree


@dataclass(frozen=True, slots=True)
class Acceptance:
    path: tuple[int, ...]  # accepted node indices, root first
    tokens: tuple[int, ...]  # emitted this step: accepted draft tokens, then the bonus token

    @property
    def num_accepted(self) -> int:
        return len(self.path) - 1


def tree_metadata(trees: list[DraftTree], prefix_len: list[int], slots: list[int], device,
                  width: int | None = None, chains_as_trees: bool = False) -> BatchMetadata:
    """The verify block of a batch: nodes stored right after each request's committed prefix, RoPE positions by
    depth, the ancestor mask; smaller trees are padded (to `width` if given: a captured graph's fixed size) with
    nodes that see only themselves."""
    B, T = len(trees), max([t.num_nodes for t in trees] + [width or 0])
    ids = torch.zeros(B, T, dtype=torch.long)
    pos = torch.zeros(B, T, dtype=torch.long)
    mask = torch.eye(T, dtype=torch.bool).repeat(B, 1, 1)
    parents = torch.full((B, T), -1, dtype=torch.long)
    for b, (tree, p) in enumerate(zip(trees, prefix_len)):
        n = tree.num_nodes
        ids[b, :n] = torch.tensor(tree.tokens)
        parents[b, :n] = torch.tensor(tree.parents)
        pos[b, :n] = tree.positions(p)
        pos[b, n:] = p
        mask[b, :n, :n] = tree.ancestor_mask()
    prefix = torch.tensor(prefix_len, dtype=torch.long)
    loc = prefix[:, None] + torch.arange(T)[None, :]
    # chains need no mask: causal order is their ancestor order, and padding after a chain is seen by no real
    # node (this is also what lets recurrent layers, which take no mask, verify chains)
    all_chains = all(t.parents == tuple(range(-1, t.num_nodes - 1)) for t in trees)
    if all_chains and not chains_as_trees:
        mask = parents = None
    else:
        mask, parents = mask.to(device), parents.to(device)
    return BatchMetadata(ids.to(device), pos.to(device), loc.to(device), torch.tensor(slots, device=device),
                         prefix.to(device), max(prefix_len), mask, parents=parents)


def accept_greedy(trees: list[DraftTree], argmax: list[list[int]]) -> list[Acceptance]:
    """argmax[b][i]: the target's greedy token after node i of request b (host lists: the step's one sync)."""
    out = []
    for tree, best in zip(trees, argmax):
        children: dict[tuple[int, int], int] = {}
        for i in range(1, tree.num_nodes):
            children.setdefault((tree.parents[i], tree.tokens[i]), i)
        path = [0]
        while (path[-1], best[path[-1]]) in children:
            path.append(children[(path[-1], best[path[-1]])])
        out.append(Acceptance(tuple(path), tuple(tree.tokens[i] for i in path[1:]) + (best[path[-1]],)))
    return out
