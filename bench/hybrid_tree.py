"""Tree verification on a hybrid (Gated DeltaNet) target: verify cost vs tree size, GDN tree-kernel time per
layer, commit time and extra memory per request, on random bf16 weights in the Qwen3.5-27B shape.

Correctness first: the Triton GDN tree kernel against the torch tree form at the layer's real heads (if it
fails, the rest runs on the torch form, labelled "gdn_tree_impl"); then, on the real shape cut to 4 layers in
fp32, the verify logits of a random tree equal those of each node's own chain (prefill of prompt + path), and
the committed state after folding a kept path equals a prefill of prompt + path. Then, at full depth in bf16,
for N in 1, 8, 16, 32, 64 nodes at batch 1 and 8: t(verify N)/t(verify 1) (GPU time of the engine's verify
path: a CUDA graph per shape, CUDA-event-timed replays), the commit time against the step (the larger of its
GPU time and its host time), the tree kernel alone per layer at 64 nodes (GPU
time from torch.profiler, and the torch form beside it), and the bytes stashed per request (the only memory
a tree adds: no [HV, K, V] state per node). N = 1 is a chain: it updates the state in place (no stash).
Last, the commit alone at the shape's layer count, batch 1 and 8: ops launched (top-level aten ops, and CUDA
kernels on a GPU) and host time of ModelCache.commit_tree (one batched op for all layers and requests) against
the per-layer per-request loop it replaced (ops/gdn_tree/reference.py). On the CPU the heads are cut to a
minimum, so the host time is the dispatch cost alone; `--commit-only` runs just this section.

    PYTHONPATH=. python3 bench/hybrid_tree.py --out bench/results/hybrid_tree_h200.json
    PYTHONPATH=. python3 bench/hybrid_tree.py --out /tmp/ht.json --device cpu --shape tiny-hybrid \
        --sizes 1 4 8 --configs 1x32 2x16 --reps 2   # dry run
    PYTHONPATH=. python3 bench/hybrid_tree.py --out /tmp/hc.json --device cpu --commit-only   # commit launches

Every section runs inside its own try/except (errors are recorded in the JSON), and the JSON is written again
after each section.
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

import bench.ar_decode as ar
import specpilot.ops.gdn_tree as gdn_tree_op
from bench.common import Report, attempt, failed, host_ms, kernel_crashed, run_record
from bench.verify_cost import random_tree
from specpilot.config import EngineConfig, ModelConfig
from specpilot.runtime.cache import ModelCache
from specpilot.runtime.runner import ModelRunner
from specpilot.layers.metadata import BatchMetadata
from specpilot.ops.gated_delta_rule import gdn_gating
from specpilot.ops.gdn_tree import ancestor_mask, chunk, commit_paths_ref, tree_gated_delta_rule
from specpilot.ops.path_index import PathIndex
from specpilot.spec_decode.verify import tree_metadata


def _sync():
    if ar.DEVICE == "cuda":
        torch.cuda.synchronize()


def _median_s(fn, reps: int) -> float:
    for _ in range(2):
        fn()
    _sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check_gdn_kernel(cfg) -> dict:
    """The Triton tree delta rule vs the torch tree form at this model's heads, trees of 8 and 64 nodes."""
    from bench.kernel_check import check_gdn_tree

    if ar.DEVICE != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return {"skipped": "Triton on the CPU needs TRITON_INTERPRET=1"}
    dtype = torch.bfloat16 if ar.DEVICE == "cuda" else torch.float32
    out = {}
    for T in (8, 64):
        out[f"T{T}"] = attempt(f"gdn kernel check T={T}", check_gdn_tree, ar.DEVICE, dtype, B=2, T=T,
                               H=cfg.linear_num_key_heads, HV=cfg.linear_num_value_heads,
                               K=cfg.linear_key_head_dim, V=cfg.linear_value_head_dim)
    runs = [r for r in out.values() if "tol" in r]
    out["max_rel_rms_err"] = max((r["rel_rms_err"] for r in runs), default=None)
    out["ok"] = len(runs) == 2 and all(r["rel_rms_err"] <= r["tol"] and not r["nan"] for r in runs)
    return out


