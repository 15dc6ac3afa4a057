"""Tree verification on a hybrid (Gated DeltaNet) target: verify cost vs tree size, GDN tree-kernel time per
layer, commit time and extra memory per request, on random bf16 weights in the Qwen3.5-27B shape.

Correctness first (tests/gpu/test_kernels.py checks the Triton GDN tree kernel against the torch tree form at
these heads): on the real shape cut to 4 layers in fp32, the verify logits of a random tree equal those of each
node's own chain (prefill of prompt + path), and the committed state after folding a kept path equals a prefill
of prompt + path. Then, at full depth in bf16,
for N in 1, 8, 16, 32, 64 nodes at batch 1 and 8: t(verify N)/t(verify 1) (GPU time of the engine's verify
path: a CUDA graph per shape, CUDA-event-timed replays), the commit time against the step (the larger of its
GPU time and its host time), the tree kernel alone per layer at 64 nodes (GPU
time from torch.profiler, and the torch form beside it), and the bytes stashed per request (the only memory
a tree adds: no [HV, K, V] state per node). N = 1 is a chain: it updates the state in place (no stash).
Last, the commit alone at the shape's layer count, batch 1 and 8: ops launched (top-level aten ops, and CUDA
kernels on a GPU) and host time of ModelCache.commit_tree (one batched op for all layers and requests) against
the per-layer per-request loop it replaced (ops/gdn_tree/reference.py). On the CPU the heads are cut to a
minimum, so the host time is the dispatch cost alone; `--commit-only` runs just this section.

    python3 -m bench hybrid_tree --out bench/results/hybrid_tree_h200.json
    python3 -m bench hybrid_tree --out /tmp/ht.json --device cpu --shape tiny-hybrid \
        --sizes 1 4 8 --configs 1x32 2x16 --reps 2   # dry run
    python3 -m bench hybrid_tree --out /tmp/hc.json --device cpu --commit-only   # commit launches

Every section runs inside its own try/except (errors are recorded in the JSON), and the JSON is written again
after each section.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time

import torch

from bench.common import Report, attempt, failed, host_ms, make_runner, run_record, sync, time_replays
from bench.trees import random_tree
from specpilot.bench.shapes import SHAPES, random_model
from specpilot.config import EngineConfig, ModelConfig
from specpilot.runtime.cache import ModelCache
from specpilot.runtime.runner import ModelRunner
from specpilot.layers.metadata import BatchMetadata
from specpilot.ops.gated_delta_rule import gdn_gating
from specpilot.ops.gdn_tree import ancestor_mask, chunk, commit_paths_ref, tree_gated_delta_rule
from specpilot.ops.path_index import PathIndex
from specpilot.spec_decode.verify import tree_metadata


def _median_s(fn, device: str, reps: int) -> float:
    for _ in range(2):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def check_fp32(shape: str, device: str, rng: random.Random) -> dict:
    config_cls, kw = SHAPES[shape]
    model = random_model(config_cls(**{**kw, "num_hidden_layers": 4}), device, torch.float32)
    vocab = model.config.vocab_size
    prompt = [rng.randrange(vocab) for _ in range(40)]
    tree = random_tree(12, vocab, rng)
    runner = ModelRunner(model)
    runner.allocate(1, 80)
    runner.prefill(0, prompt)
    # the runner's prefill paths: on a GPU the tree block goes through the tree-attention op
    meta = dataclasses.replace(tree_metadata([tree], [len(prompt)], [0], device), paths=runner.runtime.prefill)
    logits = model.logits(runner.forward(meta))[0].float()
    worst, fold_err = 0.0, 0.0
    paths = tree.paths()
    for path in paths:
        chain = [tree.tokens[i] for i in path]
        fresh = ModelRunner(model)
        fresh.allocate(1, 80)
        fresh.prefill(0, prompt)
        ids = torch.tensor([chain], device=device)
        m = BatchMetadata.contiguous(ids, torch.tensor([len(prompt)], device=device),
                                     torch.tensor([0], device=device), len(prompt), fresh.runtime.prefill)
        ref = model.logits(fresh.forward(m))[0].float()
        worst = max(worst, ((logits[path] - ref).norm() / ref.norm()).item())
        # fold the kept path into a copy of the committed state and compare with the chain prefill's state
        state = runner.cache.ssm.clone(), runner.cache.conv.clone()
        runner.cache.commit_tree(PathIndex.build([0], [0], [path], device))
        fold_err = max(fold_err, ((runner.cache.ssm[:, 0] - fresh.cache.ssm[:, 0]).norm()
                                  / fresh.cache.ssm[:, 0].norm()).item())
        runner.cache.ssm.copy_(state[0])
        runner.cache.conv.copy_(state[1])
        runner.forward(meta)  # restores the stash for the next path
    del model, runner
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"paths": len(paths), "logits_rel_err_max": worst, "fold_state_rel_err_max": fold_err}


@torch.inference_mode()
def sweep(model, device: str, batch: int, ctx: int, sizes: list[int], reps: int, rng: random.Random,
          report: Report) -> dict:
    """Per tree size: the engine's verify path (a CUDA graph per shape on a GPU, chains verified as trees and
    folded as the engine does by default), GPU time of a replay; then the commit of each tree's deepest path
    (K/V compaction + the batched recurrent fold), GPU time by CUDA events and host time by wall clock."""
    vocab = model.config.vocab_size
    gpu = device == "cuda"
    runner = make_runner(model, EngineConfig(block_attention="tree", verify_graphs=gpu))
    runner.allocate(batch, ctx + max(sizes) + reps + 8)
    for b in range(batch):
        runner.prefill(b, [rng.randrange(vocab) for _ in range(ctx)])
    out = {"batch": batch, "ctx": ctx, "path": "verify graphs" if gpu else "eager", "sizes": [], "verify_s": [],
           "commit_gpu_s": [], "commit_host_s": [], "stash_bytes_per_request": [], "errors": {}}
    report["runs"].append(out)
    saved = runner.cache.ssm.clone(), runner.cache.conv.clone()
    for n in sizes:
        r = attempt(f"hybrid b{batch} n{n}", _one_size, model, device, runner, batch, ctx, n, reps, rng, saved)
        if failed(r):
            out["errors"][str(n)] = r["error"]
            continue
        out["sizes"].append(n)
        for key in ("verify_s", "commit_gpu_s", "commit_host_s", "stash_bytes_per_request"):
            out[key].append(r[key])
        print(f"hybrid b{batch} n{n}: verify {r['verify_s'] * 1e3:.2f} ms, commit {r['commit_gpu_s'] * 1e3:.3f} ms "
              f"(host {r['commit_host_s'] * 1e3:.3f} ms)", flush=True)
        report.save()
    if out["sizes"]:
        t1 = out["verify_s"][0]
        out["verify_ratio"] = [t / t1 for t in out["verify_s"]]
        out["commit_fraction_of_step"] = [max(c, h) / (v + max(c, h)) for v, c, h in
                                          zip(out["verify_s"], out["commit_gpu_s"], out["commit_host_s"])]
    report.save()
    runner.verify_graphs.clear()
    runner.cache = None
    return out


def _one_size(model, device, runner, batch, ctx, n, reps, rng, saved) -> dict:
    vocab = model.config.vocab_size
    trees = [random_tree(n, vocab, rng) for _ in range(batch)]
    meta = tree_metadata(trees, [ctx] * batch, list(range(batch)), device, chains_as_trees=True)
    runner.verify(meta)  # captures the graph (GPU) and stashes the fold terms
    graph = next(iter(runner.verify_graphs.values()), None)
    replay = graph.graph.replay if graph is not None else lambda: runner.verify(meta)
    verify_s = time_replays(replay, device, reps)
    runner.verify(meta)  # restores the stash views this shape's graph writes
    stash = runner.cache.tree_stash_bytes() / batch
    # commit the deepest path of each tree: K/V compaction of the attention layers + the recurrent fold; the
    # median of `reps` commits (state and stash put back between them, outside the timing: the first call of a
    # shape also pays one-off costs such as a kernel compile)
    paths = [max(t.paths(), key=len) for t in trees]
    stashed = dict(runner.cache.tree_stash)
    host, gpu = [], []
    for _ in range(max(3, reps)):
        runner.cache.ssm.copy_(saved[0])
        runner.cache.conv.copy_(saved[1])
        runner.cache.tree_stash.update(stashed)
        sync(device)
        t0 = time.perf_counter()
        start = torch.cuda.Event(True) if device == "cuda" else None
        if start is not None:
            start.record()
        runner.cache.commit(list(range(batch)), [ctx] * batch, paths, fold=True)  # as SpecEngine.commit does
        host.append(time.perf_counter() - t0)
        if start is not None:
            end = torch.cuda.Event(True)
            end.record()
        sync(device)
        gpu.append(start.elapsed_time(end) / 1e3 if start is not None else time.perf_counter() - t0)
    host_s, gpu_s = statistics.median(host), statistics.median(gpu)
    runner.cache.ssm.copy_(saved[0])
    runner.cache.conv.copy_(saved[1])
    runner.verify_graphs.clear()
    return {"verify_s": verify_s, "commit_gpu_s": gpu_s, "commit_host_s": host_s, "stash_bytes_per_request": stash}


def _kernel_ms(fn, device: str, reps: int) -> dict:
    """GPU time per call from torch.profiler (kernels only: launch latency excluded), and wall per call."""
    from torch.profiler import ProfilerActivity, profile

    wall = _median_s(fn, device, reps) * 1e3
    if device != "cuda":
        return {"wall_ms": wall}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    busy = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return {"wall_ms": wall, "gpu_ms": busy / 1e3 / reps}


def kernel_per_layer(model, device: str, nodes: int, batch: int, reps: int, rng: random.Random) -> dict:
    """The tree delta-rule op alone, at the layer's real shapes (and the torch form beside it)."""
    cfg = model.config
    H, HV = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    K, V = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    dt = next(model.parameters()).dtype
    q, k = (torch.randn(batch, nodes, H, K, device=device, dtype=dt) for _ in range(2))
    v = torch.randn(batch, nodes, HV, V, device=device, dtype=dt)
    g, beta = gdn_gating(torch.randn(batch, nodes, HV, device=device), torch.randn(batch, nodes, HV, device=device),
                         torch.zeros(HV, device=device), torch.ones(HV, device=device))
    parents = torch.tensor([list(random_tree(nodes, 10, rng).parents) for _ in range(batch)], device=device)
    mask = ancestor_mask(parents)
    S0 = torch.randn(batch, HV, K, V, device=device) * 0.1
    out = {"nodes": nodes, "batch": batch}
    out["op"] = attempt(f"gdn op b{batch}", _kernel_ms, lambda: tree_gated_delta_rule(q, k, v, g, beta, mask, S0),
                        device, reps)
    out["torch_form"] = attempt(f"gdn torch form b{batch}", _kernel_ms,
                                lambda: chunk.tree_gated_delta_rule(q, k, v, g, beta, mask, S0), device, reps)
    op = out["op"]
    out["seconds"] = None if failed(op) else op.get("gpu_ms", op["wall_ms"]) / 1e3
    return out


