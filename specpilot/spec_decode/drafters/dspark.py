"""DSpark block drafter, loading DeepSeek-AI `Qwen3DSparkModel` checkpoints (network: models/dspark.py).

The context cache and the proposal forward are DFlash v1's (spec_decode/drafters/dflash.py: lazy context extension
inside the forward, CUDA graphs per (batch, depth, width) for chains), with DSpark's block layout (B inputs, B
drafts: the root's slot predicts the first) and its heads:
- chain: the Markov walk on the device, slot by slot: argmax(base logits + W2 W1[previous draft]), inside the
  captured graph, with each slot's confidence;
- tree: one eager forward gives the slots' hidden states and base logits; the tree then grows level by level, each
  frontier node's children the top tokens of the next slot's logits with the node's own Markov bias (one batched
  device call per level).

Confidence (the hook for the engine's per-request depth): after `propose`, `confidence[slot]` holds, per node of
the tree proposed for that slot (node 0, the root: 1.0), the confidence head's predicted probability that the
node's token is accepted given its parent, and `survival[slot]` the product along the node's path (the
probability that the node is reached and accepted: the expected accepted drafts of a tree is the sum over its
nodes). Without a confidence head both are 1.0 everywhere. With one, `node_acceptance` hands `survival` to the
engine's adaptive budget, which cuts each proposed chain or static tree by it (engine/budget.py's node gains, the
verify cost curve measured on this GPU pricing the nodes).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specpilot.checkpoint.directory import safetensors_files
from specpilot.checkpoint.errors import CheckpointError
from specpilot.checkpoint.file import CheckpointFile
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.causal_lm import CausalLM
from specpilot.models.dspark import DSparkModel, read_config
from specpilot.models.loader import load_weights, resolve_dtype
from specpilot.runtime.settings import Runtime
from specpilot.spec_decode.drafters.dflash import DFlashDrafter
from specpilot.spec_decode.tree import DraftTree, TreeSpec, grow


class DSparkDrafter(DFlashDrafter):
    name = "dspark"
    coupled = False  # its proposals are the Markov walk's argmax: no draft distribution for sampled verification

    def __init__(self, model: DSparkModel, target: CausalLM, use_graphs: bool | None = None,
                 runtime: Runtime | None = None):
        opts = model.options
        super().__init__(model, target, opts.target_layers, opts.block_size, opts.mask_token_id, use_graphs, runtime)
        self.max_depth = opts.block_size  # every slot of the block, the root's included, predicts a token
        self.embed = model.embed_tokens if opts.own_embedding else target.model.embed_tokens
        self.confidence: dict[int, list[float]] = {}
        self.survival: dict[int, list[float]] = {}
        self.rates_nodes = opts.confidence  # the engine's budget reads node_acceptance

    def node_acceptance(self, slot: int) -> list[float]:
        """Per node of the slot's last proposal (root first): the chance that it is reached and accepted."""
        return self.survival[slot]

    @torch.inference_mode()
    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]:
        capped = spec.capped(self.max_depth)
        if spec.kind == "chain":
            tokens, conf = self._draft(slots, roots, capped.depth, 0)  # [2][n][depth] floats
            trees = [DraftTree.chain([root] + [int(t) for t in row]) for root, row in zip(roots, tokens)]
            for slot, c in zip(slots, conf):
                self._record(slot, [1.0] + c, None)
            return trees
        return self._trees(slots, roots, capped)

    def _record(self, slot: int, conf: list[float], parents: tuple[int, ...] | None) -> None:
        """conf: per node (root first); parents None: a chain."""
        survival = list(conf)
        for i in range(1, len(conf)):
            survival[i] *= survival[parents[i]] if parents is not None else survival[i - 1]
        self.confidence[slot], self.survival[slot] = conf, survival

    # --- the block forward ---------------------------------------------------------------------------------

    def _logits(self, inputs: torch.Tensor, depth: int, max_prefix_len: int):
        """inputs [3, n] (roots, slots, context lengths) -> (base logits [n, depth, V], hidden [n, depth, H], roots):
        slot i of the block [root, MASK...] predicts the token i + 1 after the root."""
        roots, slots, start = inputs
        n, B = inputs.shape[1], self.block_size
        ids = torch.where(self._offsets == 0, roots[:, None], self.mask_token_id)
        pos = start[:, None] + self._offsets
        meta = BatchMetadata(ids, pos, pos, slots, start, max_prefix_len, self._full_mask.expand(n, B, B),
                             paths=self.paths)
        hidden = self.model(self.embed(ids), meta, self.cache)[:, :depth]
        head = self.model.lm_head if self.model.options.own_head else self.target.lm_head
        return head(hidden, self.paths), hidden, roots

    def _pick(self, block, width: int, noise=None) -> torch.Tensor:
        """The chain's Markov walk: [2, n, depth] fp32, the drafted tokens (exact in fp32: ids < 2^24) and each
        slot's confidence. The walk is sequential (each slot's bias reads the previous draft); the confidences
        then take every slot at once."""
        base, hidden, root = block
        prev, tokens = root, []
        for s in range(base.shape[1]):
            prev = self.model.markov_logits(base[:, s], prev).argmax(-1)
            tokens.append(prev)
        drafts = torch.stack(tokens, 1)
        conf = self.model.confidence(hidden, torch.cat((root[:, None], drafts[:, :-1]), 1))
        return torch.stack((drafts.float(), conf))

    def _trees(self, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]:
        self._flush()
        host = self._inputs(slots, roots, [])[:3]
        base, hidden, _ = self._logits(host.to(self.device), spec.depth, int(host[2].max()))
        width = min(max(max(spec.branching, default=1), spec.top_k), base.shape[-1])
        out = []
        for i, (slot, root) in enumerate(zip(slots, roots)):
            conf = {0: 1.0}

            def score(tree: DraftTree, frontier: list[int], i=i, conf=conf):
                d = tree.depths[frontier[0]]  # a level's frontier shares one depth
                prev = torch.tensor([tree.tokens[f] for f in frontier], device=self.device)
                k = len(frontier)
                logits, c = self.model.step(base[i, d].expand(k, -1), hidden[i, d].expand(k, -1), prev)
                top = torch.log_softmax(logits, dim=-1).topk(width, dim=-1)
                for f, cf in zip(frontier, c.tolist()):
                    conf[f] = cf  # the confidence of f's children (one value per parent: the slot's prediction)
                return [(t.tolist(), v.tolist()) for t, v in zip(top.indices, top.values)]

            tree = grow(spec, root, score)
            # a node's confidence is its parent's slot prediction
            node_conf = [1.0] + [conf.get(tree.parents[j], 1.0) for j in range(1, tree.num_nodes)]
            self._record(slot, node_conf, tree.parents)
            out.append(tree)
        return out

    @torch.inference_mode()
    def block_logits(self, slots: list[int], roots: list[int]) -> torch.Tensor:
        """Base logits (no Markov bias) [n, B, vocab] fp32 of the B positions after each root (eager)."""
        self._flush()
        host = self._inputs(slots, roots, [])[:3]
        return self._logits(host.to(self.device), self.block_size, int(host[2].max()))[0].float()


