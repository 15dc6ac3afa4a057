"""Cost of verifying N tree tokens in one target forward, relative to one token: t(N) / t(1).

Random-weight bf16 target in a real shape (Qwen3-8B by default) at batch 1 and 8, contexts 512 and 4096.
Each request verifies a random tree of N nodes (topological, depth <= 8) under its ancestor mask. Both
block-attention paths run side by side: "sdpa" (masked SDPA over the gathered prefix + block) and "tree" (the
tree-attention op). Times are medians of CUDA-event-timed forwards after warm-up. Correctness first: the
two paths' logits agree, and the tree path matches the SDPA path on every node.

    PYTHONPATH=. python3 bench/verify_cost.py --out bench/results/verify_cost_h200.json

Also recorded: the wall time per SpecEngine step at batch 1 (chain of 4, an n-gram drafter on a repetitive
prompt) and its split by component (each component synchronised). Not yet a clean host-overhead figure: that
needs the verify forward captured as a CUDA graph, so that its launches stop counting as host time.
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

from bench.ar_decode import SHAPES, random_model
from specpilot.config import EngineConfig
from specpilot.engine.engine import SpecEngine
from specpilot.engine.runner import ModelRunner
from specpilot.engine.sampling import SamplingParams
from specpilot.spec.drafters.ngram import NgramDrafter
from specpilot.spec.tree import DraftTree, TreeSpec
from specpilot.spec.verify import tree_metadata

DEVICE = "cuda"


def random_tree(n: int, vocab: int, rng: random.Random) -> DraftTree:
    parents, depth = [-1], [0]
    for i in range(1, n):
        p = rng.randrange(max(0, i - 8), i)
        while depth[p] >= 8:
            p = parents[p]
        parents.append(p)
        depth.append(depth[p] + 1)
    return DraftTree(tuple(rng.randrange(vocab) for _ in range(n)), tuple(parents))


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def time_forward(runner, meta, reps: int) -> float:
    """Median seconds of one verify forward (logits of every node) after warm-up."""
    for _ in range(3):
        runner.model.logits(runner.forward(meta))
    _sync()
    times = []
    for _ in range(reps):
        if DEVICE == "cuda":
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            runner.model.logits(runner.forward(meta))
            end.record()
            times.append((start, end))
        else:
            t0 = time.perf_counter()
            runner.model.logits(runner.forward(meta))
            times.append(time.perf_counter() - t0)
    _sync()
    if DEVICE == "cuda":
        return statistics.median(s.elapsed_time(e) for s, e in times) / 1e3
    return statistics.median(times)


@torch.inference_mode()
def sweep(model, batch: int, ctx: int, sizes: list[int], reps: int, rng: random.Random) -> dict:
    vocab = model.config.vocab_size
    runners = {name: ModelRunner(model, EngineConfig(block_attention=name)) for name in ("sdpa", "tree")}
    shared = runners["sdpa"]
    shared.allocate(batch, ctx + max(sizes) + 8)
    for b in range(batch):
        shared.prefill(b, [rng.randrange(vocab) for _ in range(ctx)])
    runners["tree"].cache = shared.cache  # the same committed prefix for both paths
    out = {"batch": batch, "ctx": ctx, "sizes": sizes, "sdpa_s": [], "tree_s": [], "max_rel_diff": []}
    for n in sizes:
        trees = [random_tree(n, vocab, rng) for _ in range(batch)]
        meta = tree_metadata(trees, [ctx] * batch, list(range(batch)), DEVICE)
        a = model.logits(runners["sdpa"].forward(meta)).float()
        b = model.logits(runners["tree"].forward(meta)).float()
        out["max_rel_diff"].append(((a - b).norm() / a.norm()).item())
        for name in ("sdpa", "tree"):
            out[f"{name}_s"].append(time_forward(runners[name], meta, reps))
    for name in ("sdpa", "tree"):
        t1 = out[f"{name}_s"][0]
        out[f"{name}_ratio"] = [t / t1 for t in out[f"{name}_s"]]
    return out


def host_overhead(model, steps: int, rng: random.Random) -> dict:
    """Wall time per SpecEngine step and its component split (batch 1, chain:4)."""
    base = [rng.randrange(model.config.vocab_size) for _ in range(64)]
    runner = ModelRunner(model)
    engine = SpecEngine(runner, NgramDrafter(), TreeSpec.parse("chain:4"))
    engine.generate([base * 4], SamplingParams(max_new_tokens=8))  # warm-up
    t0 = time.perf_counter()
    results = engine.generate([base * 4], SamplingParams(max_new_tokens=steps))
    wall = time.perf_counter() - t0
    stats = results[0][1]
    return {"steps": stats.steps, "wall_s_per_step": wall / max(stats.steps, 1), "seconds": stats.seconds,
            "tau": stats.tau}


def main() -> None:
    global DEVICE
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shape", default="Qwen3-8B")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    p.add_argument("--configs", nargs="+", default=["1x512", "1x4096", "8x512", "8x4096"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--commit", default=None)
    args = p.parse_args()
    DEVICE = args.device
    import bench.ar_decode as ar

    ar.DEVICE = DEVICE
    rng = random.Random(0)
    config_cls, kw = SHAPES[args.shape]
    model = random_model(config_cls(**kw))
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
           "transformers": transformers.__version__, "commit": commit, "command": " ".join(sys.argv),
           "date": time.strftime("%Y-%m-%d"), "shape": args.shape, "runs": []}
    for c in args.configs:
        batch, ctx = map(int, c.split("x"))
        r = sweep(model, batch, ctx, args.sizes, args.reps, rng)
        out["runs"].append(r)
        print(json.dumps({k: r[k] for k in ("batch", "ctx", "sdpa_ratio", "tree_ratio", "max_rel_diff")}), flush=True)
    out["host_overhead"] = host_overhead(model, 64, rng)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\n{'B':>3} {'ctx':>5} " + " ".join(f"{n:>6}" for n in args.sizes))
    for r in out["runs"]:
        for name in ("sdpa", "tree"):
            print(f"{r['batch']:>3} {r['ctx']:>5} " + " ".join(f"{x:6.2f}" for x in r[f"{name}_ratio"]) + f"  {name}")
    print("host overhead:", json.dumps(out["host_overhead"]))


if __name__ == "__main__":
    main()