def _commit_cache(cfg: ModelConfig, device: str, batch: int, nodes: int) -> tuple[ModelCache, list[list[int]]]:
    """A cache at cfg's layer count with a random stash of `batch` trees of `nodes` nodes, written where a verify
    pass writes it, and ragged root-first paths (lengths cycling through nodes, 3, 1, 5, ...)."""
    cache = ModelCache(cfg, batch, 8, device, torch.bfloat16 if device == "cuda" else torch.float32)
    for index in range(cfg.num_linear_layers):
        terms = cache.tree_stash_out(index, batch, nodes)
        for t in terms[:3]:
            t.normal_()
        terms[3].copy_(-torch.rand(terms[3].shape, device=device).cumsum(1))
        cache.tree_stash[index] = terms
    lengths = [nodes, 3, 1, 5, 2, 7, 4, 6]
    return cache, [list(range(min(nodes, lengths[b % len(lengths)]))) for b in range(batch)]


def _count_ops(fn, device: str) -> dict:
    """Top-level aten ops one call dispatches (each at least one launch on a GPU), and CUDA kernels on a GPU."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        sync(device)
    events = prof.events()
    out = {"aten_ops": sum(1 for e in events if e.name.startswith("aten::") and e.cpu_parent is None)}
    if device == "cuda":
        out["cuda_kernels"] = sum(1 for e in events if e.device_type.name == "CUDA")
    return out


@torch.inference_mode()
def commit_overhead(cfg: ModelConfig, device: str, batch: int, nodes: int, reps: int) -> dict:
    if device != "cuda":  # launches do not depend on the head sizes; CPU compute on real ones would swamp them
        cfg = dataclasses.replace(cfg, linear_num_key_heads=1, linear_num_value_heads=1, linear_key_head_dim=4,
                                  linear_value_head_dim=4, num_key_value_heads=1, head_dim=4)
    cache, paths = _commit_cache(cfg, device, batch, nodes)
    stash = dict(cache.tree_stash)
    stacked = [torch.stack(t) for t in zip(*stash.values())]
    rows = list(range(batch))

    def batched():
        cache.commit(rows, [0] * batch, paths, fold=True)  # paths in place: the fold alone
        cache.tree_stash.update(stash)  # the next call folds the same stash again

    def loop():
        commit_paths_ref(cache.ssm, cache.conv, *stacked, rows, rows, paths)

    out = {"linear_layers": cfg.num_linear_layers, "batch": batch, "nodes": nodes, "paths": [len(p) for p in paths]}
    threads = torch.get_num_threads()
    try:
        if device != "cuda":
            # one intra-op thread: the batched ops are just big enough to go parallel, and on a shared CPU the
            # OpenMP barriers then cost milliseconds that have nothing to do with dispatch
            torch.set_num_threads(1)
        for name, fn in (("batched", batched), ("per_layer_loop", loop)):
            fn()
            out[name] = {**_count_ops(fn, device), "host_ms": host_ms(fn, device, reps)}
            if device == "cuda":  # the state traffic: one read and one write of every committed [K, V] state
                out[name]["gpu_ms"] = _kernel_ms(fn, device, reps)["gpu_ms"]
    finally:
        torch.set_num_threads(threads)
    return out


def commit_section(cfg: ModelConfig, device: str, reps: int, report: Report) -> None:
    report["commit_overhead"] = [attempt(f"commit b{b}", commit_overhead, cfg, device, b, 16, reps) for b in (1, 8)]
    print(f"\n{'B':>3} {'layers':>6} {'form':>15} {'aten ops':>8} {'kernels':>7} {'host ms':>8} {'gpu ms':>7}")
    for r in report["commit_overhead"]:
        for form in ("batched", "per_layer_loop"):
            if form in r:
                m = r[form]
                print(f"{r['batch']:>3} {r['linear_layers']:>6} {form:>15} {m['aten_ops']:>8} "
                      f"{m.get('cuda_kernels', '-'):>7} {m['host_ms']:8.3f} {m.get('gpu_ms', float('nan')):7.3f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench hybrid_tree", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shape", default="Qwen3.5-27B")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    p.add_argument("--configs", nargs="+", default=["1x512", "8x512"])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--commit", default=None)
    p.add_argument("--commit-only", action="store_true", help="only the commit launch/host-time section")
    p.add_argument("--skip-checks", action="store_true", help="skip the fp32 4-layer check (run it in an earlier call)")
    args = p.parse_args(argv)
    t_start = time.perf_counter()

    def stamp(section: str) -> None:  # where the time goes on a device with a hard time cap
        report["section_end_s"] = {**report.data.get("section_end_s", {}),
                                   section: round(time.perf_counter() - t_start, 1)}
        print(f"[{time.perf_counter() - t_start:7.1f}s] {section} done", flush=True)
    device = args.device
    rng = random.Random(0)
    torch.manual_seed(0)
    report = Report(args.out, {**run_record(device, args.commit), "shape": args.shape, "runs": []})
    config_cls, kw = SHAPES[args.shape]
    cfg = ModelConfig.from_dict(config_cls(**kw).to_dict())
    if args.commit_only:
        commit_section(cfg, device, args.reps, report)
        return
    report["gdn_tree_impl"] = "triton" if device == "cuda" else "torch form (CPU)"
    if not args.skip_checks:
        report["correctness_fp32_4_layers"] = attempt("fp32 check", check_fp32, args.shape, device, rng)
        print("fp32 check", report["correctness_fp32_4_layers"], flush=True)
    stamp("checks")
    model = random_model(config_cls(**kw), device)
    stamp("model build")
    c = model.config
    # what a state snapshot per node would cost (the fold avoids it), for scale
    report["state_bytes_per_node_if_snapshotted"] = (c.num_linear_layers * c.linear_num_value_heads
                                                     * c.linear_key_head_dim * c.linear_value_head_dim * 4)
    for conf in args.configs:
        batch, ctx = map(int, conf.split("x"))
        r = attempt(f"sweep {conf}", sweep, model, device, batch, ctx, args.sizes, args.reps, rng, report)
        if failed(r):
            report["runs"].append({"batch": batch, "ctx": ctx, **r})
            continue
        print(json.dumps({k: r.get(k) for k in ("batch", "verify_ratio", "commit_fraction_of_step", "errors")}),
              flush=True)
        stamp(f"sweep {conf}")
        if device == "cuda":
            torch.cuda.empty_cache()
    report["tree_kernel_per_layer"] = [attempt(f"kernel b{b}", kernel_per_layer, model, device, max(args.sizes), b,
                                               args.reps, rng) for b in (1, 8)]
    print(json.dumps(report["tree_kernel_per_layer"])[:1500])
    stamp("tree kernel per layer")
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    commit_section(cfg, device, args.reps, report)
    stamp("commit section")
    report.save()
    print(f"\n{'B':>3} {'N':>4} {'verify ms':>9} {'ratio':>6} {'commit gpu ms':>13} {'host ms':>8} {'% step':>6} "
          f"{'stash MiB/req':>13}")
    for r in report["runs"]:
        for i, n in enumerate(r.get("sizes", [])):
            print(f"{r['batch']:>3} {n:>4} {1e3 * r['verify_s'][i]:9.2f} {r['verify_ratio'][i]:6.2f} "
                  f"{1e3 * r['commit_gpu_s'][i]:13.3f} {1e3 * r['commit_host_s'][i]:8.3f} "
                  f"{100 * r['commit_fraction_of_step'][i]:6.1f} {r['stash_bytes_per_request'][i] / 2**20:13.2f}")