def use_torch_tree_form() -> None:
    """From now on the GDN tree op runs its torch form (chunk.py) on the GPU too."""
    gdn_tree_op.use_triton = lambda x: False


@torch.inference_mode()
def check_fp32(shape: str, rng: random.Random) -> dict:
    config_cls, kw = ar.SHAPES[shape]
    model = ar.random_model(config_cls(**{**kw, "num_hidden_layers": 4}), torch.float32)
    vocab, dev = model.config.vocab_size, ar.DEVICE
    prompt = [rng.randrange(vocab) for _ in range(40)]
    tree = random_tree(12, vocab, rng)
    runner = ModelRunner(model)
    runner.allocate(1, 80)
    runner.prefill(0, prompt)
    meta = tree_metadata([tree], [len(prompt)], [0], dev)
    logits = model.logits(runner.forward(meta))[0].float()
    worst, fold_err = 0.0, 0.0
    paths = tree.paths()
    for path in paths:
        chain = [tree.tokens[i] for i in path]
        fresh = ModelRunner(model)
        fresh.allocate(1, 80)
        fresh.prefill(0, prompt)
        ids = torch.tensor([chain], device=dev)
        m = BatchMetadata.contiguous(ids, torch.tensor([len(prompt)], device=dev), torch.tensor([0], device=dev),
                                     len(prompt))
        ref = model.logits(fresh.forward(m))[0].float()
        worst = max(worst, ((logits[path] - ref).norm() / ref.norm()).item())
        # fold the kept path into a copy of the committed state and compare with the chain prefill's state
        state = runner.cache.ssm.clone(), runner.cache.conv.clone()
        runner.cache.commit_tree(PathIndex.build([0], [0], [path], dev))
        fold_err = max(fold_err, ((runner.cache.ssm[:, 0] - fresh.cache.ssm[:, 0]).norm()
                                  / fresh.cache.ssm[:, 0].norm()).item())
        runner.cache.ssm.copy_(state[0])
        runner.cache.conv.copy_(state[1])
        runner.forward(meta)  # restores the stash for the next path
    del model, runner
    if ar.DEVICE == "cuda":
        torch.cuda.empty_cache()
    return {"paths": len(paths), "logits_rel_err_max": worst, "fold_state_rel_err_max": fold_err}


@torch.inference_mode()
def sweep(model, batch: int, ctx: int, sizes: list[int], reps: int, rng: random.Random, report: Report) -> dict:
    """Per tree size: the engine's verify path (a CUDA graph per shape on a GPU, chains verified as trees and
    folded as the engine does by default), GPU time of a replay; then the commit of each tree's deepest path
    (K/V compaction + the batched recurrent fold), GPU time by CUDA events and host time by wall clock."""
    vocab = model.config.vocab_size
    gpu = ar.DEVICE == "cuda"
    runner = ModelRunner(model, EngineConfig(block_attention="tree", verify_graphs=gpu))
    runner.allocate(batch, ctx + max(sizes) + reps + 8)
    for b in range(batch):
        runner.prefill(b, [rng.randrange(vocab) for _ in range(ctx)])
    out = {"batch": batch, "ctx": ctx, "path": "verify graphs" if gpu else "eager", "sizes": [], "verify_s": [],
           "commit_gpu_s": [], "commit_host_s": [], "stash_bytes_per_request": [], "errors": {}}
    report["runs"].append(out)
    saved = runner.cache.ssm.clone(), runner.cache.conv.clone()
    for n in sizes:
        r = attempt(f"hybrid b{batch} n{n}", _one_size, model, runner, batch, ctx, n, reps, rng, saved)
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


