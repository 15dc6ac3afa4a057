"""SpecEngine: greedy speculative generation over a batch of requests, each with its own draft tree.

One step is six named calls: schedule (which requests still run), propose (the drafter's trees), verify
(one target forward over every tree), accept (longest agreeing path + bonus token; the step's one host sync),
commit (keep the accepted nodes' K/V and recurrent state, advance the drafter) and emit (append tokens, stop).
Output equals greedy autoregressive output of the same runtime, token for token.

Each component's time is charged to the step's requests (SpecStats.seconds) without stalling the GPU: CUDA
events at the component boundaries, read once generation is over (see _Timer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specpilot.engine.detokenizer import Detokenizer, decode_text
from specpilot.engine.generator import GenerationResult, append_token, stop_detokenizer
from specpilot.runtime.runner import ModelRunner, inference
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.drafters.base import Drafter
from specpilot.spec_decode.tree import DraftTree, TreeSpec
from specpilot.spec_decode.verify import Acceptance, accept_greedy, host_tree_metadata

# "start": the request's prefill and drafter start (wall time, ended by the sync of its first token)
COMPONENTS = ("start", "draft", "verify", "accept", "commit", "other")


@dataclass(slots=True)
class SpecStats:
    steps: int = 0
    emitted: int = 0
    drafted_per_depth: list[int] = field(default_factory=list)
    accepted_per_depth: list[int] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 0.0))

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target step, bonus included."""
        return self.emitted / self.steps if self.steps else 0.0

    def add(self, tree: DraftTree, acc: Acceptance, emitted: int) -> None:
        self.steps += 1
        self.emitted += emitted
        for d, n in enumerate(tree.draft_count_per_depth()):
            _bump(self.drafted_per_depth, d, n)
        for d in range(acc.num_accepted):
            _bump(self.accepted_per_depth, d, 1)

    def to_dict(self) -> dict:
        return {"steps": self.steps, "tau": round(self.tau, 4), "drafted_per_depth": self.drafted_per_depth,
                "accepted_per_depth": self.accepted_per_depth,
                "seconds": {k: round(v, 6) for k, v in self.seconds.items()}}


def _bump(counts: list[int], index: int, n: int) -> None:
    counts.extend([0] * (index + 1 - len(counts)))
    counts[index] += n


@dataclass(slots=True)
class _Request:
    index: int
    slot: int
    prompt: list[int]
    result: GenerationResult
    stats: SpecStats
    committed: int = 0  # tokens whose K/V and state the target cache holds
    root: int = -1  # last emitted token, not yet seen by the target
    done: bool = False
    detok: Detokenizer | None = None  # stop-string matcher (stop_detokenizer)


