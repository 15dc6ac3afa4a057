"""The DFlash proposal as the batch grows: milliseconds per step at batch 1..32 and two context lengths, for the
proposal paths side by side in one process, with a per-part breakdown.

A random-weight target in a real shape (specpilot.bench.shapes; Qwen3.5-27B by default) and its random DFlash
drafter (5 layers, block 8), as `specpilot bench` builds them; the drafters of every variant share the one drafter
model and the target's embedding and LM head, each with its own cache. Variants:
  new   the drafter as it is (runtime.draft paths: the tree-attention op on a GPU; the chain's argmax on the LM
        head's bf16 output; the new context rows packed by one copy)
  main  the same paths with main's tail before 2026-12-02: fp32 logits before the chain's argmax, and one copy per
        request of its new context rows (MainDrafter below)
  sdpa  `new` with the draft paths' block_kernel off: SDPA, which a captured proposal bounds by the whole cache
Each (context, batch): the requests start with random context features (contexts staggered so that the timed
steps centre on the context asked for), then every step commits --accepted random feature rows per request (an
accepted path) and proposes --tree; the variants step in lockstep from the same state. Correctness first:
--check-steps steps whose proposals must be equal token for token between main and new (the same kernels; only
the tail's dtype and the copies differ), and sdpa's agreement with new (another attention kernel: near-ties of
random weights may flip). Then --warmup steps and --reps timed steps per variant, interleaved: propose_ms is the
CUDA-event time of the whole propose() call (host preparation, the graph, the copy back: what an engine step
pays), graph_ms the median of back-to-back replays of the captured graph alone (device time). The breakdown runs
the captured function once eagerly under torch.profiler with the parts labelled (context extension, attention,
MLP, LM head, pick: argmax or top-k; other: norms, embedding, residuals; and, within attention, its core: the
block's K/V store and the attention over the context) and sums each part's kernel time; on the CPU, its host
time.

    python3 -m bench dflash_scaling --target Qwen3.5-27B --out bench/results/dflash_scaling_h200.json
    python3 -m bench dflash_scaling --device cpu --target tiny-hybrid --batches 1 3 --contexts 24 40 \
        --reps 3 --warmup 1 --out /tmp/dflash_scaling.json   # dry run (no graphs, wall time)

The JSON is written again after every (context, batch); an error in one is recorded there and the rest goes on.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import statistics
import tempfile
import time

import torch

from bench.common import Report, attempt, run_record, sync, time_replays
from specpilot.bench.shapes import SHAPES, hf_config, random_dflash, random_model
from specpilot.config import EngineConfig
from specpilot.runtime.settings import Runtime
from specpilot.spec_decode.drafters.dflash import DFlashDrafter
from specpilot.spec_decode.tree import TreeSpec

VARIANTS = ("main", "new", "sdpa")
PARTS = ("extend", "attention", "mlp", "lm_head", "pick")


class MainDrafter(DFlashDrafter):
    """The drafter with main's proposal tail before 2026-12-02 (commit 1095ac0): the LM head's output widened to
    fp32 before the chain's argmax, and each request's new context rows copied on their own. For the A/B."""

    def _pick(self, logits: torch.Tensor, width: int) -> torch.Tensor:
        return super()._pick(logits.float(), width)

    def _pack(self, buffer: torch.Tensor, new: list[torch.Tensor]) -> None:
        at = 0
        for features in new:
            buffer[at:at + features.shape[0]].copy_(features)
            at += features.shape[0]


def build(args):
    """(target, {variant: drafter}) on args.device."""
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    target = random_model(hf_config(args.target), args.device, dtype)
    runtime = Runtime.build(EngineConfig(), args.device)
    base = random_dflash(target, args.target, runtime=runtime)
    sdpa = dataclasses.replace(runtime, draft=dataclasses.replace(runtime.draft, block_kernel=False))
    make = {"new": (DFlashDrafter, runtime), "main": (MainDrafter, runtime), "sdpa": (DFlashDrafter, sdpa)}
    drafters = {}
    for name in args.variants:
        cls, rt = make[name]
        drafters[name] = base if name == "new" else cls(base.model, target, base.target_layers, base.block_size,
                                                        base.mask_token_id, runtime=rt)
    return target, drafters


class Workload:
    """The same random context and accepted rows for every variant, drawn once per (context, batch)."""

    def __init__(self, drafter: DFlashDrafter, n: int, ctx0: int, accepted: int, vocab: int, device, seed: int):
        gen = torch.Generator(device=device).manual_seed(seed)
        width, dtype = drafter.model.fc.weight.shape[1], drafter.model.fc.weight.dtype
        self.n, self.vocab, self.accepted = n, vocab, accepted
        self.contexts = [torch.randn(ctx0, width, generator=gen, device=device).to(dtype) for _ in range(n)]
        self.rows = [torch.randn(accepted, width, generator=gen, device=device).to(dtype) for _ in range(4)]
        self.rng = torch.Generator().manual_seed(seed)

    def start(self, drafter: DFlashDrafter) -> None:
        for slot, features in enumerate(self.contexts):
            drafter.start(slot, [0] * features.shape[0], features)

    def roots(self) -> list[int]:
        return torch.randint(0, self.vocab, (self.n,), generator=self.rng).tolist()

    def commit(self, drafter: DFlashDrafter, step: int) -> None:
        rows = self.rows[step % len(self.rows)]
        for slot in range(self.n):
            drafter.commit(slot, [0] * (self.accepted - 1), rows)


def _tokens(trees) -> list[tuple[int, ...]]:
    return [t.tokens for t in trees]


def check(drafters: dict, work: Workload, spec: TreeSpec, steps: int, device) -> dict:
    """The first `steps` proposals of every variant from the same state (the first one flushes the contexts and
    captures the graph): main and new equal token for token; sdpa's agreement with new; the memory each variant's
    first proposal left reserved (the contexts' eager extension and the graph's capture)."""
    slots, cuda = list(range(work.n)), torch.device(device).type == "cuda"
    out = {"steps": steps, "main_equals_new": None, "sdpa_agreement": None, "first_proposal_reserved_mb": {}}
    same, agree, total = True, 0, 0
    for step in range(steps):
        roots = work.roots()
        trees = {}
        for name, d in drafters.items():
            before = torch.cuda.memory_reserved() if cuda else 0
            trees[name] = _tokens(d.propose(slots, roots, spec))
            if step == 0 and cuda:
                out["first_proposal_reserved_mb"][name] = (torch.cuda.memory_reserved() - before) / 2**20
            work.commit(d, step)
        if "main" in trees and "new" in trees:
            same = same and trees["main"] == trees["new"]
        if "sdpa" in trees and "new" in trees:
            for a, b in zip(trees["sdpa"], trees["new"]):
                agree += sum(x == y for x, y in zip(a, b))
                total += len(b)
    if "main" in drafters and "new" in drafters:
        out["main_equals_new"] = same
    if total:
        out["sdpa_agreement"] = agree / total
    return out


def time_steps(drafters: dict, work: Workload, spec: TreeSpec, warmup: int, reps: int, device, first: int) -> dict:
    """Per variant: propose() timed by CUDA events (wall clock on the CPU), the variants interleaved step by step,
    each step after a commit of the accepted rows (host only: the rows join the proposal's forward)."""
    slots = list(range(work.n))
    events = {name: [] for name in drafters}
    walls = {name: [] for name in drafters}
    cuda = torch.device(device).type == "cuda"
    for step in range(warmup + reps):
        roots = work.roots()
        for name, d in drafters.items():
            work.commit(d, first + step)
            sync(device)
            t0 = time.perf_counter()
            if cuda:
                start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
            d.propose(slots, roots, spec)
            if cuda:
                end.record()
            wall = (time.perf_counter() - t0) * 1e3
            if step >= warmup:
                walls[name].append(wall)
                if cuda:
                    events[name].append((start, end))
    sync(device)
    out = {}
    for name in drafters:
        ms = [s.elapsed_time(e) for s, e in events[name]] if cuda else walls[name]
        ms.sort()
        out[name] = {"propose_ms_median": statistics.median(ms), "propose_ms_p10": ms[len(ms) // 10],
                     "propose_ms_p90": ms[(9 * len(ms)) // 10], "wall_ms_median": statistics.median(walls[name])}
    return out


def graph_ms(drafter: DFlashDrafter, key: tuple, device, reps: int) -> float | None:
    """Median ms of the captured proposal graph replayed back to back (device time, no host work)."""
    graph = drafter.graphs.get(key)
    if graph is None:
        return None
    return time_replays(graph.graph.replay, device, reps) * 1e3


@contextlib.contextmanager
def labelled(drafter: DFlashDrafter, prefix: str):
    """The drafter's parts inside record_function ranges named PREFIX:PART, for the duration of the block:
    instance attributes over its modules' methods, and the attention layer's core (the block's K/V store and its
    attention over the context: the tree-attention op or SDPA) through specpilot.layers.attention.attend."""
    from torch.profiler import record_function

    from specpilot.layers import attention

    def wrap(obj, attr: str, part: str):
        fn, own = getattr(obj, attr), attr in vars(obj)

        def run(*args, **kwargs):
            with record_function(f"{prefix}:{part}"):
                return fn(*args, **kwargs)

        setattr(obj, attr, run)
        wrapped.append((obj, attr, fn if own else None))

    wrapped = []
    wrap(drafter.model, "add_context", "extend")
    for layer in drafter.model.layers:
        wrap(layer.self_attn, "forward", "attention")
        wrap(layer.mlp, "forward", "mlp")
    wrap(attention, "attend", "attention_core")
    wrap(drafter.target.lm_head, "forward", "lm_head")
    wrap(drafter, "_pick", "pick")
    try:
        yield
    finally:
        for obj, attr, own in reversed(wrapped):
            if own is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, own)


def breakdown(drafters: dict, work: Workload, depth: int, width: int, device) -> dict:
    """Per variant: milliseconds of kernel time (host time on the CPU) of each part of one eager run of the
    captured function on the current state (new context rows none: every row of the extension is scratch, as
    in a step with nothing accepted), and each variant's top kernels."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = torch.device(device).type == "cuda"
    slots, roots = list(range(work.n)), work.roots()
    calls = {}
    for name, d in drafters.items():
        inputs = d._inputs(slots, roots, []).to(device)
        features = d._features(work.n)
        calls[name] = (d, inputs, features, d.cache.max_seq_len)
        d._run(inputs, features, depth, width, d.cache.max_seq_len)  # compiled helpers: warm
    sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for name, (d, inputs, features, max_len) in calls.items():
            with labelled(d, name), record_function(f"{name}:total"):
                d._run(inputs, features, depth, width, max_len)
            sync(device)
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        with open(f"{tmp}/trace.json") as f:
            sums, kernels = attribute(json.load(f), set(drafters), cuda)
    out = {}
    for name in drafters:
        parts = {part: sums.get(f"{name}:{part}", 0.0) for part in PARTS}
        whole = sums.get(f"{name}:total", 0.0)
        out[name] = {"parts_ms": {**parts, "other": whole - sum(parts.values())}, "total_ms": whole,
                     "attention_core_ms": sums.get(f"{name}:attention_core", 0.0),
                     "top_kernels_ms": kernels.get(name, collections.Counter()).most_common(8)}
    return out


def attribute(trace: dict, variants: set[str], cuda: bool) -> tuple[dict, dict]:
    """Chrome trace -> ({range name: ms}, {variant: Counter(kernel name: ms)}). On a GPU a range's ms are the
    device durations of the kernels, copies and memsets launched inside it (a kernel belongs to every range open
    at its launch, so nested ranges include their children's); on the CPU, the ranges' own wall durations."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    ranges = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
              if e.get("cat") == "user_annotation" and e["name"].split(":")[0] in variants]
    sums = collections.Counter()
    kernels = {v: collections.Counter() for v in variants}
    if not cuda:
        for a, b, name in ranges:
            sums[name] += (b - a) / 1e3
        return sums, kernels
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        ts = launched.get(e.get("args", {}).get("correlation"))
        if ts is None:
            continue
        ms = e["dur"] / 1e3
        for a, b, name in ranges:
            if a <= ts <= b:
                sums[name] += ms
                if name.endswith(":total"):
                    kernels[name.split(":")[0]][e["name"][:90]] += ms
    return sums, kernels


def run(args, report: Report) -> None:
    target, drafters = build(args)
    spec = TreeSpec.parse(args.tree)
    any_drafter = next(iter(drafters.values()))
    block = any_drafter.block_size
    capped = spec.capped(any_drafter.max_depth)
    width = 0 if spec.kind == "chain" else min(max(max(spec.branching, default=1), spec.top_k),
                                                target.config.vocab_size)
    accepted = min(args.accepted, block)
    steps = args.check_steps + args.warmup + args.reps
    room = steps * accepted + 2 * block  # the timed window centres on the context asked for
    for d in drafters.values():
        d.allocate(max(args.batches), max(args.contexts) + room)
    report["setup"] = {"block": block, "depth": capped.depth, "width": width, "accepted_rows_per_step": accepted,
                       "drafter_layers": len(any_drafter.model.layers), "use_graphs": any_drafter.use_graphs,
                       "draft_paths": {n: dataclasses.asdict(d.paths) for n, d in drafters.items()},
                       "drafter_cache_positions": any_drafter.cache.max_seq_len}
    t_start = time.perf_counter()
    for ctx in args.contexts:
        ctx0 = max(1, ctx - (args.check_steps + args.warmup + args.reps // 2) * accepted)
        for n in args.batches:
            label = f"ctx {ctx} batch {n}"
            work = Workload(any_drafter, n, ctx0, accepted, target.config.vocab_size, args.device, seed=ctx * 101 + n)
            row = {"ctx": ctx, "batch": n, "context_range": [ctx0 + (args.check_steps + args.warmup) * accepted,
                                                               ctx0 + steps * accepted]}
            report["results"].append(row)
            for d in drafters.values():
                work.start(d)
            row["check"] = attempt(f"{label} check", check, drafters, work, spec, args.check_steps, args.device)
            first = args.check_steps
            row["timing"] = attempt(f"{label} timing", time_steps, drafters, work, spec, args.warmup, args.reps,
                                    args.device, first)
            key = (n, capped.depth, width)
            row["graph_ms"] = {name: attempt(f"{label} {name} graph", graph_ms, d, key, args.device, args.reps)
                               for name, d in drafters.items()}
            if not args.no_breakdown:
                row["breakdown"] = attempt(f"{label} breakdown", breakdown, drafters, work, capped.depth, width,
                                           args.device)
            report.save()
            _print_row(row, time.perf_counter() - t_start)
            del work


def _print_row(row: dict, elapsed: float) -> None:
    timing = row.get("timing") or {}
    parts = []
    for name, t in timing.items() if isinstance(timing, dict) and "error" not in timing else []:
        g = row["graph_ms"].get(name)
        g = f"{g:.3f}" if isinstance(g, float) else "-"
        parts.append(f"{name} {t['propose_ms_median']:.3f} (graph {g})")
    check = row.get("check") or {}
    print(f"[{elapsed:6.1f}s] ctx {row['ctx']:>5} batch {row['batch']:>3}: propose ms " + ", ".join(parts)
          + f"; main == new: {check.get('main_equals_new')}, sdpa agreement {check.get('sdpa_agreement')}",
          flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench dflash_scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--target", default="Qwen3.5-27B", help=f"a shape: {', '.join(SHAPES)} (random weights)")
    p.add_argument("--tree", default="chain:7", help="the proposal's tree spec (chain:7 is the stock one)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--accepted", type=int, default=6, help="context rows committed per request per step")
    p.add_argument("--check-steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--no-breakdown", action="store_true", help="skip the profiled per-part breakdown")
    p.add_argument("--device", default="cuda")
    p.add_argument("--commit", default=None, help="the commit to record (default: SPECPILOT_COMMIT, else git HEAD)")
    args = p.parse_args(argv)
    if args.target not in SHAPES:
        p.error(f"--target {args.target!r}: use one of {', '.join(SHAPES)}")
    if min(args.batches) < 1 or min(args.contexts) < 1 or args.accepted < 1 or args.reps < 1 or args.check_steps < 1:
        p.error("--batches, --contexts, --accepted, --reps and --check-steps take positive numbers")
    try:
        TreeSpec.parse(args.tree)
    except ValueError as e:
        p.error(str(e))
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device here: run with --device cpu for a dry run")
    args.variants = list(dict.fromkeys(args.variants))
    torch.manual_seed(0)
    report = Report(args.out, {**run_record(args.device, args.commit), "target": args.target, "tree": args.tree,
                               "variants": args.variants, "batches": args.batches, "contexts": args.contexts,
                               "reps": args.reps, "warmup": args.warmup, "results": []})
    with torch.inference_mode():
        run(args, report)
    print(f"wrote {args.out}")