def _one_size(model, runner, batch, ctx, n, reps, rng, saved) -> dict:
    import bench.verify_cost as vc

    vocab, dev = model.config.vocab_size, ar.DEVICE
    vc.DEVICE = dev
    trees = [random_tree(n, vocab, rng) for _ in range(batch)]
    meta = tree_metadata(trees, [ctx] * batch, list(range(batch)), dev, chains_as_trees=True)
    runner.verify(meta)  # captures the graph (GPU) and stashes the fold terms
    graph = next(iter(runner.verify_graphs.values()), None)
    replay = graph.graph.replay if graph is not None else lambda: runner.verify(meta)
    verify_s = vc.time_replays(replay, reps)
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
        _sync()
        t0 = time.perf_counter()
        start = torch.cuda.Event(True) if dev == "cuda" else None
        if start is not None:
            start.record()
        runner.cache.commit(list(range(batch)), [ctx] * batch, paths, fold=True)  # as SpecEngine.commit does
        host.append(time.perf_counter() - t0)
        if start is not None:
            end = torch.cuda.Event(True)
            end.record()
        _sync()
        gpu.append(start.elapsed_time(end) / 1e3 if start is not None else time.perf_counter() - t0)
    host_s, gpu_s = statistics.median(host), statistics.median(gpu)
    runner.cache.ssm.copy_(saved[0])
    runner.cache.conv.copy_(saved[1])
    runner.verify_graphs.clear()
    return {"verify_s": verify_s, "commit_gpu_s": gpu_s, "commit_host_s": host_s, "stash_bytes_per_request": stash}


def _kernel_ms(fn, reps: int) -> dict:
    """GPU time per call from torch.profiler (kernels only: launch latency excluded), and wall per call."""
    from torch.profiler import ProfilerActivity, profile

    wall = _median_s(fn, reps) * 1e3
    if ar.DEVICE != "cuda":
        return {"wall_ms": wall}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    busy = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return {"wall_ms": wall, "gpu_ms": busy / 1e3 / reps}


def kernel_per_layer(model, nodes: int, batch: int, reps: int, rng: random.Random) -> dict:
    """The tree delta-rule op alone, at the layer's real shapes (and the torch form beside it)."""
    cfg, dev = model.config, ar.DEVICE
    H, HV = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    K, V = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    dt = next(model.parameters()).dtype
    q, k = (torch.randn(batch, nodes, H, K, device=dev, dtype=dt) for _ in range(2))
    v = torch.randn(batch, nodes, HV, V, device=dev, dtype=dt)
    g, beta = gdn_gating(torch.randn(batch, nodes, HV, device=dev), torch.randn(batch, nodes, HV, device=dev),
                         torch.zeros(HV, device=dev), torch.ones(HV, device=dev))
    parents = torch.tensor([list(random_tree(nodes, 10, rng).parents) for _ in range(batch)], device=dev)
    mask = ancestor_mask(parents)
    S0 = torch.randn(batch, HV, K, V, device=dev) * 0.1
    out = {"nodes": nodes, "batch": batch}
    out["op"] = attempt(f"gdn op b{batch}", _kernel_ms, lambda: tree_gated_delta_rule(q, k, v, g, beta, mask, S0),
                        reps)
    out["torch_form"] = attempt(f"gdn torch form b{batch}", _kernel_ms,
                                lambda: chunk.tree_gated_delta_rule(q, k, v, g, beta, mask, S0), reps)
    op = out["op"]
    out["seconds"] = None if failed(op) else op.get("gpu_ms", op["wall_ms"]) / 1e3
    return out


