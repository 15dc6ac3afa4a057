"""The bookkeeping of a drafter that pairs each target feature with the token after it (EAGLE-3's head, the MTP
layer): per slot, `seen` committed pairs in the drafter's cache; the features not yet paired in `pending_feats`
(the prompt's at `start`; root + accepted drafts' at `commit`), their next tokens in `pending_tokens` (the prompt's
tail; the accepted drafts; the root, known at `propose`, comes last). A tree's non-root nodes each pair their
parent's output with their own token (`_tree_hidden`).
"""

from __future__ import annotations

import torch

from specpilot.layers.metadata import BatchMetadata
from specpilot.spec_decode.tree import DraftTree


class FeaturePairs:
    """A drafter's base: it sets `device` and defines `forward(meta, hidden)`, one causal step of its network."""
    # the ValueError of features of the wrong shape; fields n, width, layers (the drafter's target_layers), got
    features_needed: str
    target_layers: tuple[int, ...]
    device: torch.device

    def __init__(self, feature_width: int):
        self.feature_width = feature_width
        self.seen: dict[int, int] = {}  # committed (feature, next token) pairs in the drafter's cache
        self.pending_feats: dict[int, torch.Tensor] = {}  # [n, feature_width] features not yet paired
        self.pending_tokens: dict[int, list[int]] = {}  # the n - 1 tokens after them (the root comes last)

    def start(self, slot: int, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        self._check_features(features, len(prompt_ids))
        self.seen[slot] = 0
        self.pending_feats[slot] = features
        self.pending_tokens[slot] = list(prompt_ids[1:])

    def commit(self, slot: int, accepted: list[int], features: torch.Tensor | None) -> None:
        self._check_features(features, 1 + len(accepted))
        self.pending_feats[slot] = features
        self.pending_tokens[slot] = list(accepted)

    def _check_features(self, features, n: int) -> None:
        width = self.feature_width
        if features is None or tuple(features.shape) != (n, width):
            got = None if features is None else tuple(features.shape)
            raise ValueError(self.features_needed.format(n=n, width=width, layers=self.target_layers, got=got))

    def _tree_hidden(self, slot: int, tree: DraftTree, hidden: dict) -> torch.Tensor:
        """Outputs of the non-root nodes: node i pairs its parent's output (hidden[parent]) with its token at
        position seen - 1 + depth, stored after the committed pairs, seeing them and its ancestors only."""
        dev, n, seen = self.device, tree.num_nodes - 1, self.seen[slot]
        ids = torch.tensor([tree.tokens[1:]], device=dev)
        parents = torch.stack([hidden[tree.parents[i]] for i in range(1, tree.num_nodes)])[None]
        pos = tree.positions(seen - 1)[1:][None].to(dev)
        loc = (seen + torch.arange(n))[None].to(dev)
        mask = tree.ancestor_mask()[1:, 1:][None].to(dev)
        meta = BatchMetadata(ids, pos, loc, torch.tensor([slot], device=dev), torch.tensor([seen], device=dev), seen,
                             mask)
        return self.forward(meta, parents)[0]
