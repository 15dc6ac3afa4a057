"""Draft-LM drafter: a small model of a supported family sharing the target's tokenizer, with its own cache.

Per slot the draft cache holds the committed sequence up to the last root. Each step feeds the tokens the
target accepted since (plus the new root) as one block, then grows the tree: a chain by greedy decode steps,
a static or dynamic tree level by level (each level re-runs the tree so far under its ancestor mask; on a
recurrent draft model that is the tree-masked delta rule, which writes no state). Draft positions past the
committed length are scratch, overwritten by the next feed; recurrent draft models keep their state by
snapshot and restore around chain drafting.
"""

from __future__ import annotations

import torch

from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.settings import Runtime
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.causal_lm import CausalLM
from specpilot.runtime.sampling import race_scores
from specpilot.spec_decode.coupling import Noise, coupled_row_scores
from specpilot.spec_decode.tree import DraftTree, TreeSpec, grow


class DraftLMDrafter:
    name = "draft-lm"
    target_layers: tuple[int, ...] = ()
    max_depth = None
    coupled = True  # propose takes the sampling requests' race noise

    def __init__(self, model: CausalLM, runtime: Runtime | None = None):
        """runtime: the target runner's, so that its weight format and CUDA graph settings hold for the draft
        model too (default: Runtime.build(EngineConfig(), the model's device))."""
        self.model = model
        self.runner = ModelRunner(model, runtime)
        self.seen: dict[int, int] = {}  # committed tokens in the draft cache
        self.pending: dict[int, list[int]] = {}  # accepted by the target, not yet fed to the draft

    def allocate(self, num_slots: int, max_seq_len: int) -> None:
        self.runner.allocate(num_slots, max_seq_len)

    def start(self, slot: int, prompt_ids: list[int], features=None) -> None:
        self.runner.prefill(slot, prompt_ids)
        self.seen[slot], self.pending[slot] = len(prompt_ids), []

    def commit(self, slot: int, accepted: list[int], features=None) -> None:
        self.pending[slot] = self.pending[slot] + list(accepted)

    def skip(self, slots: list[int], roots: list[int]) -> None:
        """A step that verifies no draft of these requests: each root waits to be fed with the next step's block."""
        for slot, root in zip(slots, roots):
            self.pending[slot] = self.pending[slot] + [root]

    @torch.inference_mode()
    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec,
                noise: list[Noise] | None = None) -> list[DraftTree]:
        """noise (sampling requests): per slot None or its race noise; then each level's tokens are the draft
        distribution's draws with that noise (spec_decode/coupling.py)."""
        noise = noise or [None] * len(slots)
        return [self._propose_one(slot, root, spec, e) for slot, root, e in zip(slots, roots, noise)]

    def _propose_one(self, slot: int, root: int, spec: TreeSpec, noise: Noise = None) -> DraftTree:
        feed = self.pending[slot] + [root]
        logits = self._block(slot, feed, self.seen[slot])[-1]
        self.seen[slot] += len(feed)
        self.pending[slot] = []
        cache = self.runner.cache
        snap = cache.snapshot(torch.tensor([slot], device=self.runner.device)) if self.model.config.is_hybrid else None
        if spec.kind == "chain":
            tree = DraftTree.chain([root] + self._greedy_chain(slot, logits, spec.depth, noise))
        else:
            tree = grow(spec, root, lambda t, frontier: self._score(slot, t, frontier, logits, spec, noise))
        if snap is not None:
            cache.restore(snap)
        return tree

    def _block(self, slot: int, tokens: list[int], start: int) -> torch.Tensor:
        dev = self.runner.device
        ids = torch.tensor([tokens], device=dev)
        meta = BatchMetadata.contiguous(ids, torch.tensor([start], device=dev), torch.tensor([slot], device=dev), start)
        return self.model.logits(self.model(meta, self.runner.cache))[0].float()

    def _greedy_chain(self, slot: int, logits: torch.Tensor, depth: int, noise: Noise = None) -> list[int]:
        out, pos = [], self.seen[slot]
        for i in range(depth):
            out.append(int((logits if noise is None else race_scores(logits, noise[0], noise[1][i])).argmax()))
            if i + 1 < depth:
                logits = self._block(slot, out[-1:], pos + i)[-1]
        return out

    def _score(self, slot: int, tree: DraftTree, frontier: list[int], root_logits: torch.Tensor, spec: TreeSpec,
               noise: Noise = None):
        """Top candidates (tokens, log-probs, or with noise the coupled scores) after each frontier node of the
        partial tree."""
        if frontier == [0]:
            rows = root_logits[None]
        else:
            rows = self._tree_logits(slot, tree)[[i - 1 for i in frontier]]
        if noise is None:
            logp = torch.log_softmax(rows, dim=-1)
        else:  # a child at depth d takes noise row d - 1: its parent's depth
            logp = coupled_row_scores(rows, noise[0], noise[1][[tree.depths[f] for f in frontier]])
        top = logp.topk(min(max(max(spec.branching, default=1), spec.top_k), logp.shape[-1]), dim=-1)
        return [(t.tolist(), v.tolist()) for t, v in zip(top.indices, top.values)]

    def _tree_logits(self, slot: int, tree: DraftTree) -> torch.Tensor:
        """Draft logits of the non-root nodes; the root is the last committed token of the draft cache."""
        dev = self.runner.device
        n = tree.num_nodes - 1
        seen = self.seen[slot]
        ids = torch.tensor([tree.tokens[1:]], device=dev)
        pos = (tree.positions(seen - 1)[1:])[None].to(dev)
        loc = (seen + torch.arange(n))[None].to(dev)
        mask = tree.ancestor_mask()[1:, 1:][None].to(dev)
        # parents among the non-root nodes: the root itself is committed state (-1)
        parents = torch.tensor([[p - 1 for p in tree.parents[1:]]], device=dev)
        meta = BatchMetadata(ids, pos, loc, torch.tensor([slot], device=dev), torch.tensor([seen], device=dev), seen,
                             mask, parents=parents)
        return self.model.logits(self.model(meta, self.runner.cache))[0].float()