def _commit_cache(cfg: ModelConfig, batch: int, nodes: int) -> tuple[ModelCache, list[list[int]]]:
    """A cache at cfg's layer count with a random stash of `batch` trees of `nodes` nodes, written where a verify
    pass writes it, and ragged root-first paths (lengths cycling through nodes, 3, 1, 5, ...)."""
    cache = ModelCache(cfg, batch, 8, ar.DEVICE, torch.bfloat16 if ar.DEVICE == "cuda" else torch.float32)
    for index in range(cfg.num_linear_layers):
        terms = cache.tree_stash_out(index, batch, nodes)
        for t in terms[:3]:
            t.normal_()
        terms[3].copy_(-torch.rand(terms[3].shape, device=ar.DEVICE).cumsum(1))
        cache.tree_stash[index] = terms
    lengths = [nodes, 3, 1, 5, 2, 7, 4, 6]
    return cache, [list(range(min(nodes, lengths[b % len(lengths)]))) for b in range(batch)]


def _count_ops(fn) -> dict:
    """Top-level aten ops one call dispatches (each at least one launch on a GPU), and CUDA kernels on a GPU."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ar.DEVICE == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        _sync()
    events = prof.events()
    out = {"aten_ops": sum(1 for e in events if e.name.startswith("aten::") and e.cpu_parent is None)}
    if ar.DEVICE == "cuda":
        out["cuda_kernels"] = sum(1 for e in events if e.device_type.name == "CUDA")
    return out


@torch.inference_mode()
def commit_overhead(cfg: ModelConfig, batch: int, nodes: int, reps: int) -> dict:
    if ar.DEVICE != "cuda":  # launches do not depend on the head sizes; CPU compute on real ones would swamp them
        cfg = dataclasses.replace(cfg, linear_num_key_heads=1, linear_num_value_heads=1, linear_key_head_dim=4,
                                  linear_value_head_dim=4, num_key_value_heads=1, head_dim=4)
    cache, paths = _commit_cache(cfg, batch, nodes)
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
        if ar.DEVICE != "cuda":
            # one intra-op thread: the batched ops are just big enough to go parallel, and on a shared CPU the
            # OpenMP barriers then cost milliseconds that have nothing to do with dispatch
            torch.set_num_threads(1)
        for name, fn in (("batched", batched), ("per_layer_loop", loop)):
            fn()
            out[name] = {**_count_ops(fn), "host_ms": host_ms(fn, ar.DEVICE, reps)}
            if ar.DEVICE == "cuda":  # the state traffic: one read and one write of every committed [K, V] state
                out[name]["gpu_ms"] = _kernel_ms(fn, reps)["gpu_ms"]
    finally:
        torch.set_num_threads(threads)
    return out


def commit_section(cfg: ModelConfig, reps: int, report: Report) -> None:
    report["commit_overhead"] = [attempt(f"commit b{b}", commit_overhead, cfg, b, 16, reps) for b in (1, 8)]
    print(f"\n{'B':>3} {'layers':>6} {'form':>15} {'aten ops':>8} {'kernels':>7} {'host ms':>8} {'gpu ms':>7}")
    for r in report["commit_overhead"]:
        for form in ("batched", "per_layer_loop"):
            if form in r:
                m = r[form]
                print(f"{r['batch']:>3} {r['linear_layers']:>6} {form:>15} {m['aten_ops']:>8} "
                      f"{m.get('cuda_kernels', '-'):>7} {m['host_ms']:8.3f} {m.get('gpu_ms', float('nan')):7.3f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shape", default="Qwen3.5-27B")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    p.add_argument("--configs", nargs="+", default=["1x512", "8x512"])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--commit", default=None)
    p.add_argument("--commit-only", action="store_true", help="only the commit launch/host-time section")
    p.add_argument("--skip-checks", action="store_true",
                   help="skip the GDN kernel check and the fp32 4-layer check (run them in an earlier call)")
    args = p.parse_args()
    t_start = time.perf_counter()

    def stamp(section: str) -> None:  # where the time goes on a device with a hard time cap
        report["section_end_s"] = {**report.data.get("section_end_s", {}),
                                   section: round(time.perf_counter() - t_start, 1)}
        print(f"[{time.perf_counter() - t_start:7.1f}s] {section} done", flush=True)
    ar.DEVICE = args.device
    rng = random.Random(0)
    torch.manual_seed(0)
    report = Report(args.out, {**run_record(ar.DEVICE, args.commit), "shape": args.shape, "runs": []})
    config_cls, kw = ar.SHAPES[args.shape]
    cfg = ModelConfig.from_dict(config_cls(**kw).to_dict())
    if args.commit_only:
        commit_section(cfg, args.reps, report)
        return
    gdn_crash = kernel_crashed("gdn_tree")
    crashed = gdn_crash or ("--skip-checks" if args.skip_checks else None)
    check = {"skipped": crashed} if crashed else check_gdn_kernel(cfg)
    report["gdn_kernel_check"] = check
    print("gdn kernel check", json.dumps(check)[:600], flush=True)
    # --skip-checks alone trusts the kernel (checked by an earlier run); a crash verdict or a failed check does not
    if ar.DEVICE == "cuda" and (gdn_crash or (not args.skip_checks and not check.get("ok"))):
        use_torch_tree_form()
        report["gdn_tree_impl"] = "torch form (chunk.py): the Triton kernel failed its check"
    else:
        report["gdn_tree_impl"] = ("triton" + (" (unchecked: --skip-checks)" if args.skip_checks else "")
                                   if ar.DEVICE == "cuda" else "torch form (CPU)")
    if not args.skip_checks:
        report["correctness_fp32_4_layers"] = attempt("fp32 check", check_fp32, args.shape, rng)
        print("fp32 check", report["correctness_fp32_4_layers"], flush=True)
    stamp("checks")
    model = ar.random_model(config_cls(**kw))
    stamp("model build")
    c = model.config
    # what a state snapshot per node would cost (the fold avoids it), for scale
    report["state_bytes_per_node_if_snapshotted"] = (c.num_linear_layers * c.linear_num_value_heads
                                                     * c.linear_key_head_dim * c.linear_value_head_dim * 4)
    for conf in args.configs:
        batch, ctx = map(int, conf.split("x"))
        r = attempt(f"sweep {conf}", sweep, model, batch, ctx, args.sizes, args.reps, rng, report)
        if failed(r):
            report["runs"].append({"batch": batch, "ctx": ctx, **r})
            continue
        print(json.dumps({k: r.get(k) for k in ("batch", "verify_ratio", "commit_fraction_of_step", "errors")}),
              flush=True)
        stamp(f"sweep {conf}")
        if ar.DEVICE == "cuda":
            torch.cuda.empty_cache()
    report["tree_kernel_per_layer"] = [attempt(f"kernel b{b}", kernel_per_layer, model, max(args.sizes), b,
                                               args.reps, rng) for b in (1, 8)]
    print(json.dumps(report["tree_kernel_per_layer"])[:1500])
    stamp("tree kernel per layer")
    del model
    if ar.DEVICE == "cuda":
        torch.cuda.empty_cache()
    commit_section(cfg, args.reps, report)
    stamp("commit section")
    report.save()
    print(f"\n{'B':>3} {'N':>4} {'verify ms':>9} {'ratio':>6} {'commit gpu ms':>13} {'host ms':>8} {'% step':>6} "
          f"{'stash MiB/req':>13}")
    for r in report["runs"]:
        for i, n in enumerate(r.get("sizes", [])):
            print(f"{r['batch']:>3} {n:>4} {1e3 * r['verify_s'][i]:9.2f} {r['verify_ratio'][i]:6.2f} "
                  f"{1e3 * r['commit_gpu_s'][i]:13.3f} {1e3 * r['commit_host_s'][i]:8.3f} "
                  f"{100 * r['commit_fraction_of_step'][i]:6.1f} {r['stash_bytes_per_request'][i] / 2**20:13.2f}")


if __name__ == "__main__":
    main()
