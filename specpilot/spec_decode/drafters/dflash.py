"""DFlash (v1) block drafter, loading z-lab `DFlashDraftModel` checkpoints.

A few Qwen3-style layers with no embedding and no LM head of their own (the target's are borrowed). The
target's hidden states at `target_layer_ids` are concatenated, projected by `fc` and normalised by
`hidden_norm`; every draft layer turns that context into extra keys and values (its own k_proj / v_proj /
k_norm, RoPE at the tokens' absolute positions), kept in the drafter's cache. One forward over the block
[root, MASK x (B-1)], bidirectional inside the block and seeing all context, gives a distribution for each
of the B-1 next positions: a chain takes the argmax of each, a tree the top candidates per position.

A step's proposal is one forward over every request's block (the drafter's own attention layers: the block's
K/V go to scratch positions [context, context + B) of the slot, past the context, which the next context
extension overwrites), then one device-to-host copy; on GPU that forward is a CUDA graph per (batch, depth,
tree width), and for a coupled proposal (sampling requests) also per row's filter settings, its race noise in
static rows refilled before each replay. The block reads its context through the draft paths' attention: with `block_kernel` (the runtime's
choice on a GPU) the tree-attention op reads each request's own context by its device length; SDPA has no device
bound, so a captured SDPA proposal gathers the whole cache of every slot in the batch. Accepted tokens' target
features extend the context lazily, inside the same forward: the requests' new rows (at most a block each: the
accepted path) are packed back to back in an [n * B, F] buffer by one copy, the forward gathers B rows per request
from its offset and writes them at [old context, old context + B); the rows past the new ones land on scratch
positions that the block then overwrites, so the extension has a fixed shape and joins the graph. Longer
extensions (a prompt's features) take one eager pass first. A chain's tokens are the argmax of the LM head's
output in the model dtype (the same index as the argmax of its exact fp32 widening, without an fp32 copy of
n * depth * vocab logits); a tree's candidates are the top-k of the fp32 log-softmax.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from specpilot.checkpoint.directory import safetensors_files
from specpilot.checkpoint.errors import CheckpointError
from specpilot.config import EngineConfig
from specpilot.runtime.cache import ModelCache
from specpilot.runtime.graphs import capture
from specpilot.runtime.settings import Runtime
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.causal_lm import CausalLM
from specpilot.models.dflash import DFlashModel, default_target_layers, read_config
from specpilot.models.loader import load_weights, resolve_dtype
from specpilot.spec_decode.coupling import (Noise, coupled_scores, fill_noise, filter_key, graph_noise_fits,
                                             static_noise)
from specpilot.spec_decode.tree import DraftTree, TreeSpec, grow


class ProposalGraph:
    """The context extension and proposal forward of a fixed (batch, depth, width), captured once and replayed:
    it reads one static int64 input [4, n] (roots, slots, old context lengths, new context rows) and a static
    packed features buffer [n * B, F], and writes one static output."""

    def __init__(self, run, inputs: torch.Tensor, features: torch.Tensor, warmup: int = 2,
                 noise: torch.Tensor | None = None):
        """noise: the static race noise rows [n, depth, vocab] a coupled proposal's run reads (the caller refills
        them before each replay), or None."""
        self.inputs, self.features, self.noise = inputs.clone(), features.clone(), noise
        self.graph, self.output = capture(run, self.inputs, self.features, warmup=warmup)

    def replay(self, inputs: torch.Tensor, new: list[torch.Tensor], pack) -> torch.Tensor:
        """pack(buffer, new): writes the requests' new context rows into the static features buffer."""
        self.inputs.copy_(inputs, non_blocking=True)
        pack(self.features, new)
        self.graph.replay()
        return self.output


def pack_rows(buffer: torch.Tensor, new: list[torch.Tensor]) -> None:
    """The requests' new context features (in batch-row order) back to back from row 0 of the [n * B, F] buffer, in
    one copy; the rows after them are scratch."""
    if len(new) == 1:
        buffer[:new[0].shape[0]].copy_(new[0])
    elif new:
        torch.cat(new, out=buffer[:sum(f.shape[0] for f in new)])


