"""Decode GEMV on every projection shape of Qwen3-8B and Qwen3.5-27B: cuBLAS vs our Triton kernels.

M = 1 (default): the FMA GEMV's config sweep. --skinny: M = 2..32 rows (verify blocks, small decode batches),
the tensor-core skinny kernel's config sweep, each M beside cuBLAS and beside our own M = 1 GEMV (the time a
verify block of M tokens costs over one token). Correctness first (each config against the fp32 reference),
then the median time of each over weights rotated through more memory than the L2 holds, as achieved
bandwidth against the measured copy bandwidth.

    python3 -m bench gemv --out bench/results/gemv_h200.json
    python3 -m bench gemv --skinny --out bench/results/gemv_skinny_h200.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import torch.nn.functional as F

from bench.common import command_line, copy_bandwidth
from bench.projections import SHAPES, time_fn
from specpilot.ops.gemv.reference import gemv_ref
from specpilot.ops.gemv.configs import gemv_config
from specpilot.ops.gemv.triton import gemv, skinny

CONFIGS = [dict(block_n=bn, block_k=bk, num_warps=w) for bn, bk, w in itertools.product((4, 8, 16), (512, 1024), (4, 8))]
SKINNY_CONFIGS = [dict(block_n=bn, block_k=bk, num_warps=w, num_stages=st)
                  for bn, bk, w, st in itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (3, 4))
                  if bn * bk <= 16384]
SKINNY_ROWS = (4, 8, 16, 24, 32)


def _shapes(args) -> list[tuple[str, tuple[int, int]]]:
    return [(n, s) for n, s in SHAPES.items() if args.shapes is None or n.startswith(tuple(args.shapes))]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench gemv", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--commit", default="unknown")
    p.add_argument("--skinny", action="store_true", help="M = 2..32: the skinny kernel's sweep")
    p.add_argument("--rows", type=int, nargs="+", default=list(SKINNY_ROWS), help="--skinny: the M values")
    p.add_argument("--shapes", nargs="+", default=None, help="only the shapes whose name starts with one of these")
    args = p.parse_args(argv)
    if args.skinny:
        return skinny_sweep(args)
    bw = copy_bandwidth("cuda")
    out = {"gpu": torch.cuda.get_device_name(), "commit": args.commit, "command": command_line(),
           "date": time.strftime("%Y-%m-%d"), "copy_bandwidth_bytes_per_s": bw, "shapes": {}}
    for name, (N, K) in _shapes(args):
        nbytes = N * K * 2
        copies = max(2, (512 << 20) // nbytes + 1)
        weights = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        ref = gemv_ref(x, weights[0]).float()
        row = {"N": N, "K": K, "bytes": nbytes}
        row["cublas_s"] = time_fn(lambda a, w: F.linear(a, w), weights, x)
        best = None
        for cfg in CONFIGS:
            y = gemv(x, weights[0], **cfg).float()
            err = ((y - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"{name} {cfg}: relative error {err}"
            t = time_fn(lambda a, w: gemv(a, w, **cfg), weights, x)
            row.setdefault("triton", []).append({**cfg, "s": t, "rel_err": err})
            if best is None or t < best[1]:
                best = (cfg, t)
        row["best"] = {**best[0], "s": best[1]}
        row["speedup_vs_cublas"] = row["cublas_s"] / best[1]
        row["cublas_fraction_of_copy_bw"] = nbytes / row["cublas_s"] / bw
        row["best_fraction_of_copy_bw"] = nbytes / best[1] / bw
        out["shapes"][name] = row
        del weights
        torch.cuda.empty_cache()
        print(f"{name:18} cuBLAS {row['cublas_s'] * 1e6:7.1f} us ({100 * row['cublas_fraction_of_copy_bw']:5.1f}%)  "
              f"triton {best[1] * 1e6:7.1f} us ({100 * row['best_fraction_of_copy_bw']:5.1f}%) {best[0]}", flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


def skinny_sweep(args) -> None:
    bw = copy_bandwidth("cuda")
    out = {"gpu": torch.cuda.get_device_name(), "commit": args.commit, "command": command_line(),
           "date": time.strftime("%Y-%m-%d"), "copy_bandwidth_bytes_per_s": bw, "rows": args.rows, "shapes": {}}
    for name, (N, K) in _shapes(args):
        nbytes = N * K * 2
        copies = max(2, (512 << 20) // nbytes + 1)
        weights = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        bn, bk, nw, pre = gemv_config(N, K)
        x1 = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        row = {"N": N, "K": K, "bytes": nbytes, "gemv_m1_s": time_fn(
            lambda a, w: gemv(a, w, block_n=bn, block_k=bk, num_warps=nw, pre_tiles=pre), weights, x1)}
        for m in args.rows:
            x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
            ref = gemv_ref(x, weights[0]).float()
            r = {"cublas_s": time_fn(lambda a, w: F.linear(a, w), weights, x), "configs": []}
            best = None
            for cfg in SKINNY_CONFIGS:
                y = skinny(x, weights[0], **cfg).float()
                err = ((y - ref).norm() / ref.norm()).item()
                assert err < 1e-2, f"{name} M={m} {cfg}: relative error {err}"
                t = time_fn(lambda a, w: skinny(a, w, **cfg), weights, x)
                r["configs"].append({**cfg, "s": t, "rel_err": err})
                if best is None or t < best[1]:
                    best = (cfg, t)
            r["best"] = {**best[0], "s": best[1]}
            r["speedup_vs_cublas"] = r["cublas_s"] / best[1]
            r["vs_gemv_m1"] = best[1] / row["gemv_m1_s"]
            r["best_fraction_of_copy_bw"] = nbytes / best[1] / bw
            row[f"m{m}"] = r
            print(f"{name:18} M={m:2} cuBLAS {r['cublas_s'] * 1e6:7.1f} us  skinny {best[1] * 1e6:7.1f} us "
                  f"({100 * r['best_fraction_of_copy_bw']:5.1f}%, {r['vs_gemv_m1']:.2f}x M=1) {best[0]}", flush=True)
        out["shapes"][name] = row
        del weights
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
