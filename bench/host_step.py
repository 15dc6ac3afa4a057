"""Host microseconds of one speculative step, per component, on the CPU (no GPU needed): issue 3's budget.

With the GPU step at ~5 ms, the whole host path of a SpecEngine step (schedule -> propose -> verify metadata ->
graph replay launch -> accept -> commit -> emit) must fit in ~0.25 ms at batch 1. This script isolates that
path: a tiny random dense target (CPU, fp32), a drafter that proposes a fixed tree at no cost, and the verify
forward served by the runner's verify-graph path whose "captured graph" is a no-op (torch.cuda's graph API is
faked while capturing; replay still copies the step's metadata into the static buffers, as on a GPU). The
graph's static greedy tokens are set so that acceptance takes the first-child path to full depth (for a static
tree the path skips nodes, so commit moves K/V). What is timed is then only the Python/host work of the step.

Rows: tree shape x batch; columns: median host microseconds per component over the timed steps
(`metadata` and `replay` are the two parts of `verify`, timed alone on the same step's trees: filling the
runner's staged host buffer, then copying it into the graph's static inputs and replaying). `grow` (static and
dynamic trees) is the host side of a tree drafter's propose for one request, which the fixed-tree drafter skips:
tree.grow with a scorer that costs nothing (random log-probs, so a dynamic tree takes a new shape most steps, as
EAGLE-2's do), through the new shape's verify rows (TreeLayout.padded).

    python3 -m bench host_step --out /tmp/host_step.json
    python3 -m bench host_step --trees chain:4 --batches 1 --steps 50 --out /tmp/hs.json  # quick
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import random
import statistics
import time
from unittest import mock

import torch

from bench.common import Report, run_record, start_requests
from bench.trees import FullTreeDrafter
from specpilot.bench.shapes import hf_config, random_model
from specpilot.bench.synthetic import AcceptanceProfile
from specpilot.bench.synthetic import shape as full_shape
from specpilot.config import EngineConfig
from specpilot.engine.engine import SpecEngine
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.settings import Runtime
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.tree import DraftTree, TreeSpec, grow
from specpilot.spec_decode.verify import host_tree_metadata

COLUMNS = ("schedule", "draft", "verify", "metadata", "replay", "accept", "commit", "emit", "step", "grow")
TREES = ("chain:5", "static:3,2,1", "static:4,2,2,1")


class FixedTreeDrafter(FullTreeDrafter):
    """Proposes the same tree (shape and draft tokens) every step, at no cost: only the DraftTree is built."""

    name = "fixed-tree"

    def __init__(self, spec: TreeSpec, vocab: int):
        shape = full_shape(spec, 0, AcceptanceProfile.load("dflash2-gsm8k"))
        self.parents = shape.parents
        self.drafts = tuple(1 + i % (vocab - 1) for i in range(1, shape.num_nodes))  # never token 0

    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]:
        return [DraftTree((root,) + self.drafts, self.parents) for root in roots]

    def first_child_greedy(self, width: int) -> list[int]:
        """Target tokens that accept the first child of every node down to a leaf (bonus token 0)."""
        tokens = (0,) + self.drafts
        greedy = [0] * width
        for i in range(len(self.parents) - 1, 0, -1):  # the lowest index child of each node wins
            greedy[self.parents[i]] = tokens[i]
        return greedy


class FreeScorer:
    """A tree drafter's scorer at no model cost: each frontier node's top tokens, with random log-probs sorted
    best first, drawn from a pool made once (fresh per call where in the pool, so shapes vary step to step)."""

    def __init__(self, spec: TreeSpec, vocab: int, rng: random.Random, pool: int = 64):
        width = max(max(spec.branching, default=1), spec.top_k)
        self.rng = rng
        self.pool = [(rng.sample(range(1, vocab), width), sorted((-rng.expovariate(1.0) for _ in range(width)),
                                                                  reverse=True)) for _ in range(pool)]

    def __call__(self, tree: DraftTree, frontier: list[int]) -> list[tuple[list[int], list[float]]]:
        start = self.rng.randrange(len(self.pool) - len(frontier) + 1)
        return self.pool[start:start + len(frontier)]


def grow_rows(spec: TreeSpec, scorer: FreeScorer, width: int) -> None:
    grow(spec, 1, scorer).layout.padded(width)


class _NoGraph:
    """A captured graph whose replay does nothing: the verify forward then costs no time."""

    def capture_begin(self, pool=None) -> None:
        pass

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        pass


class _NoStream:
    def wait_stream(self, other) -> None:
        pass


@contextlib.contextmanager
def _nothing(*args, **kwargs):
    yield


def fake_cuda_graphs():
    """The parts of torch.cuda that VerifyGraph's capture uses, as no-ops (CPU only)."""
    cuda = torch.cuda
    return contextlib.ExitStack() if cuda.is_available() else _patched(
        (cuda, "CUDAGraph", _NoGraph), (cuda, "graph", _nothing), (cuda, "Stream", _NoStream),
        (cuda, "stream", _nothing), (cuda, "current_stream", _NoStream), (cuda, "synchronize", lambda *a: None),
        (cuda, "graph_pool_handle", lambda: (0, 0)))