class DFlashDrafter:
    name = "dflash"
    sequential = False  # one proposal costs the same at every depth (the engine then asks for its full tree)
    coupled = True  # propose takes the sampling requests' race noise

    def __init__(self, model: DFlashModel, target: CausalLM, target_layers: tuple[int, ...], block_size: int,
                 mask_token_id: int, use_graphs: bool | None = None, runtime: Runtime | None = None,
                 logit_error: float = 1.2):
        """runtime: the target runner's (default: Runtime.build(EngineConfig(), the model's device)); its draft
        paths are the proposal forward's kernels, its cuda_graphs whether proposals are captured (unless
        use_graphs says otherwise). logit_error: the scale, in logits, of the draft logits' error against the
        target's, which a sampling request's tree scores assume (spec_decode/coupling.py); it changes which nodes a
        dynamic tree keeps, never the output."""
        # 1.2: the zoo's hybrid DFlash on sampled HumanEval text (maximum likelihood 1.05-1.25 at T 0.7 and 1.0, and
        # the best tau of 1.0 / 1.2 / 1.4: docs/decisions/2026-12-02-sampled-tree-proposals.md)
        self.logit_error = logit_error
        self.model, self.target = model, target
        self.target_layers, self.block_size, self.mask_token_id = tuple(target_layers), block_size, mask_token_id
        self.max_depth = block_size - 1  # a block is the root and the positions it predicts
        self.device = next(model.parameters()).device
        self.on_gpu = self.device.type == "cuda"
        runtime = runtime if runtime is not None else Runtime.build(EngineConfig(), self.device)
        self.use_graphs = runtime.cuda_graphs if use_graphs is None else use_graphs
        # the pointwise helpers compile only where a proposal graph fixes the shapes
        self.paths = runtime.draft if self.use_graphs else dataclasses.replace(runtime.draft, compiled=False)
        self.graphs: dict[tuple[int, int, int], ProposalGraph] = {}
        self.cache: ModelCache | None = None
        self.context_len: dict[int, int] = {}
        self._pending: list[tuple[int, int, torch.Tensor]] = []  # (slot, start, features) not yet cached
        self._offsets = torch.arange(block_size, device=self.device)
        self._full_mask = torch.ones(1, block_size, block_size, dtype=torch.bool, device=self.device)

    def allocate(self, num_slots: int, max_seq_len: int) -> None:
        # block_size scratch positions past the longest context hold a proposal block's K/V
        size = max_seq_len + self.block_size
        c = self.cache
        if c is None or c.num_slots < num_slots or c.max_seq_len < size:
            self.graphs.clear()
            self._pending.clear()  # extensions of contexts in the old cache (finished requests' last commits)
            self.context_len.clear()
            self.cache = None
            self.cache = ModelCache(self.model.config, num_slots, size, self.device, self.model.fc.weight.dtype)

    @torch.inference_mode()
    def start(self, slot: int, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        self._pending = [p for p in self._pending if p[0] != slot]  # a finished request's last commit
        self.context_len[slot] = 0
        self._extend(slot, features)

    @torch.inference_mode()
    def commit(self, slot: int, accepted: list[int], features: torch.Tensor | None) -> None:
        self._extend(slot, features)

    def skip(self, slots: list[int], roots: list[int]) -> None:
        """A step that verifies no draft of these requests proposes nothing: the roots' features reach the context
        through commit, as every committed token's do."""

    def _extend(self, slot: int, features: torch.Tensor) -> None:
        start = self.context_len[slot]
        self._pending.append((slot, start, features))
        self.context_len[slot] = start + features.shape[0]

    def _take_pending(self, slots: list[int]) -> list[tuple[int, int, torch.Tensor]]:
        """The pending extensions that join this proposal's forward, as (row, old context length, features): one
        per proposing request, at most a block. If any of theirs does not fit, everything is flushed eagerly
        first. Extensions of slots not proposing now stay pending."""
        rows = {s: i for i, s in enumerate(slots)}
        mine = [p for p in self._pending if p[0] in rows]
        if len({p[0] for p in mine}) < len(mine) or any(f.shape[0] > self.block_size for _, _, f in mine):
            self._flush()
            return []
        self._pending = [p for p in self._pending if p[0] not in rows]
        return [(rows[slot], start, f) for slot, start, f in mine]

    def _flush(self) -> None:
        """Every pending context extension into the cache: one add_context for all requests."""
        if not self._pending:
            return
        total = sum(f.shape[0] for _, _, f in self._pending)
        host = torch.empty(2, total, dtype=torch.long, pin_memory=self.on_gpu)
        index, at = host.numpy(), 0
        for slot, start, f in self._pending:
            n = f.shape[0]
            index[0, at:at + n] = slot
            index[1, at:at + n] = np.arange(start, start + n)
            at += n
        features = torch.cat([f for _, _, f in self._pending]) if len(self._pending) > 1 else self._pending[0][2]
        slots, positions = host.to(self.device, non_blocking=True)
        self.model.add_context(features, positions, slots, self.cache)
        self._pending.clear()

    @torch.inference_mode()
    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec,
                noise: list[Noise] | None = None) -> list[DraftTree]:
        """noise (sampling requests): per slot None or its race noise (spec_decode/coupling.py); then the block's
        tokens are the draft distribution's draws with that noise, computed eagerly."""
        capped = spec.capped(self.max_depth)
        depth = capped.depth
        if spec.kind == "chain":
            rows = self._draft(slots, roots, depth, 0, noise)
            return [DraftTree.chain([root] + row) for root, row in zip(roots, rows)]
        # no wider than the vocabulary: a node has at most that many distinct children
        width = min(max(max(spec.branching, default=1), spec.top_k), self.target.config.vocab_size)
        packed = self._draft(slots, roots, depth, width, noise)  # [2, n, depth, width] int32: ids, score bits
        ids, logps = packed[0].tolist(), packed[1].view(torch.float32).tolist()
        # positions in a block are predicted independently: a node's children are its depth's top tokens
        return [grow(capped, root, lambda tree, frontier, t=t, lp=lp: [(t[tree.depths[f]], lp[tree.depths[f]])
                                                                        for f in frontier])
                for root, t, lp in zip(roots, ids, logps)]

    def _draft(self, slots: list[int], roots: list[int], depth: int, width: int, noise: list[Noise] | None = None):
        """The batch's proposal on the host, from one forward and one device-to-host copy: width 0 (chain)
        argmax rows [n][depth]; else top-k ids and log-prob bits as an int32 host tensor [2, n, depth, width]."""
        pending = self._take_pending(slots)
        host = self._inputs(slots, roots, pending)
        new = [f for _, _, f in sorted(pending, key=lambda p: p[0])]  # batch-row order, as the forward gathers
        coupled = noise is not None and any(e is not None for e in noise)
        # a coupled proposal's graph is per sampling setting of each row (the filtering ops it captures)
        key = (len(slots), depth, width) + (tuple(map(filter_key, noise)) if coupled else ())
        vocab = next(e[1].shape[-1] for e in noise if e is not None) if coupled else 0
        fits = not coupled or key in self.graphs or graph_noise_fits(self.graphs, noise, depth, vocab)
        if self.use_graphs and fits:
            graph = self.graphs.get(key)
            if graph is None:
                # a replay cannot follow a host bound: the SDPA path (no block_kernel) reads the whole cache; the
                # tree-attention op ignores the bound and reads each request's context by its device length
                max_len = self.cache.max_seq_len
                features = self._features(len(slots))
                self._pack(features, new)
                # the graph's static noise rows [n, depth, vocab], refilled before each replay
                rows = static_noise(noise, depth, vocab, self.device) if coupled else None
                static = [None if e is None else (e[0], rows[b]) for b, e in enumerate(noise)] if coupled else None
                graph = self.graphs[key] = ProposalGraph(lambda x, f: self._run(x, f, depth, width, max_len, static),
                                                         host.to(self.device), features, noise=rows)
            if coupled:
                fill_noise(graph.noise, noise)
            out = graph.replay(host, new, self._pack)
        else:
            features = self._features(len(slots))
            self._pack(features, new)
            out = self._run(host.to(self.device, non_blocking=True), features, depth, width,
                            int((host[2] + host[3]).max()), noise)
        return out.tolist() if width == 0 else out.cpu()

    def _pack(self, buffer: torch.Tensor, new: list[torch.Tensor]) -> None:
        pack_rows(buffer, new)

    def _inputs(self, slots: list[int], roots: list[int], pending) -> torch.Tensor:
        """The step's only host-to-device input, [4, n] (roots, slots, old context lengths, new context rows);
        pinned on GPU so that its copy does not block."""
        old, new = [self.context_len[s] for s in slots], [0] * len(slots)
        for row, start, f in pending:
            old[row], new[row] = start, f.shape[0]
        return torch.tensor([roots, slots, old, new], dtype=torch.long, pin_memory=self.on_gpu)

    def _features(self, n: int) -> torch.Tensor:
        """A zeroed [n * B, F] buffer of packed new context features (zeros: the scratch rows stay finite)."""
        fc = self.model.fc.weight
        return torch.zeros(n * self.block_size, fc.shape[1], dtype=fc.dtype, device=self.device)

    def _run(self, inputs: torch.Tensor, features: torch.Tensor, depth: int, width: int,
             max_prefix_len: int, noise: list[Noise] | None = None) -> torch.Tensor:
        """Device only (capturable): inputs [4, n] and the packed new context features [n * B, F] -> chain
        argmax [n, depth] int64, or (width > 0) the top-k ids and log-prob bits [2, n, depth, width] int32, so
        one copy brings back both."""
        roots, slots, old, new = inputs
        n, B = inputs.shape[1], self.block_size
        # request r's rows start where the rows of the requests before it end; its rows past `new` are scratch
        # (another request's rows or stale ones: finite) that land where the block then writes
        first = torch.cumsum(new, 0) - new
        rows = (first[:, None] + self._offsets).clamp_(max=features.shape[0] - 1).view(-1)
        self.model.add_context(features[rows], (old[:, None] + self._offsets).view(-1),
                               slots[:, None].expand(n, B).reshape(-1), self.cache, self.paths)
        return self._pick(self._logits(torch.stack((roots, slots, old + new)), depth, max_prefix_len), width, noise)

    def _pick(self, logits: torch.Tensor, width: int, noise: list[Noise] | None = None) -> torch.Tensor:
        """logits [n, depth, vocab] in the LM head's dtype -> chain argmax [n, depth] int64 (widening to fp32 is
        exact and keeps the order and the first of equal maxima, so the argmax needs no fp32 copy), or the top
        `width` ids and log-prob bits [2, n, depth, width] int32 of the fp32 log-softmax; with noise, of the coupled
        scores at the drafter's logit_error instead (spec_decode/coupling.py)."""
        if noise is not None:
            logits = coupled_scores(logits, noise, logit_error=self.logit_error)
        if width == 0:
            return logits.argmax(-1)
        top = (logits if noise is not None else torch.log_softmax(logits.float(), dim=-1)).topk(width, dim=-1)
        return torch.stack((top.indices.to(torch.int32), top.values.view(torch.int32)))

    def _logits(self, inputs: torch.Tensor, depth: int, max_prefix_len: int) -> torch.Tensor:
        """inputs [3, n] (roots, slots, context lengths) -> draft logits [n, depth, vocab] in the LM head's dtype
        of the positions after each root (a root sits at its context length, its block at the scratch positions
        from there)."""
        roots, slots, start = inputs
        n, B = inputs.shape[1], self.block_size
        ids = torch.where(self._offsets == 0, roots[:, None], self.mask_token_id)  # [n, B]
        pos = start[:, None] + self._offsets
        meta = BatchMetadata(ids, pos, pos, slots, start, max_prefix_len, self._full_mask.expand(n, B, B),
                             paths=self.paths)
        hidden = self.model(self.target.model.embed_tokens(ids), meta, self.cache)
        return self.target.logits(hidden[:, 1:1 + depth], self.paths)

    @torch.inference_mode()
    def block_logits(self, slots: list[int], roots: list[int]) -> torch.Tensor:
        """Draft logits [n, B-1, vocab] fp32 for the positions after each root (eager)."""
        self._flush()
        host = self._inputs(slots, roots, [])[:3]
        return self._logits(host.to(self.device), self.block_size - 1, int(host[2].max())).float()