class SpecEngine:
    def __init__(self, runner: ModelRunner, drafter: Drafter, tree: TreeSpec, eos_ids: tuple[int, ...] = (),
                 tokenizer=None):
        self.runner, self.drafter, self.tree = runner, drafter, tree
        self.eos_ids, self.tokenizer = set(eos_ids), tokenizer

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None) -> list[tuple[GenerationResult, SpecStats]]:
        if not params.greedy:
            raise NotImplementedError("speculative decoding is greedy for now; use --temperature 0 or --drafter none")
        start = time.perf_counter()
        reqs = self.requests = self._start(prompts, params, on_token, start)
        timer = _Timer(self.runner.device)
        while True:
            active = self.schedule(reqs)
            if not active:
                break
            timer.start(active)
            trees = timer.run("draft", self.propose, active)
            logits = timer.run("verify", self.verify, active, trees)
            accepted = timer.run("accept", self.accept, trees, logits)
            timer.run("commit", self.commit, active, trees, accepted)
            timer.run("other", self.emit, active, trees, accepted, params, on_token, start)
        timer.charge()
        total = time.perf_counter() - start
        for r in reqs:
            r.result.total_s = total
            if self.tokenizer is not None and r.result.text is None:
                r.result.text = decode_text(self.tokenizer, r.result.token_ids)
        return [(r.result, r.stats) for r in reqs]

    def _start(self, prompts, params, on_token, start) -> list[_Request]:
        limit = self.runner.config.max_position_embeddings
        longest = max(map(len, prompts))
        if longest + params.max_new_tokens > limit:
            raise ValueError(f"prompt of {longest} tokens + max_new_tokens={params.max_new_tokens} exceeds the "
                             f"model's context of {limit} tokens")
        detoks = [stop_detokenizer(self.tokenizer, params) for _ in prompts]
        committed = longest + params.max_new_tokens + 1
        self.runner.allocate(len(prompts), committed + self.tree.max_tree_nodes)
        # a drafter may store its tree as it grows, past the committed tokens: larger than the tree it proposes
        self.drafter.allocate(len(prompts), committed + self.tree.max_grown_nodes)
        reqs = []
        for i, (prompt, (logits, features, seconds)) in enumerate(zip(prompts, self._prefill(prompts))):
            t0 = time.perf_counter()
            r = _Request(i, i, list(prompt), GenerationResult(prompt_len=len(prompt)), SpecStats(), detok=detoks[i])
            self.drafter.start(r.slot, r.prompt, features)
            r.committed = len(prompt)
            self._emit_tokens(r, [int(logits.argmax())], params, on_token, time.perf_counter() - start)
            r.stats.seconds["start"] += seconds + time.perf_counter() - t0
            reqs.append(r)
        return reqs

    def _prefill(self, prompts):
        """Yields per request, one prefill each: its last-token logits [vocab], the drafter's features or None, the
        seconds spent."""
        layers = tuple(self.drafter.target_layers)
        runner = self.runner
        for i, prompt in enumerate(prompts):
            t0 = time.perf_counter()
            if layers:
                logits, features = runner.prefill_features(i, prompt, layers)
            else:
                logits, features = runner.prefill(i, prompt), None
            yield logits, features, time.perf_counter() - t0

    def schedule(self, reqs: list[_Request]) -> list[_Request]:
        return [r for r in reqs if not r.done]

    def propose(self, active: list[_Request]) -> list[DraftTree]:
        trees = self.drafter.propose([r.slot for r in active], [r.root for r in active], self.tree)
        room = [self.runner.cache.max_seq_len - r.committed for r in active]
        assert all(t.num_nodes <= n for t, n in zip(trees, room)), "draft tree larger than the cache room left"
        return trees

    @inference
    def verify(self, active: list[_Request], trees: list[DraftTree]) -> torch.Tensor:
        """One target forward over all trees -> greedy tokens [B, T] (device); keeps the drafter's features."""
        # with captured verify graphs every step has the tree spec's full width (one graph per batch size)
        width = self.tree.max_tree_nodes if self.runner.runtime.verify_graphs else None
        hybrid = self.runner.config.is_hybrid
        host = host_tree_metadata(trees, [r.committed for r in active], [r.slot for r in active], self.runner.device,
                                  width, chains_as_trees=hybrid and self.runner.runtime.fold_hybrid_chains,
                                  alloc=self.runner.staging.take)
        layers = tuple(self.drafter.target_layers)
        meta = self.runner.verify_inputs(host, layers)
        # replayed chains update recurrent state in place (snapshot to roll back); trees (and folded chains) leave
        # it and stash their terms
        self._snapshot = self.runner.cache.snapshot(meta.slots) if hybrid and meta.block_mask is None else None
        self._tree_commit = hybrid and meta.block_mask is not None
        self._width = meta.input_ids.shape[1]
        greedy, self._features = self.runner.verify(meta, layers)
        return greedy

    def rewind(self, rows: list[int] | None = None) -> None:
        """Puts back the recurrent state that the last verify advanced in place (a replayed chain), for the given
        rows of its batch (default: all); after a verify that left the state (trees, folded chains) nothing to do."""
        if self._snapshot is not None:
            self.runner.cache.restore(self._snapshot, rows)

    def accept(self, trees: list[DraftTree], greedy: torch.Tensor) -> list[Acceptance]:
        # the step's one sync, which also frees verify's staged metadata buffer for the next step
        return accept_greedy(trees, self.runner.staging.read_tokens(greedy))

    @inference
    def commit(self, active: list[_Request], trees: list[DraftTree], accepted: list[Acceptance]) -> None:
        self.runner.cache.commit([r.slot for r in active], [r.committed for r in active],
                                 [acc.path for acc in accepted], fold=self._tree_commit)
        for row, (r, acc) in enumerate(zip(active, accepted)):
            feats = self._path_features(row, acc.path) if self._features is not None else None
            self.drafter.commit(r.slot, list(acc.tokens[:-1]), feats)
        if self._snapshot is not None:
            self._replay_recurrent(active, trees, accepted, self._width)
        for r, acc in zip(active, accepted):
            r.committed += len(acc.path)

    def _path_features(self, row: int, path: tuple[int, ...]) -> torch.Tensor:
        # a copy either way: a verify graph's features are a static buffer that the next replay overwrites
        if _in_place(path) == len(path):
            return self._features[row, :len(path)].clone()
        return self._features[row, torch.tensor(path, device=self._features.device)]

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

    def emit(self, active, trees, accepted: list[Acceptance], params, on_token, start) -> None:
        elapsed = time.perf_counter() - start  # a step's tokens all arrive at once
        for r, tree, acc in zip(active, trees, accepted):
            before = len(r.result.token_ids)
            self._emit_tokens(r, acc.tokens, params, on_token, elapsed)
            r.stats.add(tree, acc, len(r.result.token_ids) - before)

    def _emit_tokens(self, r: _Request, tokens, params, on_token, elapsed: float) -> None:
        for tok in tokens:
            if on_token is not None:
                on_token(r.index, tok)
            if append_token(r.result, tok, params, self.eos_ids, r.detok, elapsed):
                r.done = True
                return
        r.root = tokens[-1]


def _in_place(path: tuple[int, ...]) -> int:
    """Length of the path's prefix 0, 1, 2, ...: nodes already stored where the committed sequence needs them."""
    n = 0
    while n < len(path) and path[n] == n:
        n += 1
    return n


class _Timer:
    """Time per step component, split evenly among the step's requests.

    On a GPU a mark is a CUDA event recorded at each component boundary, without a sync: the time between two
    marks is the stream's timeline, i.e. the component's own device work, or the host time during which the
    idle GPU waited for it. Events are read in charge(), once generation is over. On the CPU a mark is the wall
    clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.steps: list[tuple[list[_Request], list]] = []  # (requests, [(component, mark)]), first mark unnamed

    def start(self, active: list[_Request]) -> None:
        self.steps.append((active, [(None, self._mark())]))

    def run(self, name: str, fn, *args):
        out = fn(*args)
        self.steps[-1][1].append((name, self._mark()))
        return out

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def charge(self) -> None:
        """Adds every recorded step's component times to its requests' SpecStats.seconds."""
        if self.cuda and self.steps:
            self.steps[-1][1][-1][1].synchronize()
        for active, marks in self.steps:
            for (_, a), (name, b) in zip(marks, marks[1:]):
                seconds = a.elapsed_time(b) / 1e3 if self.cuda else b - a
                for r in active:
                    r.stats.seconds[name] += seconds / len(active)
        self.steps.clear()