def load_dspark(model_dir: Path, target: CausalLM, dtype="auto", runtime: Runtime | None = None) -> DSparkDrafter:
    files = safetensors_files(model_dir)
    keys = set()
    for file in files:
        with CheckpointFile(file) as f:
            keys |= set(f.names)
    cfg, opts, raw = read_config(model_dir, keys)
    tcfg = target.config
    if cfg.vocab_size != tcfg.vocab_size:
        raise CheckpointError(f"{model_dir}: vocab_size {cfg.vocab_size} differs from the target's {tcfg.vocab_size}; "
                              "a DSpark drafter is trained for one target vocabulary")
    if cfg.hidden_size != tcfg.hidden_size and not (opts.own_embedding and opts.own_head):
        raise CheckpointError(f"{model_dir}: hidden_size {cfg.hidden_size} differs from the target's "
                              f"{tcfg.hidden_size} and the checkpoint lacks embed_tokens.weight / lm_head.weight")
    if not 0 <= opts.mask_token_id < tcfg.vocab_size:
        raise CheckpointError(f"{model_dir}: mask_token_id {opts.mask_token_id} is outside the target vocabulary "
                              f"({tcfg.vocab_size})")
    if any(i >= tcfg.num_hidden_layers for i in opts.target_layers):
        raise CheckpointError(f"{model_dir}: target_layer_ids {list(opts.target_layers)} out of range for a "
                              f"{tcfg.num_hidden_layers}-layer target")
    param = next(target.parameters())
    dtype = param.dtype if dtype == "auto" else resolve_dtype(dtype, param.device)
    with torch.device("meta"):
        model = DSparkModel(cfg, opts)
    model = model.to(dtype=dtype).to_empty(device=param.device)
    model.reset_buffers()
    try:
        load_weights(model, files, progress=False)
    except CheckpointError as e:
        raise CheckpointError(f"{model_dir}: {e}") from None
    return DSparkDrafter(model.eval().requires_grad_(False), target, runtime=runtime)
