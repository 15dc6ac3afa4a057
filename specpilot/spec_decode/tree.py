"""DraftTree: a request's draft tokens as a tree rooted at its last emitted token, and the tree shapes.

Nodes are in topological order (parent[i] < i); node 0 is the root, the token emitted last step that the
target has not seen yet. The tree gives the verify pass its ancestor mask and its RoPE positions
(committed length + depth, never the node index), and the acceptance its root-to-leaf paths.

A tree's shape (its parents tuple) fixes its depths, children, ancestor mask and padded verify rows; these are
computed once per shape (TreeLayout, cached): a static tree repeats the same parents every step.

Tree shapes (TreeSpec, parsed from the CLI's --tree):
- chain:D              D draft tokens in a line;
- static:C1,C2,...     every node at depth d-1 gets C_d children (Sequoia / EAGLE static trees);
- dynamic:K,D,N        EAGLE-2: expand the frontier's top-K by cumulative draft log-probability for D levels,
                       then keep the best N draft nodes (all, when N >= K * D).
A drafter that runs its model over the growing tree stores the tree so far as scratch past the committed tokens:
a dynamic tree holds every level's top-K (1 + K * D nodes) before it keeps the best N. The parser refuses trees
deeper than MAX_TREE_DEPTH or growing past MAX_TREE_NODES: the drafter drafts level by level, and every node is
a row of the drafter's tree pass and of the verify block.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from operator import itemgetter

import numpy as np
import torch

MAX_TREE_NODES = 256  # root included, while the tree grows
MAX_TREE_DEPTH = 32  # drafting is sequential in depth; accepted paths are far shorter


@dataclass(frozen=True, slots=True)
class DraftTree:
    tokens: tuple[int, ...]  # [N] token ids, tokens[0] = root
    parents: tuple[int, ...]  # [N] parent index, parents[0] = -1

    def __post_init__(self):
        if len(self.tokens) != len(self.parents) or not self.tokens:
            raise ValueError("a DraftTree needs one parent per token and at least the root")
        tree_layout(self.parents)  # validates (once per shape)

    @staticmethod
    def chain(tokens: list[int]) -> DraftTree:
        return DraftTree(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @property
    def layout(self) -> TreeLayout:
        return tree_layout(self.parents)

    @property
    def depths(self) -> tuple[int, ...]:
        return self.layout.depths

    def children(self, node: int) -> list[int]:
        return list(self.layout.children[node])

    def ancestor_mask(self) -> torch.Tensor:
        """[N, N] bool: mask[i, j] is True when j is i or an ancestor of i."""
        return torch.from_numpy(self.layout.mask.copy())

    def positions(self, committed_len: int) -> torch.Tensor:
        """[N] RoPE positions: committed length + depth."""
        return committed_len + torch.tensor(self.layout.depths, dtype=torch.long)

    def paths(self) -> list[list[int]]:
        """Root-to-leaf node paths."""
        has_child = set(self.parents[1:])
        out = []
        for leaf in (i for i in range(self.num_nodes) if i not in has_child):
            path = [leaf]
            while self.parents[path[-1]] >= 0:
                path.append(self.parents[path[-1]])
            out.append(path[::-1])
        return out

    def draft_count_per_depth(self) -> list[int]:
        """Number of draft nodes at depth 1, 2, ... (the root is not a draft)."""
        return list(self.layout.draft_count_per_depth)


class TreeLayout:
    """What a tree shape (its parents) determines; built once per shape by tree_layout(). The arrays are shared
    between every tree of the shape: read them, never write them. Only the depths are computed up front (with the
    validation), the rest on first use: a tree's growth makes a new layout per level, which only its scorer reads
    (often just the depths)."""

    def __init__(self, parents: tuple[int, ...]):
        n = len(parents)
        depth = [0] * n
        if not n or parents[0] != -1:
            raise ValueError(f"parents must be topological (parent[i] < i, root -1): {parents}")
        for i in range(1, n):
            p = parents[i]
            if not 0 <= p < i:
                raise ValueError(f"parents must be topological (parent[i] < i, root -1): {parents}")
            depth[i] = depth[p] + 1
        self.parents, self.depths = parents, tuple(depth)
        self._padded: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        children: list[list[int]] = [[] for _ in self.parents]
        for i, p in enumerate(self.parents[1:], 1):
            children[p].append(i)
        return tuple(map(tuple, children))

    @cached_property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, len(self.parents) - 1))

    @cached_property
    def draft_count_per_depth(self) -> tuple[int, ...]:
        counts = [0] * max(self.depths)
        for d in self.depths[1:]:
            counts[d - 1] += 1
        return tuple(counts)

    @cached_property
    def mask(self) -> np.ndarray:
        """[N, N] bool ancestor mask (self included)."""
        return _ancestor_rows(self.parents, len(self.parents))

    def padded(self, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(depths [W], parents [W], ancestor mask [W, W]) padded to `width` with nodes at depth 0, no parent,
        that see only themselves: the verify block's rows for this shape."""
        rows = self._padded.get(width)
        if rows is None:
            n = len(self.parents)
            depths = np.zeros(width, dtype=np.int64)
            depths[:n] = self.depths
            parents = np.full(width, -1, dtype=np.int64)
            parents[:n] = self.parents
            rows = self._padded[width] = (depths, parents, _ancestor_rows(self.parents, width))
            for a in rows:
                a.flags.writeable = False
        return rows


