"""Cost of verifying N tree tokens in one target forward, relative to one token: t(N) / t(1); and the host
overhead of a speculative step at batch 1.

Random-weight bf16 target in a real shape (Qwen3-8B by default) at batch 1 and 8, contexts 512 and 4096.
Each request verifies a random tree of N nodes (topological, depth <= 8) under its ancestor mask, through the
engine's verify path: one CUDA graph per shape (tree-attention op, Triton GEMVs up to 16 rows, compiled
pointwise helpers). t(N) is the median of CUDA-event-timed graph replays, so it is GPU time, as in a real
step where the host launches one graph; the AR decode step of the same batch is timed the same way beside
it. Correctness first: per N the graph's greedy tokens against eager masked SDPA (the tree-attention kernel
itself is checked against its reference at these heads by tests/gpu/test_kernels.py).

Host overhead (issue 3: at most 5% of a step at batch 1): a SpecEngine step (schedule, propose, verify,
accept, commit, emit) with a drafter that proposes the tree spec's full shape at no device cost, at batch 1
and context 512, timed by wall clock between consecutive step starts (steps run back to back as in generate(),
each waiting for its own verify in accept; the benchmark adds no sync between them) and, over the same number
of steps, its GPU busy time (sum of kernel and copy durations from torch.profiler). The step's GPU time is
that busy time plus the launch gaps inside the verify graph (its back-to-back replay time minus its kernel time:
gaps the device has with no host work at all); host overhead = 1 - GPU time / wall, the share of the step the GPU
waits for the host. 1 - busy / wall is reported beside it as the GPU idle share. The verify call alone is
measured the same way, synchronised after each call. Variants: eager SDPA,
eager tree attention, and verify CUDA graphs (EngineConfig(verify_graphs=True, block_attention="tree")); beside
each, the host time of launching the verify graph onto an idle GPU (cudaGraphLaunch of a few hundred kernels).
--ab-layers-per-graph A B: verify graphs cut every A layers against every B layers (0: one graph; a single N
means 0 against N), their steps interleaved (the same configuration varied 3-9% between runs on the H200 host:
only a paired comparison can see ~0.1 ms).

    python3 -m bench verify_cost --out bench/results/verify_cost_h200.json
    TRITON_INTERPRET=1 python3 -m bench verify_cost --out /tmp/vc.json --device cpu \
        --shape tiny-dense --sizes 1 4 --configs 1x32 2x16 --reps 2 --overhead-steps 3   # dry run

Every measurement runs inside its own try/except (an error is recorded in the JSON and the rest goes on), and
the JSON is written again after each section.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import time

import torch

from bench.common import (Report, attempt, engine_step, failed, host_ms, make_runner, run_record, start_requests,
                          sync, time_replays)
from bench.trees import FullTreeDrafter, random_tree
from specpilot.bench.shapes import SHAPES, random_model
from specpilot.config import EngineConfig
from specpilot.engine.engine import SpecEngine
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.tree import TreeSpec
from specpilot.spec_decode.verify import tree_metadata


@torch.inference_mode()
def sweep(model, batch: int, ctx: int, sizes: list[int], reps: int, rng: random.Random, report: Report) -> dict:
    """t(N) of the engine's verify path (CUDA graph per shape, tree-attention op, GEMVs up to 16 rows, compiled
    pointwise) for N tree nodes per request, and the AR decode step of the same batch in the same run. Each N
    is checked first: the graph's greedy tokens against eager masked SDPA (agreement; bf16 random weights have
    near-ties, so a few flips are expected and reported, not hidden)."""
    vocab, device = model.config.vocab_size, next(model.parameters()).device
    graphs = device.type == "cuda"
    fast = make_runner(model, EngineConfig(block_attention="tree", verify_graphs=graphs))
    ref = make_runner(model, EngineConfig(block_attention="sdpa"))
    fast.allocate(batch, ctx + max(sizes) + reps + 16)
    for b in range(batch):
        fast.prefill(b, [rng.randrange(vocab) for _ in range(ctx)])
    ref.cache = fast.cache  # the same committed prefix for both paths
    out = {"batch": batch, "ctx": ctx, "sizes": sizes, "path": "verify graphs" if graphs else "eager",
           "verify_s": [], "greedy_agreement": [], "errors": {}}
    report["runs"].append(out)
    slots = list(range(batch))
    for n in sizes:
        trees = [random_tree(n, vocab, rng) for _ in range(batch)]
        meta = tree_metadata(trees, [ctx] * batch, slots, device)
        want = attempt(f"b{batch} ctx{ctx} n{n} sdpa", lambda: model.logits(ref.forward(meta)).argmax(-1))
        got = attempt(f"b{batch} ctx{ctx} n{n} verify", lambda: fast.verify(meta)[0].clone())
        if failed(got) or failed(want):
            out["errors"][f"n{n}"] = (got if failed(got) else want)["error"]
            out["greedy_agreement"].append(None)
            out["verify_s"].append(None)
            report.save()
            continue
        out["greedy_agreement"].append((got == want).float().mean().item())
        graph = next(iter(fast.verify_graphs.values()), None)
        replay = graph.graph.replay if graph is not None else lambda: fast.verify(meta)
        r = attempt(f"b{batch} ctx{ctx} n{n} timing", time_replays, replay, device, reps)
        if failed(r):
            out["errors"][f"n{n}_timing"] = r["error"]
            r = None
        out["verify_s"].append(r)
        fast.verify_graphs.clear()
        report.save()
    t = out["verify_s"]
    out["ratio"] = [x / t[0] if x is not None and t[0] else None for x in t]
    out["ar_step_s"] = attempt(f"b{batch} ctx{ctx} AR step", time_ar_step, fast, batch, ctx, reps)
    report.save()
    fast.graphs.clear()
    fast.cache = ref.cache = None
    return out


def time_ar_step(runner: ModelRunner, batch: int, ctx: int, reps: int) -> float:
    """One AR decode step of the batch at this context (the runner's decode graph, replayed)."""
    device = runner.device
    ids = torch.zeros(batch, dtype=torch.long, device=device)
    positions = torch.full((batch,), ctx, dtype=torch.long, device=device)
    runner.decode(ids, positions)
    graph = runner.graphs.get(batch)
    if graph is None:  # no graphs (CPU): time the eager step
        return time_replays(lambda: runner.decode(ids, positions.fill_(ctx)), device, reps)
    graph.positions.fill_(ctx)
    return time_replays(graph.graph.replay, device, reps)


def _busy_ms(prof, steps: int, device: torch.device) -> float:
    """Device time per step from a torch.profiler run: kernels and copies (CPU op self time on the CPU)."""
    total = 0.0
    for e in prof.key_averages():
        if device.type == "cuda":
            if e.device_type.name == "CUDA":
                total += e.self_device_time_total
        else:
            total += e.self_cpu_time_total
    return total / 1e3 / steps


def _profiled(fn, steps: int, device: torch.device) -> float:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        sync(device)
    return _busy_ms(prof, steps, device)


def _walls(fn, steps: int, device: torch.device) -> list[float]:
    """Milliseconds of each call, synchronised after each."""
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _step_walls(step, steps: int, device: torch.device) -> list[float]:
    """Milliseconds between consecutive step starts, the steps run back to back as generate() runs them (a step
    waits for its own verify in accept): no device sync of the benchmark's own between them."""
    marks = [time.perf_counter()]
    for _ in range(steps):
        step()
        marks.append(time.perf_counter())
    sync(device)
    return [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]


def _trace(step, path: str, device: torch.device, steps: int = 6) -> None:
    """A chrome trace (gzipped JSON) of a few steps, each phase labelled: where the GPU waits for the host."""
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            with record_function("step"):
                step(record_function)
            sync(device)
    prof.export_chrome_trace(path)


@torch.inference_mode()
def _stepper(model, engine_cfg: EngineConfig, tree: str, ctx: int, steps: int, rng: random.Random):
    """A SpecEngine on one request of `ctx` random tokens with the zero-cost full-tree drafter: (runner, the
    request list, step(label) running one step with each phase inside label(name), the last step's state)."""
    vocab = model.config.vocab_size
    runner = make_runner(model, engine_cfg)
    spec = TreeSpec.parse(tree)
    engine = SpecEngine(runner, FullTreeDrafter(vocab), spec, scheduler=SchedulerConfig(adaptive=False))
    params = SamplingParams(max_new_tokens=3 * steps + 3 * spec.max_tree_nodes + 16, ignore_eos=True)
    reqs = start_requests(engine, [[rng.randrange(vocab) for _ in range(ctx)]], params)
    state = {"engine": engine}

    def step(label=None):
        state["active"], state["trees"] = engine_step(engine, label)

    return runner, reqs, step, state


@torch.inference_mode()
def host_overhead_ab(model, cfg_a: EngineConfig, cfg_b: EngineConfig, tree: str, ctx: int, steps: int,
                     rng: random.Random) -> dict:
    """Step wall of two engine configurations interleaved step by step (the order alternating), so that drift
    of the host or the GPU over the run falls on both alike: medians, quartiles and the paired differences."""
    a, b = (_stepper(model, cfg, tree, ctx, steps, rng) for cfg in (cfg_a, cfg_b))
    device = a[0].device
    for _, _, step, _ in (a, b):
        for _ in range(3):
            step()
    sync(device)
    walls = {"a": [], "b": []}
    for i in range(steps):
        order = (("a", a[2]), ("b", b[2])) if i % 2 == 0 else (("b", b[2]), ("a", a[2]))
        for name, step in order:
            t0 = time.perf_counter()
            step()
            sync(device)
            walls[name].append((time.perf_counter() - t0) * 1e3)
    diffs = sorted(y - x for x, y in zip(walls["a"], walls["b"]))

    def quartiles(xs):
        xs = sorted(xs)
        return [xs[len(xs) // 4], xs[len(xs) // 2], xs[(3 * len(xs)) // 4]]

    out = {"tree": tree, "ctx": ctx, "steps": steps, "a": dataclasses.asdict(cfg_a), "b": dataclasses.asdict(cfg_b),
           "wall_ms_quartiles_a": quartiles(walls["a"]), "wall_ms_quartiles_b": quartiles(walls["b"]),
           "paired_diff_ms_quartiles_b_minus_a": quartiles(diffs),
           "b_faster_share": sum(d < 0 for d in diffs) / len(diffs)}
    for runner, _, _, _ in (a, b):
        runner.verify_graphs.clear()
        runner.cache = None
    return out


@torch.inference_mode()
def host_overhead(model, engine_cfg: EngineConfig, tree: str, ctx: int, steps: int, rng: random.Random,
                  trace: str | None = None) -> dict:
    """Wall vs GPU busy time of one SpecEngine step and of its verify call alone, batch 1."""
    runner, reqs, step, state = _stepper(model, engine_cfg, tree, ctx, steps, rng)
    engine, device = state["engine"], runner.device

    for _ in range(3):  # warm-up: kernel compiles, verify graph capture
        step()
    sync(device)
    emitted0 = len(reqs[0].result.token_ids)
    walls = _step_walls(step, steps, device)
    emitted = len(reqs[0].result.token_ids) - emitted0
    busy = _profiled(step, steps, device)
    if trace:
        _trace(step, trace, device)
    # the verify call alone, repeated on the last step's trees (dense targets: it rewrites the same K/V slots)
    verify = lambda: engine.verify(state["active"], state["trees"])  # noqa: E731
    verify()
    v_walls = _walls(verify, steps, device)
    v_busy = _profiled(verify, steps, device)
    wall, v_wall = statistics.median(walls), statistics.median(v_walls)
    # the verify graph replayed back to back: its GPU time with the launch gaps between its kernels, which are
    # the device's own (a replay loop with no host work has them too), unlike the kernel-time sum `v_busy`
    graph = next(iter(runner.verify_graphs.values()), None)
    graph_ms = time_replays(graph.graph.replay, device, steps) * 1e3 if graph is not None else None
    # negative under PDL: a kernel's profiled span then includes its wait on the one before, so spans overlap
    in_graph_gaps = graph_ms - v_busy if graph_ms is not None else 0.0
    launch_ms = host_ms(graph.graph.replay, device, steps) if graph is not None else None
    gpu_step = busy + in_graph_gaps  # what the step costs the GPU with an infinitely fast host
    runner.verify_graphs.clear()  # graphs hold the cache: free both now
    runner.cache = None
    return {"tree": tree, "nodes": TreeSpec.parse(tree).max_tree_nodes, "ctx": ctx, "batch": 1, "steps": steps,
            "tokens_per_step": emitted / steps,
            "step_wall_ms_median": wall, "step_wall_ms_min": min(walls), "step_gpu_busy_ms": busy,
            "verify_graph_replay_ms": graph_ms, "in_graph_gaps_ms": in_graph_gaps,
            "graph_launch_host_ms": launch_ms, "step_gpu_ms": gpu_step,
            "step_host_overhead_ms": wall - gpu_step, "step_host_overhead_fraction": 1 - gpu_step / wall,
            "step_gpu_idle_fraction": 1 - busy / wall,
            "verify_wall_ms_median": v_wall, "verify_gpu_busy_ms": v_busy,
            "verify_gpu_idle_fraction": 1 - v_busy / v_wall,
            "meets_issue3_5pct": (1 - gpu_step / wall) <= 0.05}


def ab_spacings(values: list[int] | None) -> tuple[int, int] | None:
    """--ab-layers-per-graph as (a, b) layers per graph: A B as given, a single N as 0 (one graph) against N;
    None where absent or a single 0 (the option's old "off")."""
    if not values or values == [0]:
        return None
    if len(values) > 2 or min(values) < 0:
        raise SystemExit(f"--ab-layers-per-graph takes N or A B (layers per graph, >= 0), got {values}")
    return (0, values[0]) if len(values) == 1 else (values[0], values[1])


OVERHEAD_VARIANTS = {
    "eager_sdpa": dict(),
    "eager_tree": dict(block_attention="tree"),
    "graphs_tree": dict(block_attention="tree", verify_graphs=True),
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench verify_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shape", default="Qwen3-8B")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    p.add_argument("--configs", nargs="+", default=["1x512", "1x4096", "8x512", "8x4096"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--overhead-trees", nargs="+", default=["chain:7", "dynamic:4,7,28"])
    p.add_argument("--overhead-ctx", type=int, default=512)
    p.add_argument("--overhead-steps", type=int, default=100)
    p.add_argument("--skip-sweep", action="store_true", help="host overhead only")
    p.add_argument("--overhead-variants", nargs="+", default=["graphs_tree"], choices=list(OVERHEAD_VARIANTS))
    p.add_argument("--ab-layers-per-graph", type=int, nargs="+", default=None, metavar="N",
                   help="also time verify graphs cut every A layers against every B layers (A B; one value N: "
                        "0 N, i.e. one graph against a chain cut every N layers), steps interleaved")
    p.add_argument("--trace-dir", default=None,
                   help="write a chrome trace of a few host-overhead steps per tree here (host_trace_<kind>.json.gz)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    device = args.device
    rng = random.Random(0)
    torch.manual_seed(0)
    report = Report(args.out, {**run_record(device, args.commit), "shape": args.shape, "runs": [],
                               "host_overhead": {}})
    config_cls, kw = SHAPES[args.shape]
    model = random_model(config_cls(**kw), device)
    # host overhead first: it is issue 3's number and costs seconds
    for name in args.overhead_variants:
        fields = OVERHEAD_VARIANTS[name]
        for tree in args.overhead_trees:
            key = f"{name}/{tree}"
            trace = (os.path.join(args.trace_dir, f"host_trace_{tree.split(':')[0]}.json.gz")
                     if args.trace_dir else None)
            r = attempt(f"host overhead {key}", host_overhead, model, EngineConfig.from_dict(fields), tree,
                        args.overhead_ctx, args.overhead_steps, rng, trace)
            report["host_overhead"][key] = r
            report.save()
            print("host overhead", key, json.dumps(r)[:400], flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    spacings = ab_spacings(args.ab_layers_per_graph)
    if spacings is not None:  # two cut spacings of the verify graphs, a against b, interleaved
        spacing_a, spacing_b = spacings
        base = OVERHEAD_VARIANTS["graphs_tree"]
        report["host_overhead_ab"] = {}
        for tree in args.overhead_trees:
            r = attempt(f"a/b {tree}", host_overhead_ab, model,
                        EngineConfig.from_dict(base).replace(verify_layers_per_graph=spacing_a),
                        EngineConfig.from_dict(base).replace(verify_layers_per_graph=spacing_b), tree,
                        args.overhead_ctx, args.overhead_steps, rng)
            report["host_overhead_ab"][tree] = r
            report.save()
            print(f"a/b {tree}: cut every {spacing_a} vs every {spacing_b} layers (0: one graph):",
                  {k: r.get(k) for k in ("wall_ms_quartiles_a", "wall_ms_quartiles_b",
                                          "paired_diff_ms_quartiles_b_minus_a", "b_faster_share", "error")},
                  flush=True)
    if not args.skip_sweep:
        for c in args.configs:
            batch, ctx = map(int, c.split("x"))
            r = attempt(f"sweep {c}", sweep, model, batch, ctx, args.sizes, args.reps, rng, report)
            if failed(r):
                runs = report["runs"]
                if not (runs and (runs[-1].get("batch"), runs[-1].get("ctx")) == (batch, ctx)):
                    runs.append({"batch": batch, "ctx": ctx})
                runs[-1]["error"] = r["error"]
                report.save()
                continue
            print(json.dumps({k: r[k] for k in ("batch", "ctx", "ratio", "greedy_agreement", "ar_step_s")}),
                  flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    report.save()

    def f(x, fmt="6.2f"):
        return format(x, fmt) if isinstance(x, (int, float)) else "     -"

    print(f"\n{'B':>3} {'ctx':>5} " + " ".join(f"{n:>6}" for n in args.sizes) + "   t(N)/t(1)   t(1) ms  AR ms")
    for r in report["runs"]:
        if "ratio" in r:
            t1, ar_s = r["verify_s"][0], r.get("ar_step_s")
            print(f"{r['batch']:>3} {r['ctx']:>5} " + " ".join(f(x) for x in r["ratio"])
                  + f"   {f(t1 * 1e3 if t1 else None)}  {f(ar_s * 1e3 if isinstance(ar_s, float) else None)}")
    print(f"\n{'host overhead (batch 1)':34} {'wall ms':>8} {'busy ms':>8} {'GPU ms':>8} {'overhead':>8} "
          f"{'GPU idle':>8} {'launch ms':>9}")
    for key, r in report["host_overhead"].items():
        if "step_wall_ms_median" in r:
            launch = r.get("graph_launch_host_ms")
            print(f"{key:34} {r['step_wall_ms_median']:8.2f} {r['step_gpu_busy_ms']:8.2f} {r['step_gpu_ms']:8.2f} "
                  f"{100 * r['step_host_overhead_fraction']:7.1f}% {100 * r['step_gpu_idle_fraction']:7.1f}% "
                  f"{f(launch, '9.3f') if launch is not None else '-':>9}")
        else:
            print(f"{key:34} {r.get('error', r.get('skipped', ''))[:80]}")

