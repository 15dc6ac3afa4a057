"""DFlash2 block drafter, loading z-lab / Inco AI `DFlash2DraftModel` checkpoints (network: models/dflash2.py).

The proposal is DFlash v1's (spec_decode/drafters/dflash.py: the same context cache, lazy context extension inside
the forward, one proposal forward per step, CUDA graphs per (batch, depth, width)), with the block's embeddings
scaled by `input_embedding_scale` and the tokens picked by the candidate selector instead of a per-slot argmax:
the forward ends in the slots' top-K candidates and their pair scores [n, depth, K, K], then
- chain: the greedy walk, slot by slot, of the best candidate given the previous choice (on the device, inside the
  captured graph);
- tree: each node's children are the best candidates of the next slot given the node (the root: given the root
  token), scored by the log-softmax of the pair scores over the K candidates; the device sends back, per slot and
  predecessor, the top `width` children (ids, log-probs, candidate index) and the host grows the tree.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specpilot.checkpoint.directory import safetensors_files
from specpilot.checkpoint.errors import CheckpointError
from specpilot.checkpoint.file import CheckpointFile
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.causal_lm import CausalLM
from specpilot.models.dflash import default_target_layers
from specpilot.models.dflash2 import DFlash2Model, DFlash2Options, read_config
from specpilot.models.loader import load_weights, resolve_dtype
from specpilot.runtime.settings import Runtime
from specpilot.spec_decode.drafters.dflash import DFlashDrafter
from specpilot.spec_decode.tree import DraftTree, TreeSpec, grow


class DFlash2Drafter(DFlashDrafter):
    name = "dflash2"
    coupled = False  # its proposals are the selector's greedy walk: no draft distribution for sampled verification

    def __init__(self, model: DFlash2Model, target: CausalLM, target_layers: tuple[int, ...],
                 use_graphs: bool | None = None, runtime: Runtime | None = None):
        opts: DFlash2Options = model.options
        super().__init__(model, target, target_layers, opts.block_size, opts.mask_token_id, use_graphs, runtime)
        self.options, self.top_k = opts, opts.selector_top_k
        if opts.causal:
            self._full_mask = self._full_mask.tril()

    @torch.inference_mode()
    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]:
        capped = spec.capped(self.max_depth)
        if spec.kind == "chain":
            rows = self._draft(slots, roots, capped.depth, 0)
            return [DraftTree.chain([root] + row) for root, row in zip(roots, rows)]
        width = min(max(max(spec.branching, default=1), spec.top_k), self.top_k)
        packed = self._draft(slots, roots, capped.depth, width)  # [3, n, depth, K, width]: ids, log-prob bits, index
        ids, logps, index = packed[0].tolist(), packed[1].view(torch.float32).tolist(), packed[2].tolist()
        return [grow(capped, root, lambda tree, frontier, t=t, lp=lp, ix=ix: _children(tree, frontier, t, lp, ix))
                for root, t, lp, ix in zip(roots, ids, logps, index)]

    def _logits(self, inputs: torch.Tensor, depth: int, max_prefix_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """inputs [3, n] (roots, slots, context lengths) -> the slots' candidates [n, depth, K] and pair scores
        [n, depth, K, K] fp32 (what _pick walks)."""
        roots, slots, start = inputs
        n, B = inputs.shape[1], self.block_size
        ids = torch.where(self._offsets == 0, roots[:, None], self.mask_token_id)
        pos = start[:, None] + self._offsets
        meta = BatchMetadata(ids, pos, pos, slots, start, max_prefix_len, self._full_mask.expand(n, B, B),
                             paths=self.paths)
        embeds = self.target.model.embed_tokens(ids) * self.options.input_embedding_scale
        hidden = self.model(embeds, meta, self.cache)[:, 1:1 + depth]
        cand, unary = self.model.unary(self.target.logits(hidden, self.paths), self.top_k)
        return cand, self.model.candidate_selector.scores(cand, unary, hidden, roots, self.paths)

    def _pick(self, selected: tuple[torch.Tensor, torch.Tensor], width: int, noise=None) -> torch.Tensor:
        """Chain (width 0): the greedy walk [n, depth] int64 (the first of equal scores). Tree: per slot and
        predecessor the top `width` children as int32 [3, n, depth, K, width]: token ids, log-prob bits, candidate
        index."""
        cand, scores = selected
        n, depth, K = cand.shape
        if width == 0:
            rows = torch.arange(n, device=cand.device)
            prev = torch.zeros(n, dtype=torch.long, device=cand.device)  # slot 0: every row is the root's
            out = []
            for s in range(depth):
                prev = scores[rows, s, prev].argmax(-1)
                out.append(cand[rows, s, prev])
            return torch.stack(out, dim=1)
        top = torch.log_softmax(scores, dim=-1).topk(width, dim=-1)
        tokens = cand[:, :, None, :].expand(n, depth, K, K).gather(-1, top.indices)
        return torch.stack((tokens.to(torch.int32), top.values.view(torch.int32), top.indices.to(torch.int32)))

    @torch.inference_mode()
    def block_logits(self, slots: list[int], roots: list[int]) -> torch.Tensor:
        raise NotImplementedError("DFlash2 picks tokens with its candidate selector; use propose()")


def _children(tree: DraftTree, frontier: list[int], ids, logps, index):
    """For each frontier node: the top children (ids, log-probs) of the next slot given the node. A node at depth
    d >= 1 is a candidate of slot d - 1; its row in slot d is its index among those candidates."""
    out = []
    for f in frontier:
        d = tree.depths[f]
        row = 0 if d == 0 else _candidate_index(tree, f, ids, index)
        out.append((ids[d][row], logps[d][row]))
    return out


def _candidate_index(tree: DraftTree, node: int, ids, index) -> int:
    d, parent = tree.depths[node], tree.parents[node]
    prow = 0 if d == 1 else _candidate_index(tree, parent, ids, index)
    return index[d - 1][prow][ids[d - 1][prow].index(tree.tokens[node])]


def load_dflash2(model_dir: Path, target: CausalLM, dtype="auto", runtime: Runtime | None = None) -> DFlash2Drafter:
    cfg, opts, raw = read_config(model_dir)
    tcfg = target.config
    layers = opts.target_layers
    if layers is None:
        layers = default_target_layers(int(raw.get("num_target_layers", tcfg.num_hidden_layers)), cfg.num_hidden_layers)
    if cfg.vocab_size != tcfg.vocab_size:
        raise CheckpointError(f"{model_dir}: vocab_size {cfg.vocab_size} differs from the target's {tcfg.vocab_size}; "
                              "a DFlash2 drafter is trained for one target vocabulary")
    if cfg.hidden_size != tcfg.hidden_size:
        raise CheckpointError(f"{model_dir}: hidden_size {cfg.hidden_size} differs from the target's "
                              f"{tcfg.hidden_size}; DFlash2 borrows the target's embedding and LM head")
    if not 0 <= opts.mask_token_id < tcfg.vocab_size:
        raise CheckpointError(f"{model_dir}: mask_token_id {opts.mask_token_id} is outside the target vocabulary "
                              f"({tcfg.vocab_size})")
    if any(not 0 <= i < tcfg.num_hidden_layers for i in layers):
        raise CheckpointError(f"{model_dir}: target_layer_ids {list(layers)} out of range for a "
                              f"{tcfg.num_hidden_layers}-layer target")
    files = safetensors_files(model_dir)
    suffixed = sorted(n for f in files for n in _names(f) if n.endswith("_codebook.weight"))
    if suffixed:
        raise CheckpointError(f"{model_dir}: {suffixed[0]}: the public layout stores the selector's codebooks as bare "
                              "tensors (candidate_selector.predecessor_codebook / successor_codebook, no .weight); "
                              "rename the keys")
    param = next(target.parameters())
    dtype = param.dtype if dtype == "auto" else resolve_dtype(dtype, param.device)
    with torch.device("meta"):
        model = DFlash2Model(cfg, len(layers), opts)
    model = model.to(dtype=dtype).to_empty(device=param.device)
    model.reset_buffers()
    try:
        load_weights(model, files, progress=False)
    except CheckpointError as e:
        raise CheckpointError(f"{model_dir}: {e}") from None
    return DFlash2Drafter(model.eval().requires_grad_(False), target, tuple(layers), runtime=runtime)


def _names(path: Path) -> list[str]:
    with CheckpointFile(path) as f:
        return list(f.names)