@contextlib.contextmanager
def _patched(*patches):
    with contextlib.ExitStack() as stack:
        for obj, name, value in patches:
            stack.enter_context(mock.patch.object(obj, name, value))
        yield


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1e6


@torch.inference_mode()
def measure(model, tree: str, batch: int, steps: int, ctx: int, seed: int) -> dict:
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    spec = TreeSpec.parse(tree)
    drafter = FixedTreeDrafter(spec, vocab)
    # the H200 configuration: verify replayed from CUDA graphs, whose capture is faked below
    runtime = dataclasses.replace(Runtime.build(EngineConfig(), next(model.parameters()).device), verify_graphs=True)
    runner = ModelRunner(model, runtime)
    engine = SpecEngine(runner, drafter, spec, scheduler=SchedulerConfig(adaptive=False))
    params = SamplingParams(max_new_tokens=(steps + 8) * (spec.depth + 1) + 8, ignore_eos=True)
    prompts = [[rng.randrange(vocab) for _ in range(ctx)] for _ in range(batch)]
    reqs = start_requests(engine, prompts, params)
    times = {c: [] for c in COLUMNS}
    with fake_cuda_graphs():
        for step in range(steps + 5):
            row = _step(engine, reqs)
            if step == 0:  # the first verify captured the graph: make its static tokens accept a path
                _set_greedy(runner, drafter)
            if step >= 5:
                for c, t in row.items():
                    times[c].append(t)
    runner.verify_graphs.clear()
    if spec.kind != "chain":  # apart from the steps, whose layouts it would push out of the caches
        scorer = FreeScorer(spec, vocab, rng)
        times["grow"] = [_timed(grow_rows, spec, scorer, spec.max_tree_nodes)[1] for _ in range(steps)]
    tau = sum(len(r.result.token_ids) for r in reqs) / len(reqs) / (steps + 5)
    return {"tree": tree, "nodes": spec.max_tree_nodes, "batch": batch, "steps": steps, "tokens_per_step": tau,
            "median_us": {c: statistics.median(v) for c, v in times.items() if v},
            "min_us": {c: min(v) for c, v in times.items() if v}}


def _step(engine: SpecEngine, reqs) -> dict:
    t0 = time.perf_counter()
    plan, t_sched = _timed(engine.schedule)
    active = plan.decoding
    if len(active) != len(reqs):
        raise RuntimeError("a request finished before the measurement did: raise max_new_tokens")
    nodes = engine.budget(active)
    trees, t_draft = _timed(engine.propose, active, nodes)
    greedy, t_verify = _timed(engine.verify, active, trees)
    (accepted, firsts), t_accept = _timed(engine.accept, trees, greedy)
    _, t_commit = _timed(engine.commit, active, trees, accepted)
    _, t_emit = _timed(engine.emit, plan, trees, accepted, firsts)
    t_step = (time.perf_counter() - t0) * 1e6
    # verify's two parts, timed alone on this step's trees (the replay rewrites the same static buffers)
    runner = engine.runner
    args = ([r.committed for r in active], [r.slot for r in active], runner.device, engine.tree.max_tree_nodes)
    host, t_meta = _timed(_metadata, runner, trees, args)
    (tokens, _), t_replay = _timed(_replay, runner, host)
    runner.staging.read_tokens(tokens)  # as accept does: frees the staged buffer for the next step
    return {"schedule": t_sched, "draft": t_draft, "verify": t_verify, "metadata": t_meta, "replay": t_replay,
            "accept": t_accept, "commit": t_commit, "emit": t_emit, "step": t_step}


def _metadata(runner: ModelRunner, trees, args):
    return host_tree_metadata(trees, *args, alloc=runner.staging.take)


def _replay(runner: ModelRunner, host):
    return runner.verify(runner.verify_inputs(host))


def _set_greedy(runner: ModelRunner, drafter: FixedTreeDrafter) -> None:
    for graph in runner.verify_graphs.values():
        B, T = graph.tokens.shape
        graph.tokens.copy_(torch.tensor([drafter.first_child_greedy(T)] * B))


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="host microseconds per step component (median; CPU, verify = no-op graph replay)")
    for name in ("tree", "nodes", "batch", "tok/step") + COLUMNS:
        table.add_column(name, justify="right")
    for r in rows:
        med = r["median_us"]
        table.add_row(r["tree"], str(r["nodes"]), str(r["batch"]), f"{r['tokens_per_step']:.2f}",
                      *(f"{med[c]:.0f}" if c in med else "-" for c in COLUMNS))
    Console(width=160).print(table)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench host_step", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--trees", nargs="+", default=list(TREES))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier timings)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = random_model(hf_config("tiny-dense"), "cpu", torch.float32)
    report = Report(args.out, {"run": run_record("cpu"), "args": vars(args), "rows": []})
    for tree in args.trees:
        for batch in args.batches:
            report["rows"].append(measure(model, tree, batch, args.steps, args.ctx, seed=batch))
            report.save()
    print_table(report["rows"])

