"""Synthetic acceptance: the drafter runs at full cost, but an oracle that knows the stock continuation rewrites
its proposals to follow a stated acceptance profile. For random-weight targets in real shapes, where real
acceptance means nothing; every number produced this way is labelled synthetic.

A profile gives, per depth d, the probability that the rank-0 child of a node on the true path is the true
next token (conditional on its parent being right); a sibling of rank r is right with per_depth[d] *
sibling_decay**r when the earlier ranks missed. At most one child of a node is right.

Re-anchoring: in bf16 a random target's logits are nearly flat, so a near-tie can flip between two equally
valid kernels (verify block vs AR decode) and the speculative output leaves the stock continuation; every
draft after that would be wrong (tau -> 1). With an `anchor` the oracle then asks for the stock continuation
of the prefix actually emitted, and drafts from that, a horizon of tokens at a time (an anchor costs an AR
pass of its length; anchoring all the remaining tokens at every flip made long generations quadratic). The output
is still whatever the target verifies.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specpilot.spec.tree import DraftTree, TreeSpec, grow

PROFILES_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True)
class AcceptanceProfile:
    name: str
    per_depth: tuple[float, ...]
    sibling_decay: float = 0.5
    source: str = ""

    @staticmethod
    def load(name_or_path: str) -> AcceptanceProfile:
        path = Path(name_or_path)
        if not path.exists():
            path = PROFILES_DIR / f"{name_or_path}.json"
        if not path.exists():
            shipped = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.json")))
            raise ValueError(f"acceptance profile {name_or_path!r}: no such file; shipped profiles: {shipped}")
        raw = json.loads(path.read_text())
        per_depth = tuple(float(p) for p in raw.get("per_depth", ()))
        if not per_depth or not all(0 <= p <= 1 for p in per_depth):
            raise ValueError(f"{path}: per_depth must be a non-empty list of probabilities")
        return AcceptanceProfile(raw.get("name", path.stem), per_depth, float(raw.get("sibling_decay", 0.5)),
                                 raw.get("source", ""))

    def p(self, depth: int, rank: int) -> float:
        base = self.per_depth[min(depth, len(self.per_depth)) - 1]
        return base * self.sibling_decay**rank

    def expected_chain_tau(self, depth: int) -> float:
        tau, run = 1.0, 1.0
        for d in range(1, depth + 1):
            run *= self.p(d, 0)
            tau += run
        return tau


class SyntheticDrafter:
    """Wraps a drafter: the drafter still runs (its cost is real), but the tree has the spec's full shape and its
    tokens come from the oracle."""

    def __init__(self, inner, truth: dict[int, list[int]], profile: AcceptanceProfile, vocab_size: int, seed: int = 0,
                 anchor: Callable[[list[int], int], list[int]] | None = None, horizon: int = 16):
        self.inner, self.truth, self.profile, self.vocab = inner, truth, profile, vocab_size
        self.name = f"synthetic({getattr(inner, 'name', 'drafter')})"
        self.target_layers = tuple(getattr(inner, "target_layers", ()))
        self.rng = random.Random(seed)
        self.emitted: dict[int, int] = {}
        # anchor(context ids, n): the stock AR continuation of n tokens (the caller keeps it out of the timing)
        self.anchor, self.horizon = anchor, horizon
        self.total: dict[int, int] = {}  # per slot: the length of the stock continuation the run follows
        self.prompts: dict[int, list[int]] = {}
        self.out: dict[int, list[int]] = {}

    def allocate(self, num_slots: int, max_seq_len: int) -> None:
        self.inner.allocate(num_slots, max_seq_len)

    def start(self, slot: int, prompt_ids: list[int], features=None) -> None:
        self.inner.start(slot, prompt_ids, features)
        self.emitted[slot] = 1  # the first token comes from the prefill
        self.prompts[slot], self.out[slot] = list(prompt_ids), []
        self.total.pop(slot, None)  # a new request: its truth (set by the caller) gives the length

    def commit(self, slot: int, accepted: list[int], features=None) -> None:
        self.inner.commit(slot, accepted, features)
        self.emitted[slot] += len(accepted) + 1
        self.out.setdefault(slot, []).extend(accepted)

    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]:
        self.inner.propose(slots, roots, spec)
        spec = self._capped(spec)
        for s, root in zip(slots, roots):
            self.out.setdefault(s, []).append(root)  # the root is the last emitted token
            self._follow(s, spec.depth)
        return [self._rewrite(shape(spec, root), self.truth[s][self.emitted[s]:]) for s, root in zip(slots, roots)]

    def _follow(self, slot: int, depth: int) -> None:
        """Re-anchors the slot's truth on the emitted prefix when that prefix has left it, or when fewer than
        `depth` tokens of it are left before the run's end: `horizon` (at least depth) tokens at a time."""
        out, truth = self.out[slot], self.truth[slot]
        total = self.total.setdefault(slot, len(truth))
        left = total - len(out)
        if self.anchor is None or left <= 0:
            return
        if truth[:len(out)] == out and len(truth) - len(out) >= min(depth, left):
            return
        n = min(max(self.horizon, depth), left)
        self.truth[slot] = out + self.anchor(self.prompts.get(slot, []) + out, n)

    def _capped(self, spec: TreeSpec) -> TreeSpec:
        """The spec no deeper than the inner drafter can draft (a DFlash block of B drafts B - 1 tokens deep, as
        DFlashDrafter caps it): the oracle must not credit depths the real drafter never proposes."""
        block = getattr(self.inner, "block_size", None)
        if block is None or spec.depth <= block - 1:
            return spec
        depth = block - 1
        return TreeSpec(spec.kind, depth, spec.branching[:depth], spec.top_k, spec.max_nodes)

    def _rewrite(self, tree: DraftTree, future: list[int]) -> DraftTree:
        depths = tree.depths
        tokens, on_path = list(tree.tokens), [True] + [False] * (tree.num_nodes - 1)
        for parent in range(tree.num_nodes):
            hit = False
            for rank, child in enumerate(tree.children(parent)):
                d = depths[child]
                truth = future[d - 1] if d - 1 < len(future) else None
                right = (on_path[parent] and not hit and truth is not None
                         and self.rng.random() < self.profile.p(d, rank))
                if right:
                    tokens[child], on_path[child], hit = truth, True, True
                else:
                    tokens[child] = self._wrong(truth)
        return DraftTree(tuple(tokens), tree.parents)

    def _wrong(self, truth: int | None) -> int:
        tok = self.rng.randrange(self.vocab)
        return tok if tok != truth else (tok + 1) % self.vocab


def shape(spec: TreeSpec, root: int) -> DraftTree:
    """The spec's full tree (a dynamic tree as if every expansion scored like its rank); tokens are placeholders."""
    width = max(max(spec.branching, default=1), spec.top_k)
    return grow(spec, root, lambda tree, frontier: [(list(range(width)), [-0.1 * r - 0.01 * f for r in range(width)])
                                                    for f in frontier])
