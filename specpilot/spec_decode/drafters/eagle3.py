"""EAGLE-3 head drafter (SafeAILab checkpoint format: `LlamaForCausalLMEagle3` / `Eagle3LlamaForCausalLM`).

The head network and its per-token computation are in models/eagle3.py; this drafter feeds it and grows trees.

Features: EAGLE-3 taps the INPUT of target decoder layers 2, L//2 and L-3 (or the config's
`eagle_aux_hidden_state_layer_ids`), i.e. the OUTPUT of layers id-1, which is what the engine hands over.

Bookkeeping per slot: the head cache holds `seen` committed pairs. The features not yet paired with their next
token wait in `pending_feats` (the prompt's at `start`; root + accepted drafts' at `commit`), their next tokens
in `pending_tokens` (the prompt's tail; the accepted drafts); `propose` appends the root, feeds those pairs as
one causal block (they are committed: real features, real tokens) and drafts from the last output. A draft
node at depth d >= 1 pairs its parent's output h (training-time test) with its own token, at RoPE position
seen - 1 + d, stored as scratch after the committed pairs; tree nodes see their ancestors only (ancestor mask).
The bookkeeping and the tree nodes' step are feature_pairs.py's (shared with the MTP layer).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specpilot.runtime.cache import ModelCache
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.causal_lm import CausalLM
from specpilot.models.eagle3 import Eagle3Head, load_eagle3_head
from specpilot.spec_decode.coupling import Noise, coupled_row_scores
from specpilot.spec_decode.drafters.feature_pairs import FeaturePairs
from specpilot.spec_decode.tree import DraftTree, TreeSpec, grow


class Eagle3Drafter(FeaturePairs):
    name = "eagle3"
    max_depth = None
    coupled = True  # propose takes the sampling requests' race noise
    features_needed = "EAGLE-3 needs target features [{n}, {width}] of layers {layers}, got {got}"

    def __init__(self, head: Eagle3Head, target: CausalLM, target_layers: tuple[int, ...], chunk: int = 2048):
        super().__init__(head.fc.in_features)  # 3 * the target's hidden size
        self.head, self.target_layers, self.chunk = head, tuple(target_layers), chunk
        self.config = head.config
        param = head.fc.weight
        self.device, self.dtype = param.device, param.dtype
        self.embed = head.embed_tokens if hasattr(head, "embed_tokens") else target.model.embed_tokens
        self.draft_to_target = torch.arange(head.d2t.numel(), device=self.device) + head.d2t
        self.cache: ModelCache | None = None

    @classmethod
    def from_pretrained(cls, model_dir, target: CausalLM, dtype="auto") -> Eagle3Drafter:
        head, layers = load_eagle3_head(Path(model_dir), target, dtype)
        return cls(head, target, layers)

    def allocate(self, num_slots: int, max_seq_len: int) -> None:
        c = self.cache
        if c is None or c.num_slots < num_slots or c.max_seq_len < max_seq_len:
            self.cache = None
            self.cache = ModelCache(self.config, num_slots, max_seq_len, self.device, self.dtype)

    @torch.inference_mode()
    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec,
                noise: list[Noise] | None = None) -> list[DraftTree]:
        """noise (sampling requests): per slot None or its race noise; then each level's tokens are the head's
        draws with that noise (spec_decode/coupling.py; the draft vocabulary reads the target tokens' noise)."""
        noise = noise or [None] * len(slots)
        return [self._propose_one(slot, root, spec, e) for slot, root, e in zip(slots, roots, noise)]

    def _propose_one(self, slot: int, root: int, spec: TreeSpec, noise: Noise = None) -> DraftTree:
        h_root = self.feed(slot, root)[-1]
        if spec.kind == "chain":
            return DraftTree.chain([root] + self._greedy_chain(slot, h_root, spec.depth, noise))
        hidden = {0: h_root}  # node -> head output h (the feature its children pair with)
        return grow(spec, root, lambda tree, frontier: self._score(slot, tree, frontier, hidden, spec, noise))

    # --- head forward --------------------------------------------------------------------------------------

    def feed(self, slot: int, root: int) -> torch.Tensor:
        """Feeds the pending committed pairs (the root last) into the head cache; their outputs h [n, H]."""
        tokens = self.pending_tokens[slot] + [root]
        feats = self.pending_feats[slot]
        assert feats is not None and feats.shape[0] == len(tokens), "EAGLE-3 feature/token bookkeeping out of step"
        outs = []
        for off in range(0, len(tokens), self.chunk):
            start = self.seen[slot] + off
            ids = torch.tensor([tokens[off:off + self.chunk]], device=self.device)
            fused = self.head.fc(feats[off:off + self.chunk].to(self.device, self.dtype))[None]
            dev = self.device
            meta = BatchMetadata.contiguous(ids, torch.tensor([start], device=dev), torch.tensor([slot], device=dev),
                                            start)
            outs.append(self.forward(meta, fused)[0])
        self.seen[slot] += len(tokens)
        self.pending_tokens[slot], self.pending_feats[slot] = [], None
        return torch.cat(outs)

    def forward(self, meta: BatchMetadata, fused: torch.Tensor) -> torch.Tensor:
        """One head step over a block: fused features [B, T, H] paired with meta.input_ids -> h [B, T, H]."""
        emb = self.embed(meta.input_ids).to(self.dtype)
        cos, sin = self.head.rotary(meta.positions)
        return self.head.midlayer(emb, fused, meta, self.cache.kv(0), cos, sin)

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the DRAFT vocabulary (fp32); map indices with `draft_to_target`."""
        return self.head.lm_head(self.head.norm(h)).float()

    def _greedy_chain(self, slot: int, h: torch.Tensor, depth: int, noise: Noise = None) -> list[int]:
        out, pos, dev = [], self.seen[slot], self.device
        for i in range(depth):
            logits = self.draft_logits(h)
            if noise is not None:
                logits = coupled_row_scores(logits, noise[0], noise[1][i, self.draft_to_target])
            out.append(int(self.draft_to_target[logits.argmax()]))
            if i + 1 < depth:  # pair (h of the previous node, its drafted token) at scratch position pos + i
                ids = torch.tensor([out[-1:]], device=dev)
                meta = BatchMetadata.contiguous(ids, torch.tensor([pos + i], device=dev),
                                                torch.tensor([slot], device=dev), pos + i)
                h = self.forward(meta, h[None, None])[0, -1]
        return out

    def _score(self, slot: int, tree: DraftTree, frontier: list[int], hidden: dict, spec: TreeSpec,
               noise: Noise = None):
        """Top candidates (target ids, log-probs, or with noise the coupled scores) after each frontier node of the
        partial tree."""
        if frontier != [0]:
            hs = self._tree_hidden(slot, tree, hidden)
            for i in range(1, tree.num_nodes):
                hidden[i] = hs[i - 1]
        logits = self.draft_logits(torch.stack([hidden[i] for i in frontier]))
        if noise is None:
            logp = torch.log_softmax(logits, dim=-1)
        else:  # a child at depth d takes noise row d - 1: its parent's depth
            rows = noise[1][[tree.depths[f] for f in frontier]][:, self.draft_to_target]
            logp = coupled_row_scores(logits, noise[0], rows)
        top = logp.topk(min(max(max(spec.branching, default=1), spec.top_k), logp.shape[-1]), dim=-1)
        ids = self.draft_to_target[top.indices]
        return [(t.tolist(), v.tolist()) for t, v in zip(ids, top.values)]
