"""The Triton GDN tree kernel alone, per (requests, nodes, warps), at one linear layer of the Qwen3.5-27B shape:
GPU time (CUDA-graph replays of back-to-back calls over 8 input sets, so no launch overhead and no state left in
L2) and its error against the torch tree form (chunk.py), also timed. The table behind ops/gdn_tree/triton.py's
TREE_GDN_CONFIG: warps and the fp32 products' dot precision (ieee FMAs vs tf32 or tf32x3 tensor cores: time, and
the error of the output and of the fp32 stash the commit folds into the state).

    python3 -m bench gdn_tree_kernel --out bench/results/gdn_tree_kernel_h200.json
    TRITON_INTERPRET=1 python3 -m bench gdn_tree_kernel --out /tmp/gk.json --device cpu \
        --batches 1 --nodes 4 --warps 4 --precisions ieee --reps 1 --heads 2 6 --dim 16   # dry run
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch

from bench.common import Report, attempt, graph_ms, rel_err, run_record, time_ms
from bench.trees import random_tree
from specpilot.ops.gdn_tree import ancestor_mask, chunk
from specpilot.ops.gdn_tree import triton as kernels


def inputs(B: int, T: int, H: int, HV: int, D: int, device: str, rng: random.Random):
    trees = [random_tree(T, 1000, rng) for _ in range(B)]
    parents = torch.tensor([list(t.parents) for t in trees], device=device)
    mask = ancestor_mask(parents)
    q, k = (torch.randn(B, T, H, D, device=device, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(B, T, HV, D, device=device, dtype=torch.bfloat16)
    g = -torch.rand(B, T, HV, device=device) * 0.5
    beta = torch.rand(B, T, HV, device=device)
    state = torch.randn(B, HV, D, D, device=device) * 0.1
    return q, k, v, g, beta, mask, state


def per_call_ms(fn, sets: list, reps: int, device: str) -> float:
    """Median ms per call of fn(*inputs): on a GPU CUDA-graph replays of back-to-back calls rotating over the input
    sets (the kernel alone, no launch overhead; states not found in L2), on the CPU eager calls."""
    if torch.device(device).type == "cuda":
        return graph_ms(lambda i: fn(*sets[i % len(sets)]), calls=4 * len(sets), reps=reps)
    return statistics.median(time_ms(lambda: fn(*sets[0]), device, reps, warmup=1))


@torch.inference_mode()
def one(sets, B, T, warps, precision, reps, device) -> dict:
    ref, (_, ref_u, _) = chunk.tree_gated_delta_rule(*sets[0])
    out, (_, u, _) = kernels.tree_gated_delta_rule(*sets[0], num_warps=warps, precision=precision)
    err = rel_err(out.float(), ref.float())
    ms = per_call_ms(lambda *a: kernels.tree_gated_delta_rule(*a, num_warps=warps, precision=precision), sets, reps,
                     device)
    return {"batch": B, "nodes": T, "num_warps": warps, "precision": precision, "kernel_ms": ms, **err,
            "stash_u_rel_rms_err": rel_err(u, ref_u)["rel_rms_err"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench gdn_tree_kernel", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--nodes", type=int, nargs="+", default=[8, 32, 64])
    p.add_argument("--warps", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--precisions", nargs="+", default=["ieee", "tf32"], choices=["ieee", "tf32", "tf32x3"])
    p.add_argument("--heads", type=int, nargs=2, default=[16, 48], help="key heads, value heads (27B: 16 48)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    rng = random.Random(0)
    torch.manual_seed(0)
    report = Report(args.out, {**run_record(args.device, args.commit), "heads": args.heads, "dim": args.dim,
                               "default_config": kernels.TREE_GDN_CONFIG, "runs": [], "torch_form": []})
    for B in args.batches:
        for T in args.nodes:
            # 8 input sets (24 MiB of state at batch 1): as in the model, where each layer has its own state
            sets = [inputs(B, T, *args.heads, args.dim, args.device, rng) for _ in range(8 if B == 1 else 2)]
            torch_ms = attempt(f"b{B} t{T} torch form", per_call_ms, chunk.tree_gated_delta_rule, sets, args.reps,
                               args.device)
            report["torch_form"].append({"batch": B, "nodes": T, "ms": torch_ms})
            print(f"B={B} T={T:3} torch form {torch_ms} ms", flush=True)
            for w, prec in [(w, prec) for prec in args.precisions for w in args.warps]:
                r = attempt(f"b{B} t{T} w{w} {prec}", one, sets, B, T, w, prec, args.reps, args.device)
                report["runs"].append(r)
                report.save()
                print(f"B={B} T={T:3} warps={w:2} {prec:>6}: kernel {r.get('kernel_ms', float('nan')):8.4f} ms, rel err {r.get('rel_rms_err', r.get('error'))}",
                      flush=True)