def _ancestor_rows(parents: tuple[int, ...], width: int) -> np.ndarray:
    """[W, W] bool: row i marks node i and its ancestors; rows past the tree see only themselves. Built as one
    bitset (Python int) per row in topological order, then unpacked in one call."""
    rows = [1 << i for i in range(width)]
    for i in range(1, len(parents)):
        rows[i] |= rows[parents[i]]
    nbytes = (width + 7) // 8
    raw = b"".join(r.to_bytes(nbytes, "little") for r in rows)
    bits = np.unpackbits(np.frombuffer(raw, np.uint8).reshape(width, nbytes), axis=1, count=width, bitorder="little")
    mask = bits.view(np.bool_)
    mask.flags.writeable = False
    return mask


@lru_cache(maxsize=1024)
def tree_layout(parents: tuple[int, ...]) -> TreeLayout:
    """The cached layout of a tree shape (dynamic trees change shape every step: the cache is bounded)."""
    return TreeLayout(parents)


@dataclass(frozen=True, slots=True)
class TreeSpec:
    """The tree shape a drafter fills in; a knob the tuner can switch (round-trips through str)."""

    kind: str  # "chain" | "static" | "dynamic"
    depth: int
    branching: tuple[int, ...] = ()  # static: children per node at each depth
    top_k: int = 1  # dynamic
    max_nodes: int = 0  # dynamic: draft nodes kept

    @staticmethod
    def parse(text: str, flag: str = "--tree") -> TreeSpec:
        """The spec of `text`; a ValueError naming `flag` (the option it came from) when it is not one."""
        kind, _, arg = text.partition(":")
        try:
            nums = tuple(int(x) for x in arg.split(",")) if arg else ()
        except ValueError:
            nums = None
        spec = None
        if kind == "chain" and nums and len(nums) == 1 and nums[0] >= 1:
            spec = TreeSpec("chain", nums[0], (1,) * nums[0])
        elif kind == "static" and nums and all(n >= 1 for n in nums):
            spec = TreeSpec("static", len(nums), nums)
        elif kind == "dynamic" and nums and len(nums) == 3 and all(n >= 1 for n in nums):
            spec = TreeSpec("dynamic", nums[1], (), top_k=nums[0], max_nodes=nums[2])
        if spec is None:
            raise ValueError(f"{flag} {text!r}: use chain:D, static:C1,C2,... or dynamic:TOPK,DEPTH,NODES "
                             "with positive integers")
        if spec.depth > MAX_TREE_DEPTH:
            raise ValueError(f"{flag} {text!r}: {spec.depth} levels deep; at most {MAX_TREE_DEPTH}: use a shallower tree")
        if spec.max_grown_nodes > MAX_TREE_NODES:
            raise ValueError(f"{flag} {text!r}: the tree grows to {spec.max_grown_nodes} nodes per step (root "
                             f"included); at most {MAX_TREE_NODES}: use a smaller tree")
        return spec

    def __str__(self) -> str:
        if self.kind == "chain":
            return f"chain:{self.depth}"
        if self.kind == "static":
            return "static:" + ",".join(map(str, self.branching))
        return f"dynamic:{self.top_k},{self.depth},{self.max_nodes}"

    @property
    def max_tree_nodes(self) -> int:
        """Upper bound on the nodes of a proposed tree (root included): the verify block's rows."""
        if self.kind == "dynamic":
            return 1 + min(self.max_nodes, self.top_k * self.depth)
        return _static_nodes(self.branching)

    @property
    def max_grown_nodes(self) -> int:
        """Upper bound on the nodes of the tree while it grows (root included): the scratch a drafter that runs its
        model over the tree so far stores past the committed tokens. A dynamic tree holds every level's top-K
        candidates before it keeps the best max_nodes."""
        if self.kind == "dynamic":
            return 1 + self.top_k * self.depth
        return self.max_tree_nodes

    def capped(self, depth: int) -> TreeSpec:
        """The same shape no deeper than `depth` (a drafter that drafts at most `depth` tokens ahead)."""
        if self.depth <= depth:
            return self
        return TreeSpec(self.kind, depth, self.branching[:depth], self.top_k, min(self.max_nodes, self.top_k * depth))


