"""The Drafter protocol the engine talks to.

Per request slot: `start` sees the prompt; each step `propose` gets the root (the token emitted last, not yet
seen by the target) and returns a DraftTree rooted at it; `commit` gets the draft tokens the target accepted
(the bonus token arrives as the next root). A drafter keeps whatever state it needs in step with that.

Feature drafters (EAGLE-3, DFlash) name the target layers they read in `target_layers`: the engine then
hands them the OUTPUT hidden states of those decoder layers (0-based; before the final norm), concatenated
on the last dim in `target_layers` order: for every prompt position at `start`, and for the committed nodes
(root, then the accepted drafts) at `commit`, taken from the verify pass itself (no extra target pass).
"""

from __future__ import annotations

from typing import Protocol

import torch

from specpilot.spec_decode.tree import DraftTree, TreeSpec


class Drafter(Protocol):
    name: str
    target_layers: tuple[int, ...]  # empty: the drafter needs no target features
    max_depth: int | None  # the deepest it drafts (a deeper TreeSpec is cut to it), or None: any depth
    # False: a proposal costs the same at any depth (DFlash's block, n-gram lookups), so the engine asks for the
    # spec's whole tree; True (the engine's default for a drafter that does not say): drafting runs level by level
    sequential: bool

    def allocate(self, num_slots: int, max_seq_len: int) -> None:
        """Room for num_slots requests of max_seq_len positions: the committed tokens plus the largest tree the
        drafter grows (TreeSpec.max_grown_nodes)."""

    def start(self, slot: int, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        """features [P, len(target_layers) * hidden] for the P prompt tokens, or None."""

    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]: ...

    def commit(self, slot: int, accepted: list[int], features: torch.Tensor | None) -> None:
        """accepted: draft tokens kept (root excluded); features [1 + len(accepted), K * hidden] of root + them."""

    # Optional: `skip(slots, roots)`, for a step in which none of these requests verifies a draft; the engine then
    # runs no proposal (commit follows as usual, with no accepted drafts). A drafter without it is asked to
    # propose every step.
    # Optional: `coupled = True`, when propose takes `noise=` (a list per slot: None for a greedy request, else
    # (SamplingParams, race noise rows [depth, vocab])) and then proposes the tokens its own filtered distribution
    # draws with that noise (spec_decode/coupling.py). Any proposal is exact under the raced rule; coupled ones are
    # accepted more often at temperature > 0. A drafter without it proposes as at temperature 0.
    # Optional: `rates_nodes = True` with `node_acceptance(slot)`: after propose, per node of the slot's tree (root
    # first, 1.0) the drafter's estimate that the node is reached and accepted. The engine's adaptive budget then
    # cuts each proposed tree by these estimates (engine/budget.py's gains) instead of the request's recent
    # acceptance.
