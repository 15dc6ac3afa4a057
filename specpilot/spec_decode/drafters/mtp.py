"""The target's own multi-token-prediction layer as a drafter (`--drafter mtp`, Qwen3.5 / Qwen3-Next checkpoints).

The layer and its loader are in models/mtp.py. It reads the target's final-normed hidden state: the drafter
asks the engine for the output of the last decoder layer and applies the target's final norm itself.

Bookkeeping per slot: the MTP cache holds `seen` committed pairs (h_j, token j+1) at positions j. The features
not yet paired wait in `pending_feats` (the prompt's at `start`; root + accepted drafts' at `commit`), their next
tokens in `pending_tokens`; `propose` appends the root and feeds every request's pairs as one causal block (padded
to the longest; a pad sits after its request's real pairs, where the next feed overwrites it). The last output
predicts the first draft token. Chained for depth > 1 as the public engines do: a draft at depth d >= 1 pairs its
parent's MTP output with its own token at position seen - 1 + d, stored as scratch after the committed pairs; a
chain runs one batched step per level, a tree re-runs its nodes per level under the ancestor mask (top-k children
per node by the MTP's log-probabilities).
A chain whose pending blocks are all short (a step's accepted path, not a prompt) runs feed and levels as one
device-only call on the runtime's draft kernels (`_chain_block`), replayed from a CUDA graph per (batch, depth,
block width) where the runtime captures graphs; a prompt's first feed and trees run eagerly.
The bookkeeping and the tree nodes' step are feature_pairs.py's (shared with the EAGLE-3 head).

Sampling requests (coupled, spec_decode/coupling.py): `propose(..., noise=...)` hands each sampling request's race
noise rows; its draft at depth d is then the race's draw of its own filtered draft distribution q with row d - 1
(the noise the target's draw at that output position uses), and a tree node's children are the race's draws in
order, scored at the drafter's logit_error. A greedy request in the same batch takes the head's argmax as before.
The one-call chain step takes the noise as static rows [n, depth, draft vocab] too, its graph per (batch, depth,
block width) and each row's filter settings, within coupling.MAX_GRAPH_NOISE_BYTES (past it the step runs eagerly).

Draft vocabulary: by default every level scores the target's whole LM head. Given a DraftVocab (`--drafter mtp:FILE`
or `mtp:N`, draft_vocab.py), the levels and the trees score a contiguous copy of those ids' rows made once here,
and `draft_to_target` maps the head's argmax / top-k back to target ids: the draft distribution q is the softmax
over those ids, zero elsewhere (`draft_probs`); a draft token races with the noise of the target id it stands for.
Head format: `--drafter mtp+fp8` (or `mtp:N+fp8`) scores an FP8 copy of the head rows instead (layers/fp8_linear.py),
half the bytes each level reads; the draft distribution is then the FP8 head's, which verification corrects.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from specpilot.config import EngineConfig
from specpilot.layers.fp8_linear import Fp8Linear
from specpilot.layers.linear import Linear
from specpilot.layers.metadata import BatchMetadata
from specpilot.layers.paths import PLAIN, KernelPaths
from specpilot.models.causal_lm import CausalLM
from specpilot.models.mtp import MTPModel, load_mtp
from specpilot.runtime.cache import ModelCache
from specpilot.runtime.graphs import capture
from specpilot.runtime.sampling import SamplingParams, filtered_probs
from specpilot.runtime.settings import Runtime
from specpilot.spec_decode.coupling import (Noise, coupled_row_scores, fill_noise, filter_key, graph_noise_fits,
                                             static_noise)
from specpilot.spec_decode.drafters.draft_vocab import DraftVocab
from specpilot.spec_decode.drafters.feature_pairs import FeaturePairs
from specpilot.spec_decode.tree import DraftTree, TreeSpec, grow
from specpilot.weights import w12n

FEED_BATCH = 64  # longer pending blocks (a prompt) are fed per request, in chunks of FEED_CHUNK
FEED_CHUNK = 2048
HEAD_FORMATS = ("bf16", "fp8")  # how the draft LM head holds the target's head rows
CHAIN_BLOCK = 16  # pending blocks up to this long join a chain's one-call step (padded to a power of two)


class ChainGraph:
    """`_chain_block` of a fixed (batch, depth, block width), captured once: it reads one static int64 input
    [n * (W + 3)] (the requests' block tokens row by row, then every seen, block length and slot) and static
    features [n, W, H]; a coupled step also reads static race noise rows [n, depth, draft vocab]."""

    def __init__(self, run, inputs: torch.Tensor, feats: torch.Tensor, noise: torch.Tensor | None = None):
        """noise: the static rows the run reads (the caller refills them before each replay), or None."""
        self.inputs, self.feats, self.noise = inputs.clone(), feats.clone(), noise
        self.graph, self.output = capture(run, self.inputs, self.feats)

    def replay(self, inputs: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        self.inputs.copy_(inputs, non_blocking=True)
        self.feats.copy_(feats)
        self.graph.replay()
        return self.output


class MTPDrafter(FeaturePairs):
    name = "mtp"
    max_depth = None
    coupled = True  # propose takes the sampling requests' race noise
    features_needed = "MTP needs the target's last-layer outputs [{n}, {width}], got {got}"

    def __init__(self, model: MTPModel, target: CausalLM, runtime: Runtime | None = None,
                 use_graphs: bool | None = None, vocab: DraftVocab | None = None, logit_error: float | None = 1.0,
                 head_format: str = "bf16"):
        """runtime: the target runner's (default: Runtime.build(EngineConfig(), the model's device)); its draft
        paths are the chain step's kernels, its cuda_graphs whether chain steps are captured (unless use_graphs
        says otherwise). vocab: the draft vocabulary (None: the target's whole vocabulary). logit_error: the scale of
        the draft logits' error that a sampling request's tree scores assume (spec_decode/coupling.py; None: unit
        scores); it changes which nodes a dynamic tree keeps, never the output. head_format: "bf16" (the target's
        head rows as they are) or "fp8" (an FP8 copy of them, layers/fp8_linear.py: half the bytes per level; its
        error changes acceptance, never the output)."""
        # the default 1.0 is fitted on the zoo's MTP layer (docs/sampling.md has the fit)
        super().__init__(model.config.hidden_size)
        self.logit_error = logit_error
        self.model, self.target = model, target
        self.config = model.config
        self.target_layers = (target.config.num_hidden_layers - 1,)
        param = model.mtp.fc.weight
        self.device, self.dtype = param.device, param.dtype
        self.on_gpu = self.device.type == "cuda"
        runtime = runtime if runtime is not None else Runtime.build(EngineConfig(), self.device)
        self.use_graphs = runtime.cuda_graphs if use_graphs is None else use_graphs
        # the pointwise helpers compile only where a graph fixes the shapes
        self.paths = runtime.draft if self.use_graphs else dataclasses.replace(runtime.draft, compiled=False)
        self.graphs: dict[tuple, ChainGraph] = {}
        self.cache: ModelCache | None = None
        if head_format not in HEAD_FORMATS:
            raise ValueError(f"MTP head format {head_format!r}: use one of {', '.join(HEAD_FORMATS)}")
        self.head_format = head_format
        self.lm_head, self.draft_to_target = None, None  # None: the target's LM head over its whole vocabulary
        if vocab is not None:
            vocab.check(target.config.vocab_size)
            self.draft_to_target = vocab.token_ids.to(self.device)
        if vocab is not None or head_format == "fp8":
            self.lm_head = _head_rows(target.lm_head, self.draft_to_target, head_format)

    @classmethod
    def from_target(cls, model_dir, target: CausalLM, dtype="auto", runtime: Runtime | None = None,
                    vocab: DraftVocab | None = None, head_format: str = "bf16") -> MTPDrafter:
        return cls(load_mtp(Path(model_dir), target, dtype), target, runtime, vocab=vocab, head_format=head_format)

    @property
    def head_weight(self) -> torch.Tensor | None:
        """The LM head rows every level reads (the draft vocabulary's or the FP8 copy, or the target's head)."""
        return (self.target.lm_head if self.lm_head is None else self.lm_head).weight

    def allocate(self, num_slots: int, max_seq_len: int) -> None:
        size = max_seq_len + FEED_BATCH  # a padded feed writes up to FEED_BATCH - 1 pads past the pairs
        c = self.cache
        if c is None or c.num_slots < num_slots or c.max_seq_len < size:
            self.graphs.clear()
            self.cache = None
            self.cache = ModelCache(self.config, num_slots, size, self.device, self.dtype)

    @torch.inference_mode()
    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec,
                noise: list[Noise] | None = None) -> list[DraftTree]:
        """noise (sampling requests): per slot None or its race noise (SamplingParams, rows [>= depth, target
        vocab]); then its drafts are its draft distribution's draws with that noise (spec_decode/coupling.py)."""
        noise = self._draft_noise(noise, spec.depth)
        if spec.kind == "chain" and all(len(self.pending_tokens[s]) < CHAIN_BLOCK for s in slots):
            rows = self._chain_step(slots, roots, spec.depth, noise)
            return [DraftTree.chain([root] + row) for root, row in zip(roots, rows)]
        h = self.feed(slots, roots)  # [n, H]: the MTP output at each root's pair
        if spec.kind == "chain":
            rows = self._chain(slots, h, spec.depth, noise)
            return [DraftTree.chain([root] + row) for root, row in zip(roots, rows)]
        noise = noise or [None] * len(slots)
        out = []
        for i, (slot, root) in enumerate(zip(slots, roots)):
            hidden = {0: h[i]}  # node -> MTP output (the hidden state its children pair with)
            out.append(grow(spec, root, lambda tree, frontier, s=slot, hd=hidden, e=noise[i]:
                            self._score(s, tree, frontier, hd, spec, e)))
        return out

    def _draft_noise(self, noise: list[Noise] | None, depth: int) -> list[Noise] | None:
        """The sampling requests' first `depth` noise rows over the draft vocabulary (a draft token's row entry is
        its target id's), or None when no request samples."""
        if noise is None or all(e is None for e in noise):
            return None
        ids = self.draft_to_target
        return [None if e is None else (e[0], e[1][:depth] if ids is None else e[1][:depth, ids]) for e in noise]

    # --- MTP forward ---------------------------------------------------------------------------------------

    def forward(self, meta: BatchMetadata, hidden: torch.Tensor) -> torch.Tensor:
        embeds = self.target.model.embed_tokens(meta.input_ids).to(self.dtype)
        return self.model(embeds, hidden.to(self.dtype), meta, self.cache)

    def feed(self, slots: list[int], roots: list[int]) -> torch.Tensor:
        """Feeds every request's pending pairs (its root last) into the MTP cache -> the outputs at the roots [n, H]."""
        tokens = [self.pending_tokens[s] + [root] for s, root in zip(slots, roots)]
        feats = []
        for s, t in zip(slots, tokens):
            f = self.pending_feats[s]
            assert f is not None and f.shape[0] == len(t), "MTP feature/token bookkeeping out of step"
            # the MTP pairs the target's FINAL-normed hidden state: the last layer's output through the final norm
            feats.append(self.target.model.norm(f.to(self.device, self.dtype)))
        out = [None] * len(slots)
        short = [i for i, t in enumerate(tokens) if len(t) <= FEED_BATCH]
        if short:
            h = self._feed_padded([slots[i] for i in short], [tokens[i] for i in short], [feats[i] for i in short])
            for j, i in enumerate(short):
                out[i] = h[j]
        for i in (i for i, t in enumerate(tokens) if len(t) > FEED_BATCH):
            for off in range(0, len(tokens[i]), FEED_CHUNK):
                h = self._feed_padded([slots[i]], [tokens[i][off:off + FEED_CHUNK]], [feats[i][off:off + FEED_CHUNK]])
            out[i] = h[0]
        for s, t in zip(slots, tokens):
            self.pending_tokens[s], self.pending_feats[s] = [], None
        return torch.stack(out)

    def _feed_padded(self, slots: list[int], tokens: list[list[int]], feats: list[torch.Tensor]) -> torch.Tensor:
        """One causal block per request at positions seen .. seen + len - 1, padded to the longest (pads after the
        real pairs) -> each request's output at its last real pair [n, H]; advances `seen`."""
        n, T, dev = len(slots), max(map(len, tokens)), self.device
        ids = torch.zeros(n, T, dtype=torch.long)
        hidden = torch.zeros(n, T, self.config.hidden_size, dtype=self.dtype, device=dev)
        for i, (t, f) in enumerate(zip(tokens, feats)):
            ids[i, :len(t)] = torch.tensor(t)
            hidden[i, :len(t)] = f
        start = [self.seen[s] for s in slots]
        meta = BatchMetadata.contiguous(ids.to(dev), torch.tensor(start, device=dev), torch.tensor(slots, device=dev),
                                        max(start))
        h = self.forward(meta, hidden)
        last = torch.tensor([len(t) - 1 for t in tokens], device=dev)
        for s, t in zip(slots, tokens):
            self.seen[s] += len(t)
        return h[torch.arange(n, device=dev), last]

    def _chain_step(self, slots: list[int], roots: list[int], depth: int,
                    noise: list[Noise] | None = None) -> list[list[int]]:
        """Feed and chain of every request in one device-only call (a graph replay where graphs are on): each
        request's pending block with its root, padded to a power of two W; one device-to-host copy back. noise:
        _draft_noise's rows (None: every request greedy)."""
        tokens = [self.pending_tokens[s] + [root] for s, root in zip(slots, roots)]
        n, W = len(slots), 1 << (max(map(len, tokens)) - 1).bit_length()
        host = torch.zeros(n * (W + 3), dtype=torch.long, pin_memory=self.on_gpu)
        ids, tail = host[:n * W].view(n, W), host[n * W:].view(3, n)
        feats = torch.zeros(n, W, self.config.hidden_size, dtype=self.dtype, device=self.device)
        for i, (s, t) in enumerate(zip(slots, tokens)):
            f = self.pending_feats[s]
            assert f is not None and f.shape[0] == len(t), "MTP feature/token bookkeeping out of step"
            ids[i, :len(t)] = torch.tensor(t)
            feats[i, :len(t)] = f
        tail.copy_(torch.tensor([[self.seen[s] for s in slots], list(map(len, tokens)), slots]))
        # a coupled step's graph is per sampling setting of each row (the filtering ops it captures)
        key = (n, depth, W) + (() if noise is None else tuple(map(filter_key, noise)))
        if self.use_graphs and (key in self.graphs or self._noise_fits(noise, depth)):
            graph = self.graphs.get(key)
            if graph is None:
                rows = None if noise is None else static_noise(noise, depth, self.head_weight.shape[0], self.device)
                static = None if noise is None else [None if e is None else (e[0], rows[b]) for b, e in
                                                     enumerate(noise)]
                # capture runs the step for real: its K/V writes are the ones the replay then repeats
                max_len = self.cache.max_seq_len  # a replay cannot follow a host bound
                graph = self.graphs[key] = ChainGraph(lambda x, f: self._chain_block(x, f, depth, max_len, static),
                                                      host.to(self.device), feats, noise=rows)
            if noise is not None:
                fill_noise(graph.noise, noise)
            out = graph.replay(host, feats)
        else:
            out = self._chain_block(host.to(self.device), feats, depth, max(self.seen[s] for s in slots) + W + depth,
                                    noise)
        for s, t in zip(slots, tokens):
            self.seen[s] += len(t)
            self.pending_tokens[s], self.pending_feats[s] = [], None
        return out.tolist()

    def _noise_fits(self, noise: list[Noise] | None, depth: int) -> bool:
        """Whether one more coupled graph's static noise rows fit (coupling.graph_noise_fits; a greedy step holds
        none)."""
        return noise is None or graph_noise_fits(self.graphs, noise, depth, self.head_weight.shape[0])

    def _chain_block(self, inputs: torch.Tensor, feats: torch.Tensor, depth: int, max_len: int,
                     noise: list[Noise] | None = None) -> torch.Tensor:
        """Device only (capturable): inputs [n * (W + 3)] (block tokens [n, W], then seen, block length and slot
        [n] each: contiguous views, as the kernels index them) and the blocks' last-layer features [n, W, H] -> the
        chains [n, depth] (greedy, or a sampling row's coupled draws: noise as _levels). The block sits at positions
        seen .. seen + W - 1 (its pads past the length are scratch the levels and the next feed overwrite); level
        d >= 1 pairs the previous level's output with its token at seen + length - 1 + d."""
        n, W = feats.shape[:2]
        ids = inputs[:n * W].view(n, W)
        seen, length, slots = inputs[n * W:].view(3, n)
        # the MTP pairs the target's FINAL-normed hidden state: the last layer's output through the final norm
        hidden = self.target.model.norm(feats, self.paths)
        h = self.forward(BatchMetadata.contiguous(ids, seen, slots, max_len, self.paths), hidden)
        h = h[torch.arange(n, device=h.device), length - 1]
        return self._levels(h, seen + length - 1, slots, depth, max_len, self.paths, noise)

    def _levels(self, h: torch.Tensor, last: torch.Tensor, slots: torch.Tensor, depth: int, max_len: int,
                paths: KernelPaths, noise: list[Noise] | None = None) -> torch.Tensor:
        """h [n, H]: the MTP outputs at each request's last fed pair (position `last` [n]) -> the chains [n, depth]
        (device only): level d >= 1 pairs the previous level's output with its token at last + d, where its K/V are
        stored too. max_len: a bound on every level's prefix. noise: per request None (greedy) or its params and
        noise rows [depth, draft vocab]; None: every request greedy."""
        tok = self._pick(h, paths, 0, noise)
        out = [tok]
        for level in range(1, depth):
            meta = BatchMetadata.contiguous(tok[:, None], last + level, slots, max_len, paths)
            h = self.forward(meta, h[:, None])[:, 0]
            tok = self._pick(h, paths, level, noise)
            out.append(tok)
        return torch.stack(out, dim=1)

    def _pick(self, h: torch.Tensor, paths: KernelPaths, level: int, noise: list[Noise] | None) -> torch.Tensor:
        """The target ids of one level's tokens [n] (device only): a greedy row's head argmax, a sampling row's
        race draw of its filtered draft distribution with its noise row of this level."""
        if noise is None:
            return self._greedy(h, paths)
        logits = self._head(h, paths)
        tok = torch.stack([logits[b].argmax(-1) if e is None else
                           coupled_row_scores(logits[b], e[0], e[1][level]).argmax(-1) for b, e in enumerate(noise)])
        return self._to_target(tok)

    def _head(self, h: torch.Tensor, paths: KernelPaths = PLAIN) -> torch.Tensor:
        return self.target.logits(h, paths) if self.lm_head is None else self.lm_head(h, paths)

    def _to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.draft_to_target is None else self.draft_to_target[ids]

    def _greedy(self, h: torch.Tensor, paths: KernelPaths) -> torch.Tensor:
        """The target ids of the head's argmax (device only)."""
        return self._to_target(self._head(h, paths).argmax(-1))

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the DRAFT vocabulary (fp32); map indices with `draft_to_target` where it is not None."""
        return self._head(h).float()

    def draft_probs(self, h: torch.Tensor, params: SamplingParams | None = None) -> torch.Tensor:
        """q [..., target vocab] (fp32): the draft distribution over the target's ids, after params' temperature,
        top-k and top-p (None: the plain softmax); zero outside the draft vocabulary."""
        logits = self.draft_logits(h)
        q = torch.softmax(logits, dim=-1) if params is None else filtered_probs(logits, params)
        if self.draft_to_target is None:
            return q
        full = q.new_zeros(*q.shape[:-1], self.target.config.vocab_size)
        return full.index_copy_(-1, self.draft_to_target, q)

    def _chain(self, slots: list[int], h: torch.Tensor, depth: int, noise: list[Noise] | None = None
               ) -> list[list[int]]:
        """Chains of `depth` tokens for every request after an eager feed, one batched MTP step per level."""
        dev = self.device
        seen = torch.tensor([self.seen[s] for s in slots], device=dev)
        bound = max(self.seen[s] for s in slots) + depth - 1
        return self._levels(h, seen - 1, torch.tensor(slots, device=dev), depth, bound, PLAIN, noise).tolist()

    def _score(self, slot: int, tree: DraftTree, frontier: list[int], hidden: dict, spec: TreeSpec,
               noise: Noise = None):
        """Top candidates (target ids, log-probs, or with noise the coupled scores at the logit error) after each
        frontier node of the partial tree."""
        if frontier != [0]:
            hs = self._tree_hidden(slot, tree, hidden)
            for i in range(1, tree.num_nodes):
                hidden[i] = hs[i - 1]
        logits = self.draft_logits(torch.stack([hidden[i] for i in frontier]))
        if noise is None:
            logp = torch.log_softmax(logits, dim=-1)
        else:  # a child at depth d takes noise row d - 1: its parent's depth
            logp = coupled_row_scores(logits, noise[0], noise[1][[tree.depths[f] for f in frontier]],
                                      self.logit_error)
        top = logp.topk(min(max(max(spec.branching, default=1), spec.top_k), logp.shape[-1]), dim=-1)
        return [(t.tolist(), v.tolist()) for t, v in zip(self._to_target(top.indices), top.values)]


def _head_rows(head: Linear, ids: torch.Tensor | None, head_format: str = "bf16") -> Linear | Fp8Linear:
    """A layer over the rows `ids` (None: all) of the target's LM head, a contiguous copy (one read of N rows per
    level) in bf16 or as FP8."""
    weight = head.weight if head.weight is not None else w12n.decode(head.w12n)  # w12n_only dropped the bf16 copy
    weight = weight.detach() if ids is None else weight.detach()[ids].contiguous()
    if head_format == "fp8":
        return Fp8Linear.quantized(weight)
    with torch.device("meta"):
        rows = Linear(head.in_features, weight.shape[0], bias=False)
    rows.weight = torch.nn.Parameter(weight, requires_grad=False)
    return rows