def load_dflash(model_dir: Path, target: CausalLM, dtype="auto", runtime: Runtime | None = None) -> DFlashDrafter:
    cfg, layers, block, mask_id, raw = read_config(model_dir)
    tcfg = target.config
    if layers is None:
        layers = default_target_layers(int(raw.get("num_target_layers", tcfg.num_hidden_layers)), cfg.num_hidden_layers)
    if cfg.vocab_size != tcfg.vocab_size:
        raise CheckpointError(f"{model_dir}: vocab_size {cfg.vocab_size} differs from the target's {tcfg.vocab_size}; "
                              "a DFlash drafter is trained for one target vocabulary")
    if cfg.hidden_size != tcfg.hidden_size:
        raise CheckpointError(f"{model_dir}: hidden_size {cfg.hidden_size} differs from the target's "
                              f"{tcfg.hidden_size}; DFlash borrows the target's embedding and LM head")
    if not 0 <= mask_id < tcfg.vocab_size:
        raise CheckpointError(f"{model_dir}: mask_token_id {mask_id} is outside the target vocabulary "
                              f"({tcfg.vocab_size})")
    if any(not 0 <= i < tcfg.num_hidden_layers for i in layers):
        raise CheckpointError(f"{model_dir}: target_layer_ids {list(layers)} out of range for a "
                              f"{tcfg.num_hidden_layers}-layer target")
    param = next(target.parameters())
    dtype = param.dtype if dtype == "auto" else resolve_dtype(dtype, param.device)
    with torch.device("meta"):
        model = DFlashModel(cfg, len(layers))
    model = model.to(dtype=dtype).to_empty(device=param.device)
    model.reset_buffers()
    load_weights(model, safetensors_files(model_dir))
    return DFlashDrafter(model.eval().requires_grad_(False), target, layers, block, mask_id, runtime=runtime)