def _static_nodes(branching: tuple[int, ...]) -> int:
    """Nodes of a static tree, root included."""
    total, width = 1, 1
    for c in branching:
        width *= c
        total += width
    return total


def grow(spec: TreeSpec, root: int, score_children) -> DraftTree:
    """Builds the tree of `spec` from a scorer.

    score_children(tree_so_far, frontier) -> list over frontier nodes of (token ids, log-probs), best first,
    at least max branching long. The scorer sees the partial DraftTree, so it can run its model over it.
    """
    tokens, parents, scores = [root], [-1], [0.0]
    frontier = [0]
    dynamic = spec.kind == "dynamic"
    for level in range(spec.depth):
        if not frontier:
            break
        proposals = score_children(DraftTree(tuple(tokens), tuple(parents)), frontier)
        width = spec.top_k if dynamic else spec.branching[level]
        candidates = []  # (cumulative score, parent, token)
        for node, (toks, logps) in zip(frontier, proposals):
            base = scores[node]
            candidates += [(base + float(lp), node, tok) for tok, lp in zip(toks[:width], logps[:width])]
        if dynamic:
            # stable: equal scores keep proposal order
            candidates.sort(key=itemgetter(0), reverse=True)
            del candidates[spec.top_k:]
        first = len(tokens)
        for score, parent, tok in candidates:
            tokens.append(int(tok))
            parents.append(parent)
            scores.append(score)
        frontier = list(range(first, len(tokens)))
    if dynamic:
        return _keep_best(tokens, parents, scores, spec.max_nodes)
    return DraftTree(tuple(tokens), tuple(parents))


def _keep_best(tokens, parents, scores, max_nodes: int) -> DraftTree:
    """Keeps the root and the max_nodes best-scoring draft nodes; a node's score never beats its parent's
    (log-probs are <= 0), so the kept set is closed under ancestors. Keeps the original (topological) order."""
    # stable: among equal scores the lower index wins
    best = set(sorted(range(1, len(tokens)), key=scores.__getitem__, reverse=True)[:max_nodes])
    # ties at equal scores could keep a child without its parent: drop such orphans (rare); in topological
    # order a node's parent is settled before it
    index = {0: 0}
    for i in range(1, len(tokens)):
        if i in best and parents[i] in index:
            index[i] = len(index)
    kept = list(index)
    return DraftTree(tuple(tokens[i] for i in kept), tuple(-1 if i == 0 else index[parents[i]] for i in kept))
