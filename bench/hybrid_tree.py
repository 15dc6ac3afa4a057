"""Tree verification on a hybrid (Gated DeltaNet) target: verify cost vs tree size, GDN tree-kernel time per
layer, commit time and extra memory per request, on random bf16 weights in the Qwen3.5-27B shape.

Correctness first: on the real shape cut to 4 layers in fp32, the verify logits of a random tree equal those of
each node's own chain (prefill of prompt + path), and the committed state after folding a kept path equals a
prefill of prompt + path. Then, at full depth in bf16, for N in 1, 8, 16, 32, 64 nodes at batch 1 and 8:
t(verify N)/t(verify 1), the commit time against the step, the tree kernel alone per layer at 64 nodes, and
the bytes stashed per request (the only memory a tree adds: no [HV, K, V] state per node).

    PYTHONPATH=. python3 bench/hybrid_tree.py --out bench/results/hybrid_tree_h200.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

import torch
import transformers

import bench.ar_decode as ar
from bench.verify_cost import random_tree
from specpilot.engine.runner import ModelRunner
from specpilot.layers.metadata import BatchMetadata
from specpilot.ops.gated_delta_rule import gdn_gating
from specpilot.ops.gdn_tree import ancestor_mask, tree_gated_delta_rule
from specpilot.spec.verify import tree_metadata


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
        runner.cache.commit_tree([0], [0], [path])
        fold_err = max(fold_err, ((runner.cache.ssm[:, 0] - fresh.cache.ssm[:, 0]).norm()
                                  / fresh.cache.ssm[:, 0].norm()).item())
        runner.cache.ssm.copy_(state[0])
        runner.cache.conv.copy_(state[1])
        runner.forward(meta)  # restores the stash for the next path
    return {"paths": len(paths), "logits_rel_err_max": worst, "fold_state_rel_err_max": fold_err}


@torch.inference_mode()
def sweep(model, batch: int, ctx: int, sizes: list[int], reps: int, rng: random.Random) -> dict:
    vocab, dev = model.config.vocab_size, ar.DEVICE
    runner = ModelRunner(model)
    runner.allocate(batch, ctx + max(sizes) + 8)
    for b in range(batch):
        runner.prefill(b, [rng.randrange(vocab) for _ in range(ctx)])
    out = {"batch": batch, "ctx": ctx, "sizes": sizes, "verify_s": [], "commit_s": [], "stash_bytes_per_request": []}
    saved = runner.cache.ssm.clone(), runner.cache.conv.clone()
    for n in sizes:
        trees = [random_tree(n, vocab, rng) for _ in range(batch)]
        meta = tree_metadata(trees, [ctx] * batch, list(range(batch)), dev)
        out["verify_s"].append(_median_s(lambda: model.logits(runner.forward(meta)), reps))
        out["stash_bytes_per_request"].append(runner.cache.tree_stash_bytes() / batch)
        # commit the deepest path of each tree: K/V compaction of the attention layers + the recurrent fold
        paths = [max(t.paths(), key=len) for t in trees]
        runner.forward(meta)
        _sync()
        t0 = time.perf_counter()
        for b, path in enumerate(paths):
            runner.cache.keep(b, ctx + torch.tensor(path, device=dev), ctx)
        runner.cache.commit_tree(list(range(batch)), list(range(batch)), paths)
        _sync()
        out["commit_s"].append(time.perf_counter() - t0)
        runner.cache.ssm.copy_(saved[0])
        runner.cache.conv.copy_(saved[1])
    t1 = out["verify_s"][0]
    out["verify_ratio"] = [t / t1 for t in out["verify_s"]]
    out["commit_fraction_of_step"] = [c / (v + c) for v, c in zip(out["verify_s"], out["commit_s"])]
    return out


def kernel_per_layer(model, nodes: int, batch: int, reps: int, rng: random.Random) -> dict:
    """The tree delta-rule kernel alone, at the layer's real shapes."""
    cfg, dev = model.config, ar.DEVICE
    H, HV, K, V = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    dt = next(model.parameters()).dtype
    q, k = (torch.randn(batch, nodes, H, K, device=dev, dtype=dt) for _ in range(2))
    v = torch.randn(batch, nodes, HV, V, device=dev, dtype=dt)
    g, beta = gdn_gating(torch.randn(batch, nodes, HV, device=dev), torch.randn(batch, nodes, HV, device=dev),
                         torch.zeros(HV, device=dev), torch.ones(HV, device=dev))
    parents = torch.tensor([list(random_tree(nodes, 10, rng).parents) for _ in range(batch)], device=dev)
    mask = ancestor_mask(parents)
    S0 = torch.randn(batch, HV, K, V, device=dev) * 0.1
    s = _median_s(lambda: tree_gated_delta_rule(q, k, v, g, beta, mask, S0), reps)
    return {"nodes": nodes, "batch": batch, "seconds": s}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shape", default="Qwen3.5-27B")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    p.add_argument("--configs", nargs="+", default=["1x512", "8x512"])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--commit", default=None)
    args = p.parse_args()
    ar.DEVICE = args.device
    rng = random.Random(0)
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"gpu": torch.cuda.get_device_name() if ar.DEVICE == "cuda" else "cpu", "torch": torch.__version__,
           "transformers": transformers.__version__, "commit": commit, "command": " ".join(sys.argv),
           "date": time.strftime("%Y-%m-%d"), "shape": args.shape}
    out["correctness_fp32_4_layers"] = check_fp32(args.shape, rng)
    print("fp32 check", out["correctness_fp32_4_layers"], flush=True)
    config_cls, kw = ar.SHAPES[args.shape]
    model = ar.random_model(config_cls(**kw))
    out["runs"] = []
    for c in args.configs:
        batch, ctx = map(int, c.split("x"))
        out["runs"].append(sweep(model, batch, ctx, args.sizes, args.reps, rng))
        print(json.dumps({k: out["runs"][-1][k] for k in ("batch", "verify_ratio", "commit_fraction_of_step")}),
              flush=True)
    out["tree_kernel_per_layer"] = [kernel_per_layer(model, max(args.sizes), b, args.reps, rng) for b in (1, 8)]
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out["tree_kernel_per_layer"]))


if __name__ == "__main__":
    main()
