"""SpecEngine: continuous batching with batch-aware speculation. Requests join and leave every step.

A client adds requests (add_request), runs steps (step) and reads each request's new tokens from the step's
outputs; abort drops one at once. Offline `generate` is such a client. One step is a few named calls:
schedule (the Scheduler admits waiting requests into free slots and picks prefill chunks), budget (how many
draft nodes each decoding request verifies: engine/budget.py, from the verify cost curve and each request's
recent acceptance), propose (the drafter's trees, cut to those budgets), verify (one target forward over every
tree and the prefill chunks riding along), accept (longest agreeing path + bonus token; the step's one host
sync), commit (keep the accepted nodes' K/V and recurrent state, advance the drafter) and emit (append tokens,
stop, free finished slots). Output equals greedy autoregressive output of the same runtime, token for token,
whatever joins, leaves or is preempted around a request; a sampling request's equals plain sampling with its seed
(its own noise stream: the raced rule of spec_decode/rejection.py, and a coupled drafter drafts with the same
noise). A step with a sampling request hands accept the verify's logits (from a verify graph of the logits where
the greedy step would replay one). With no drafter every request decodes one token per step: autoregressive continuous batching on the same engine.

With verify CUDA graphs a pure verify step (no prefill chunk) is padded to a bucket of batch size (rows on a
scratch slot) and width (powers of two), one graph per (batch, width) bucket; a step with prefill chunks runs
eagerly. Each component's time is charged to the step's requests (SpecStats.seconds) without stalling the GPU:
CUDA events at the component boundaries, read after a later step's sync (see _Timer).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from functools import cached_property
from itertools import count

import torch

from specpilot.engine.budget import AcceptanceTracker, node_gains, split_budget
from specpilot.engine.cost_curve import VerifyCostCurve, curve_for
from specpilot.engine.detokenizer import decode_text
from specpilot.engine.generator import GenerationResult, append_token, stop_detokenizer
from specpilot.engine.request import Request, RequestOutput, Status
from specpilot.engine.scheduler import Chunk, Scheduler, SchedulerConfig, StepPlan
from specpilot.engine.stats import SpecStats
from specpilot.layers.metadata import BatchMetadata
from specpilot.runtime.runner import ModelRunner, inference
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.drafters.base import Drafter
from specpilot.spec_decode.rejection import accept_raced, step_tokens
from specpilot.spec_decode.tree import DraftTree, TreeSpec, tree_layout
from specpilot.spec_decode.verify import Acceptance, accept_greedy, host_tree_metadata

DEFAULT_MODEL_LEN = 4096  # tokens per slot when SchedulerConfig.max_model_len is None (more if a request needs)
FINISHED_KEPT = 4096
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
DRAFT_SAMPLES = 9  # recent draft times per depth: their lower median ignores a one-off (a proposal graph captured)
SKIPPED_DRAFT_DECAY = 0.8  # per step without a proposal (see _calibrate)


class SpecEngine:
    def __init__(self, runner: ModelRunner, drafter: Drafter | None, tree: TreeSpec | None = None,
                 eos_ids: tuple[int, ...] = (), tokenizer=None, scheduler: SchedulerConfig | None = None,
                 cost: VerifyCostCurve | None = None):
        """drafter None: plain decoding (one token per request per step). cost: the verify cost curve the budget
        reads (default: the curve measured on this GPU for this model shape, else its roofline; rescaled online
        by the measured verify times)."""
        if drafter is not None and tree is None:
            raise ValueError("a drafter needs a tree spec (--tree chain:D, static:... or dynamic:...)")
        self.runner, self.drafter = runner, drafter
        depth = getattr(drafter, "max_depth", None)
        self.tree = tree.capped(depth) if depth else tree
        self.eos_ids, self.tokenizer = set(eos_ids), tokenizer
        self.config = scheduler or SchedulerConfig()
        self.cost = cost or curve_for(runner.model, runner.runtime.weight_format)
        # a drafter whose cost grows with the levels it drafts (a draft model run level by level) is asked for no
        # more levels than the deepest budget; a block drafter (DFlash) proposes its whole block at one cost
        self.sequential = getattr(drafter, "sequential", True)
        self.skippable = hasattr(drafter, "skip")
        # a drafter that rates its own nodes (DSpark's confidence head) sets the adaptive budget of chains and
        # static trees from those estimates, after proposing
        self._reads_confidence = (bool(getattr(drafter, "rates_nodes", False)) and self.config.adaptive
                                  and self.tree is not None and self.tree.kind != "dynamic")
        self.scheduler: Scheduler | None = None  # built (and the caches sized) at the first step
        self.slot_len = 0  # tokens a slot holds (prompt + output), the tree's nodes aside
        self.requests: list[Request] = []  # the last generate()'s, in prompt order
        # per step: batch, draft nodes per request, prefill tokens, the verify seconds predicted, and once measured
        # (a later step's sync) the seconds per component
        self.step_log: deque[dict] = deque(maxlen=1 << 16)
        self._pending: list[Request] = []  # added before the caches were sized
        self._finished: OrderedDict[str, Request] = OrderedDict()  # the last FINISHED_KEPT, for stats()
        self._ids = count()
        self._timer = _Timer(runner.device)
        # called once a step's verify is launched, before the step waits for it: a server hands out the last
        # step's tokens there, so that its threads' Python work runs while the GPU computes
        self.while_verifying: Callable[[], None] | None = None
        self._verify_scale = 1.0  # measured / predicted verify seconds (EMA)
        # levels proposed -> the last DRAFT_SAMPLES measured draft seconds of a step (the budget reads their median)
        self._draft_s: dict[int, deque[float]] = {}
        self._snapshot, self._tree_commit, self._features, self._width = None, False, None, 1

    # ---- client API -------------------------------------------------------------------------------------------

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    priority: int = 0) -> str:
        if not prompt_ids:
            raise ValueError("every prompt needs at least one token")
        need = len(prompt_ids) + params.max_new_tokens
        limit = self.runner.config.max_position_embeddings
        if need > limit:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens + max_new_tokens={params.max_new_tokens} exceeds "
                             f"the model's context of {limit} tokens; shorten the prompt or lower max_new_tokens")
        if self.scheduler is not None and need + 1 > self.slot_len:
            self._resize_when_idle(need)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        req = Request(rid, list(prompt_ids), params, time.perf_counter(), GenerationResult(prompt_len=len(prompt_ids)),
                      SpecStats(), stop_detokenizer(self.tokenizer, params), priority,
                      AcceptanceTracker(self.tree.depth) if self.drafter is not None else None)
        if self.scheduler is None:
            if any(r.request_id == rid for r in self._pending):
                raise ValueError(f"request id {rid!r} is already in use; pass a fresh request_id")
            self._pending.append(req)
        else:
            self.scheduler.add(req)
        return rid

    def abort(self, request_id: str) -> None:
        """Drops the request now (waiting or running); its slot is free for the next step."""
        for req in self._pending:
            if req.request_id == request_id:
                self._pending.remove(req)
                req.status, req.result.finish_reason = Status.FINISHED, "abort"
                self._keep_finished(req)
                return
        req = self.scheduler.by_id.get(request_id) if self.scheduler is not None else None
        if req is None:
            raise KeyError(f"no unfinished request {request_id!r}")
        req.result.finish_reason = "abort"
        self._finish(req)

    def has_unfinished(self) -> bool:
        return bool(self._pending) or (self.scheduler is not None and self.scheduler.has_unfinished())

    def stats(self, request_id: str) -> SpecStats:
        """The request's SpecStats: unfinished, or among the last FINISHED_KEPT finished."""
        req = self._finished.get(request_id) or next((r for r in self._pending if r.request_id == request_id), None)
        if req is None and self.scheduler is not None:
            req = self.scheduler.by_id.get(request_id)
        if req is None:
            raise KeyError(f"no request {request_id!r}")
        return req.stats

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None) -> list[tuple[GenerationResult, SpecStats]]:
        """Every prompt as a request, stepped until all finish. on_token(prompt index, token id) as tokens arrive."""
        if not prompts:
            raise ValueError("no prompts to generate from")
        start = time.perf_counter()
        ids = [self.add_request(p, params) for p in prompts]
        reqs = {r.request_id: r for r in self._pending}
        reqs.update(self.scheduler.by_id if self.scheduler is not None else {})
        self.requests = [reqs[i] for i in ids]
        index = {rid: i for i, rid in enumerate(ids)}
        while self.has_unfinished():
            for out in self.step():
                if on_token is not None:
                    for tok in out.new_token_ids:
                        on_token(index[out.request_id], tok)
        self._timer.charge()
        total = time.perf_counter() - start
        for r in self.requests:
            r.result.total_s = total
            if self.tokenizer is not None and r.result.text is None:
                r.result.text = decode_text(self.tokenizer, r.result.token_ids)
        return [(r.result, r.stats) for r in self.requests]

    # ---- the step ---------------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        self._ensure_slots()
        plan = self.schedule()
        if not plan.decoding and not plan.chunks:
            return []
        active = plan.decoding
        record = {"batch": len(active), "prefill": sum(len(c.tokens) for c in plan.chunks)}
        self.step_log.append(record)
        self._timer.start(active, record)
        if self._reads_confidence:
            # the drafter rates its own nodes: it proposes whole, then the budget cuts by its estimates
            trees = self._timer.run("draft", self.propose, active, [self._full_nodes()] * len(active))
            record["nodes"] = nodes = self.budget(active, plan.chunks, trees)
            trees = _cut(trees, nodes)
        else:
            record["nodes"] = nodes = self.budget(active, plan.chunks)
            trees = None
        self._note_prediction(active, nodes, plan.chunks)
        if trees is None:
            trees = self._timer.run("draft", self.propose, active, nodes)
        tokens = self._timer.run("verify", self.verify, active, trees, plan.chunks)
        if self.while_verifying is not None:
            self.while_verifying()
        accepted, firsts = self._timer.run("accept", self.accept, trees, tokens, plan.chunks, active)
        self._calibrate(self._timer.charge(keep_last=True))
        self._timer.run("commit", self.commit, active, trees, accepted, plan.chunks)
        return self._timer.run("other", self.emit, plan, trees, accepted, firsts)

    def schedule(self) -> StepPlan:
        plan = self.scheduler.schedule()
        if plan.admitted:
            self.runner.cache.reset(torch.tensor([r.slot for r in plan.admitted], device=self.runner.device))
        return plan

    def budget(self, active: list[Request], chunks: list[Chunk] = (), trees: list[DraftTree] | None = None
               ) -> list[int]:
        """Draft nodes per decoding request (0: plain decoding); the prefill chunks riding along cost the forward
        time too. trees: the step's proposals, when the drafter rates them (Drafter.node_acceptance): each node's
        gain is then its estimate, in place of the request's recent acceptance."""
        if self.drafter is None or not active:
            nodes = [0] * len(active)
        elif not self.config.adaptive or self.tree.kind == "dynamic":
            nodes = [self._full_nodes()] * len(active)
        else:
            if trees is not None:
                gains = [list(self.drafter.node_acceptance(r.slot))[1:t.num_nodes] for r, t in zip(active, trees)]
            else:
                shape = self._shape
                gains = [node_gains(r.tracker, shape) for r in active]
            plan = split_budget(gains, _Scaled(self.cost, self._verify_scale), [r.committed for r in active],
                                draft_seconds=self._draft_seconds, extra_tokens=sum(len(c.tokens) for c in chunks))
            nodes = list(plan.nodes)
        return nodes

    def propose(self, active: list[Request], nodes: list[int]) -> list[DraftTree]:
        """Every decoding request's tree, cut to its node budget (the first nodes in topological order, which
        keeps every kept node's ancestors). The drafter proposes for every request, also those at 0 nodes (a
        drafter's state follows every step's root), unless every budget is 0 and the drafter can skip a step
        (Drafter.skip): then no proposal runs."""
        if not active:
            return []
        roots = [r.root for r in active]
        if self.drafter is None:
            return [DraftTree((root,), (-1,)) for root in roots]
        if not any(nodes) and self.skippable:
            self.drafter.skip([r.slot for r in active], roots)
            return [DraftTree((root,), (-1,)) for root in roots]
        spec = self.tree.capped(max(1, self._depth_for(max(nodes)))) if self.sequential else self.tree
        if getattr(self.drafter, "coupled", False) and _sampling(active):
            # a sampling request's drafts are its own draft distribution's draws with the noise the target's draws
            # at the same positions use (spec_decode/coupling.py)
            vocab, dev = self.runner.config.vocab_size, self.runner.device
            noise = [None if r.params.greedy else (r.params, r.noise_rows(spec.depth, vocab, dev)) for r in active]
            trees = self.drafter.propose([r.slot for r in active], roots, spec, noise=noise)
        else:
            trees = self.drafter.propose([r.slot for r in active], roots, spec)
        room = self.runner.cache.max_seq_len
        out = _cut(trees, nodes)
        for r, t in zip(active, out):
            assert r.committed + t.num_nodes <= room, "draft tree larger than the cache room left"
        return out

    @inference
    def verify(self, active: list[Request], trees: list[DraftTree], chunks: list[Chunk] = ()) -> torch.Tensor:
        """One target forward over all trees and prefill chunks -> greedy tokens on device: [rows, T] for a pure
        verify step, else flat (runner.mixed); its logits instead when a request of the step samples (accept races
        them); keeps the drafter's features."""
        runner, layers = self.runner, tuple(self.drafter.target_layers) if self.drafter is not None else ()
        hybrid = runner.config.is_hybrid
        logits = _sampling(active) or _sampling([c.request for c in chunks if c.last])
        host, self._snapshot, self._tree_commit = None, None, False
        if trees:
            host = self._host_block(trees, [r.slot for r in active], [r.committed for r in active],
                                    runner.runtime.verify_graphs and not chunks)
        if host is not None and not chunks:
            meta = runner.verify_inputs(host, layers, logits)
            self._before_verify(meta, hybrid)
            out, self._features = runner.verify(meta, layers, logits)
            return out
        meta = host.to(runner.device, runner.runtime.verify) if host is not None else None
        if meta is not None:
            self._before_verify(meta, hybrid)
        parts = [self._chunk_meta(c) for c in chunks]
        tokens, features = runner.mixed(meta, parts, layers, logits)
        self._features = features[0] if features is not None and meta is not None else None
        self._chunk_features = features[-len(chunks):] if features is not None else [None] * len(chunks)
        return tokens

    def _host_block(self, trees: list[DraftTree], slots: list[int], bases: list[int], bucketed: bool):
        """The verify block's packed host metadata; bucketed (a captured graph replays it): the batch padded to a
        bucket with rows that verify a lone root on the scratch slot, the width to a power of two."""
        runner = self.runner
        rows, width = list(trees), None
        if bucketed:
            pad = _bucket(len(rows), BATCH_BUCKETS) - len(rows)
            rows += [DraftTree((0,), (-1,))] * pad
            slots, bases = slots + [self.scheduler.num_slots] * pad, bases + [0] * pad
            width = min(_pow2(max(t.num_nodes for t in trees)), self._full_nodes() + 1)
        # a block of lone roots (plain decoding) takes the recurrent decode path even where chains fold
        fold = (runner.config.is_hybrid and runner.runtime.fold_hybrid_chains
                and max(width or 1, *(t.num_nodes for t in trees)) > 1)
        return host_tree_metadata(rows, bases, slots, runner.device, width, chains_as_trees=fold,
                                  alloc=runner.staging.take)

    def warmup(self) -> dict:
        """Captures the verify CUDA graph of every (batch, width) bucket a step of this engine can take, before any
        request runs, so that no step captures one in flight: batches up to the slot count, widths up to the tree
        spec's full tree. Returns the graphs captured and the device memory they reserved (nothing without verify
        graphs). The rows verify dummy trees in free slots, which admission resets."""
        self._ensure_slots()  # outside inference mode: the caches outlive it
        if not self.runner.runtime.verify_graphs or self.scheduler.running:
            return {"graphs": 0, "bytes": 0}
        return self._capture_buckets()

    @inference
    def _capture_buckets(self) -> dict:
        runner = self.runner
        layers = tuple(self.drafter.target_layers) if self.drafter is not None else ()
        before, count = len(runner.verify_graphs), _reserved(runner.device)
        full, slots = self._full_nodes() + 1, self.scheduler.num_slots
        batches = sorted({_bucket(b, BATCH_BUCKETS) for b in range(1, slots + 1)})
        for width in sorted({min(_pow2(n), full) for n in range(1, full + 1)}):
            for tree in self._warmup_trees(width):
                for b in batches:
                    n = min(b, slots)
                    host = self._host_block([tree] * n, list(range(n)), [0] * n, True)
                    greedy, _ = runner.verify(runner.verify_inputs(host, layers), layers)
                    runner.staging.read_tokens(greedy)  # a sync that frees the staged metadata buffer
        runner.cache.tree_stash.clear()
        return {"graphs": len(runner.verify_graphs) - before, "bytes": _reserved(runner.device) - count}

    def _warmup_trees(self, width: int) -> list[DraftTree]:
        """Dummy trees of `width` nodes of the shapes this engine's steps verify: a chain spec's chains, a static
        spec's first nodes, and for a dynamic spec both a chain and a branching tree (its graphs differ)."""
        chain = DraftTree((0,) * width, tuple(range(-1, width - 1)))
        if self.tree is None or self.tree.kind == "chain":
            return [chain]
        if self.tree.kind == "static":
            return [DraftTree((0,) * width, _static_parents(self.tree.branching)[:width])]
        branching = DraftTree((0,) * width, tuple((i - 1) // 2 for i in range(width)))
        return [chain, branching] if width > 2 else [chain]

    def _before_verify(self, meta: BatchMetadata, hybrid: bool) -> None:
        # replayed chains update recurrent state in place (snapshot to roll back, unless no row can reject:
        # width 1); trees (and folded chains) leave it and stash their terms
        self._width = meta.input_ids.shape[1]
        chain = meta.block_mask is None
        self._snapshot = self.runner.cache.snapshot(meta.slots) if hybrid and chain and self._width > 1 else None
        self._tree_commit = hybrid and not chain

    def _chunk_meta(self, chunk: Chunk) -> BatchMetadata:
        dev = self.runner.device
        ids = torch.tensor([chunk.tokens], dtype=torch.long, device=dev)
        prefix = torch.tensor([chunk.start], dtype=torch.long, device=dev)
        slots = torch.tensor([chunk.request.slot], dtype=torch.long, device=dev)
        return BatchMetadata.contiguous(ids, prefix, slots, chunk.start)

    def rewind(self, rows: list[int] | None = None) -> None:
        """Puts back the recurrent state that the last verify advanced in place (a replayed chain), for the given
        rows of its batch (default: all); after a verify that left the state (trees, folded chains) nothing to do."""
        if self._snapshot is not None:
            self.runner.cache.restore(self._snapshot, rows)

    def accept(self, trees: list[DraftTree], tokens: torch.Tensor, chunks: list[Chunk] = (),
               active: list[Request] = ()):
        """The step's one sync -> (each tree's Acceptance, each chunk's first token after its last position).
        tokens: verify's greedy tokens, or its logits (floating point: [rows, T, vocab] for a pure verify step, else
        flat [B * T + chunks, vocab]) with `active`, the trees' requests: then a sampling request's nodes are raced
        with its own noise rows (spec_decode/rejection.py), a greedy one's take the argmax, and both walk the same."""
        if tokens.is_floating_point():
            if len(active) != len(trees):
                raise ValueError("accept needs the trees' requests to sample from logits")
            vocab, T = tokens.shape[-1], tokens.shape[1] if tokens.dim() == 3 else self._width
            flat = tokens.reshape(-1, vocab)
            lone = DraftTree((0,), (-1,))  # a chunk's first token is a lone root's draw
            nodes = list(trees) + [lone] * len(chunks)
            reqs = list(active) + [c.request for c in chunks]
            rows = [flat[i * T:(i + 1) * T] for i in range(len(trees))]
            rows += [flat[len(trees) * T + i:][:1] for i in range(len(chunks))]
            sampled = [not r.params.greedy and (i < len(trees) or chunks[i - len(trees)].last)
                       for i, r in enumerate(reqs)]
            params = [r.params if s else SamplingParams() for r, s in zip(reqs, sampled)]
            noise = [r.noise_rows(max(t.depths) + 1, vocab, flat.device) if s else None
                     for r, t, s in zip(reqs, nodes, sampled)]
            host = self.runner.staging.read_tokens(torch.cat(step_tokens(nodes, rows, params, noise)))
            split, at = [], 0
            for t in nodes:
                split.append(host[at:at + t.num_nodes])
                at += t.num_nodes
            return accept_raced(trees, split[:len(trees)]), [s[0] for s in split[len(trees):]]
        host = self.runner.staging.read_tokens(tokens)  # also frees verify's staged metadata buffer
        if not chunks:
            return accept_greedy(trees, host[:len(trees)]), []
        T = self._width
        rows = [host[i * T:(i + 1) * T] for i in range(len(trees))]
        return accept_greedy(trees, rows), host[len(trees) * T:]

    @inference
    def commit(self, active: list[Request], trees: list[DraftTree], accepted: list[Acceptance],
               chunks: list[Chunk] = ()) -> None:
        if active:
            self.runner.cache.commit([r.slot for r in active], [r.committed for r in active],
                                     [acc.path for acc in accepted], fold=self._tree_commit)
            if self.drafter is not None:
                feats = self._paths_features(accepted)
                for r, acc, f in zip(active, accepted, feats):
                    self.drafter.commit(r.slot, list(acc.tokens[:-1]), f)
            if self._snapshot is not None:
                self._replay_recurrent(active, trees, accepted, self._width)
            for r, acc in zip(active, accepted):
                r.committed += len(acc.path)
        for i, c in enumerate(chunks):
            r = c.request
            r.committed += len(c.tokens)
            if self._chunk_features[i] is not None:
                r.features.append(self._chunk_features[i][0].clone())
            if c.last and self.drafter is not None:
                feats = torch.cat(r.features) if r.features else None
                self.drafter.start(r.slot, r.sequence, feats)
                r.features.clear()

    def _paths_features(self, accepted: list[Acceptance]) -> list[torch.Tensor | None]:
        """Each row's features along its kept path, gathered for all rows in one op (a copy: a verify graph's
        features are a static buffer that the next replay overwrites)."""
        feats = self._features
        if feats is None:
            return [None] * len(accepted)
        T = feats.shape[1]
        index = [row * T + node for row, acc in enumerate(accepted) for node in acc.path]
        host = torch.tensor(index, dtype=torch.long, pin_memory=feats.is_cuda)
        kept = feats.flatten(0, 1).index_select(0, host.to(feats.device, non_blocking=True))
        return list(kept.split([len(acc.path) for acc in accepted]))

    def _replay_recurrent(self, active, trees, accepted, width: int) -> None:
        """Chains only (trees fold, see commit): the recurrent layers absorbed the whole verify block, so where
        fewer nodes were kept, restore the state and run the kept chain again (exact)."""
        rows = [i for i, acc in enumerate(accepted) if len(acc.path) < width]
        if not rows:
            return
        self.rewind(rows)
        for i in rows:
            r, tree, acc = active[i], trees[i], accepted[i]
            self.runner.extend(r.slot, [tree.tokens[j] for j in acc.path], r.committed)

    def emit(self, plan: StepPlan, trees, accepted: list[Acceptance], firsts: list[int]) -> list[RequestOutput]:
        now = time.perf_counter()  # a step's tokens all arrive at once
        touched = []
        for r, tree, acc in zip(plan.decoding, trees, accepted):
            before = len(r.result.token_ids)
            self._emit_tokens(r, acc.tokens, now)
            r.stats.add(tree, acc, len(r.result.token_ids) - before)
            if r.tracker is not None:
                r.tracker.update(max(tree.depths), acc.num_accepted)
            touched.append(r)
        for c, first in zip(plan.chunks, firsts):
            r = c.request
            if not c.last:
                continue
            r.status = Status.DECODING
            if r.result.token_ids:  # resumed after a preemption: its last emitted token is the root again
                r.root = r.result.token_ids[-1]
                continue
            r.stats.seconds["start"] += now - r.arrival
            self._emit_tokens(r, [first], now)
            touched.append(r)
        outputs = []
        for r in touched:
            finished = r.status is Status.FINISHED
            outputs.append(RequestOutput(r.request_id, r.new_tokens, finished,
                                         r.result.finish_reason if finished else None))
            r.new_tokens = []
        return outputs

    def _emit_tokens(self, r: Request, tokens, now: float) -> None:
        for tok in tokens:
            r.new_tokens.append(tok)
            if append_token(r.result, tok, r.params, self.eos_ids, r.detok, now - r.arrival):
                self._finish(r)
                return
        r.root = tokens[-1]

    def _finish(self, req: Request) -> None:
        self.scheduler.finish(req)
        self._keep_finished(req)

    def _keep_finished(self, req: Request) -> None:
        self._finished[req.request_id] = req
        while len(self._finished) > FINISHED_KEPT:
            self._finished.popitem(last=False)

    # ---- sizing and the budget's inputs -----------------------------------------------------------------------

    def _full_nodes(self) -> int:
        return self.tree.max_tree_nodes - 1 if self.tree is not None else 0

    @cached_property
    def _shape(self):
        """What node_gains reads for this tree spec: a chain's depth, or a static tree's layout."""
        if self.tree.kind == "chain":
            return self.tree.depth
        return tree_layout(_static_parents(self.tree.branching))

    def _depth_for(self, nodes: int) -> int:
        """The levels a tree spec needs so that its first `nodes` draft nodes exist."""
        if self.tree.kind == "chain":
            return nodes
        if self.tree.kind == "static":
            return max(self._shape.depths[:nodes + 1])
        return self.tree.depth

    def _ensure_slots(self) -> None:
        """At the first step (and after an idle resize): the slots' length and count, the caches allocated (one
        extra scratch slot for padded verify rows), the requests added so far handed to the scheduler."""
        if self.scheduler is not None:
            return
        longest = max((len(r.prompt) + r.params.max_new_tokens for r in self._pending), default=1)
        default = min(self.runner.config.max_position_embeddings, DEFAULT_MODEL_LEN)
        self.slot_len = max(self.config.max_model_len or default, longest) + 1
        extra = self._full_nodes() + 1
        num_slots = min(self.config.max_num_seqs, self._slots_in_memory(self.slot_len + extra))
        self.runner.allocate(num_slots + 1, self.slot_len + extra)
        if self.drafter is not None:
            self.drafter.allocate(num_slots + 1, self.slot_len + self.tree.max_grown_nodes)
        self.scheduler = Scheduler(self.config, num_slots)
        for req in self._pending:
            self.scheduler.add(req)
        self._pending = []

    def _resize_when_idle(self, need: int) -> None:
        """A request longer than a slot: with nothing running, the caches are sized again at the next step (the
        waiting requests kept); else the request cannot join."""
        if self.scheduler.running:
            raise ValueError(f"a prompt + max_new_tokens of {need} tokens exceeds the engine's slot of "
                             f"{self.slot_len - 1} tokens while requests run; raise max_model_len")
        self._pending = list(self.scheduler.waiting)
        self.scheduler = None

    def _note_prediction(self, active: list[Request], nodes: list[int], chunks: list[Chunk]) -> None:
        """What the cost curve predicts for this step's verify forward, for _calibrate to compare with the
        measurement."""
        info = self.step_log[-1]
        tokens = len(active) + sum(nodes) + sum(len(c.tokens) for c in chunks)
        context = sum(r.committed for r in active) / len(active) if active else 0
        info["predicted"] = float(self.cost.seconds(tokens, max(len(active), 1), context))
        if self.drafter is not None and active and (any(nodes) or not self.skippable):
            info["levels"] = max(1, self._depth_for(max(nodes))) if self.sequential else self.tree.depth

    def _slots_in_memory(self, length: int) -> int:
        """How many slots of `length` tokens the target's cache (and a drafter model's, when it has one) fit in
        memory_fraction of the device memory free now (CUDA; unbounded elsewhere)."""
        if self.runner.device.type != "cuda":
            return self.config.max_num_seqs
        per_slot = cache_bytes_per_slot(self.runner.config, length, self.runner.dtype)
        draft_cfg = getattr(getattr(self.drafter, "model", None), "config", None)
        if draft_cfg is not None and hasattr(draft_cfg, "num_attention_layers"):
            per_slot += cache_bytes_per_slot(draft_cfg, length, self.runner.dtype)
        held = self.runner.cache.nbytes() if self.runner.cache is not None else 0
        free = torch.cuda.mem_get_info(self.runner.device)[0] + held
        slots = int(free * self.config.memory_fraction // per_slot) - 1  # the scratch slot
        if slots < 1:
            raise ValueError(f"one request of {length} tokens needs {per_slot / 2**30:.2f} GiB of cache, more than "
                             f"the {free / 2**30:.2f} GiB free: lower max_model_len")
        return slots

    def _calibrate(self, charged: list[tuple[dict, dict]]) -> None:
        """Measured component times of finished steps rescale the cost curve and the draft cost the budget reads."""
        for info, seconds in charged:
            predicted = info.get("predicted")
            if predicted:
                self._verify_scale = _follow(self._verify_scale, seconds["verify"] / predicted)
            depth = info.get("levels")
            if depth:
                # seeded with a free proposal: while samples are few, the lower median is the cheaper one, so the
                # first proposal (which may capture a graph) cannot switch speculation off alone
                self._draft_s.setdefault(depth, deque([0.0], maxlen=DRAFT_SAMPLES)).append(seconds["draft"])
            elif self.skippable and info.get("batch"):
                # a skipped proposal measures nothing: the estimate fades, so that a cost once overestimated (a
                # compile, a capture, a slow moment) cannot keep speculation off for good
                for d, samples in self._draft_s.items():
                    self._draft_s[d] = deque((x * SKIPPED_DRAFT_DECAY for x in samples), maxlen=DRAFT_SAMPLES)

    def _draft_seconds(self, depth: int) -> float:
        """The drafter's measured cost of a step proposing `depth` levels (the nearest depth measured); a block
        drafter's every step costs one proposal. A drafter that cannot skip a step proposes at least one level even
        when every budget is 0 (propose), so depth 0 costs what depth 1 does (split_budget counts no drafting
        at depth 0: the budget is then exact only for a skippable drafter)."""
        if not self._draft_s:
            return 0.0
        depth = max(depth, 1) if self.sequential else self.tree.depth
        samples = sorted(self._draft_s[min(self._draft_s, key=lambda d: (abs(d - depth), d))])
        return samples[(len(samples) - 1) // 2]


def _cut(trees: list[DraftTree], nodes: list[int]) -> list[DraftTree]:
    """Each tree's root and first n draft nodes in topological order (every kept node's ancestors are kept)."""
    out = []
    for t, n in zip(trees, nodes):
        keep = min(t.num_nodes, 1 + n)
        out.append(t if keep == t.num_nodes else DraftTree(t.tokens[:keep], t.parents[:keep]))
    return out


def _sampling(requests) -> bool:
    return any(not r.params.greedy for r in requests)


def _follow(estimate: float | None, sample: float) -> float:
    """An estimate that follows falls fast and rises slowly: a one-off slow step (a CUDA graph captured, a
    kernel compiled) barely moves it, a lasting change does within a few steps."""
    if estimate is None:
        return sample
    return estimate + (0.5 if sample < estimate else 0.05) * (sample - estimate)


def cache_bytes_per_slot(cfg, length: int, dtype: torch.dtype) -> int:
    """Bytes of one request's K/V (length tokens) and recurrent state in a ModelCache of `cfg`."""
    elt = torch.empty((), dtype=dtype).element_size()
    kv = 2 * cfg.num_attention_layers * cfg.num_key_value_heads * length * cfg.head_dim * elt
    conv = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim
    state = cfg.num_linear_layers * (conv * max(cfg.linear_conv_kernel_dim - 1, 0) * elt
                                     + cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4)
    return kv + state


class _Scaled:
    """A cost curve times a measured correction factor (what split_budget reads)."""

    def __init__(self, curve: VerifyCostCurve, scale: float):
        self.curve, self.scale = curve, scale

    def seconds(self, tokens, batch: int, context):
        return self.curve.seconds(tokens, batch, context) * self.scale


def _reserved(device: torch.device) -> int:
    return torch.cuda.memory_reserved(device) if device.type == "cuda" else 0


def _bucket(n: int, buckets: tuple[int, ...]) -> int:
    return next((b for b in buckets if b >= n), n)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _static_parents(branching: tuple[int, ...]) -> tuple[int, ...]:
    """A static tree's parents, level by level (the order grow() builds it in)."""
    parents, frontier = [-1], [0]
    for c in branching:
        nxt = []
        for node in frontier:
            for _ in range(c):
                parents.append(node)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return tuple(parents)


class _Timer:
    """Time per step component, split evenly among the step's decoding requests.

    On a GPU a mark is a CUDA event recorded at each component boundary, without a sync: the time between two
    marks is the stream's timeline, i.e. the component's own device work, or the host time during which the
    idle GPU waited for it. Events are read in charge(): after a step's sync (keep_last: every step but the
    current one) or once generation is over. On the CPU a mark is the wall clock. Work run through excluded()
    (a benchmark's oracle inside a component) is charged to no component."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.steps: list[tuple[list[Request], list, dict]] = []  # (requests, [(component, mark)], info)
        self._current = None  # the component running now

    def start(self, active: list[Request], info: dict) -> None:
        """info: the step's record, which charge() completes with its measured seconds per component."""
        self.steps.append((active, [(None, self._mark())], info))

    def run(self, name: str, fn, *args):
        self._current = name
        out = fn(*args)
        self.steps[-1][1].append((name, self._mark()))
        self._current = None
        return out

    def excluded(self, fn, *args):
        marks = self.steps[-1][1] if self.steps and self._current else None
        if marks is not None:
            marks.append((self._current, self._mark()))
        out = fn(*args)
        if marks is not None:
            marks.append((None, self._mark()))
        return out

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def charge(self, keep_last: bool = False) -> list[tuple[dict, dict]]:
        """Adds every finished step's component times to its requests' SpecStats.seconds and to the step's record
        (info["seconds"]); returns (info, seconds per component) per step charged."""
        done = self.steps[:-1] if keep_last else self.steps
        if self.cuda and done and not keep_last:
            done[-1][1][-1][1].synchronize()
        out = []
        for active, marks, info in done:
            seconds = {}
            for (_, a), (name, b) in zip(marks, marks[1:]):
                if name is not None:
                    seconds[name] = seconds.get(name, 0.0) + (a.elapsed_time(b) / 1e3 if self.cuda else b - a)
            for name, sec in seconds.items():
                for r in active:
                    r.stats.seconds[name] += sec / len(active)
            info["seconds"] = seconds
            out.append((info, seconds))
        self.steps = self.steps[-1:] if keep_last else []
        return out
