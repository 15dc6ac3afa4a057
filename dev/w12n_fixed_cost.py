"""Issue 5 probe: what a W12N GEMV launch costs beside its bytes. Times M = 1 GEMVs at N = 4096 over a sweep of K
(weights rotated, CUDA-graph replays of 24 back-to-back launches, as `python3 -m bench w12n_gemv` times them), with
PDL off and on (on: each launch overlaps its predecessor's tail, as in a decode step; cuBLAS takes no PDL), and fits t = fixed + bytes / rate
per kernel: the fixed microseconds per launch and the streaming rate. Kernels:
  w12n         the tensor-core W12N GEMV at its default launch
  ours_bf16    our bf16 GEMV at one config for every K (16 rows, 1024 columns, 8 warps: the 8B down's)
  cublas       F.linear
on clean weights (no verbatim segments) and on random ones.

    PYTHONPATH=. python3 dev/w12n_fixed_cost.py OUT.json COMMIT
"""

import json
import statistics
import sys

import torch
import torch.nn.functional as F

from bench.common import copy_bandwidth
from bench.projections import time_fn
from bench.w12n_gemv import random_weights
from specpilot.ops.gemv import triton as bf16_gemv
from specpilot.ops.w12n_gemv import mma
from specpilot.weights import w12n

N, KS = 4096, (2048, 4096, 8192, 12288, 16384)
KERNELS = {  # (x, (bf16 weight, W12N tensor), pdl)
    "w12n": lambda x, p, pdl: mma.w12n_mma_gemv(x, p[1], pdl=pdl),
    "ours_bf16": lambda x, p, pdl: bf16_gemv.gemv(x, p[0], block_n=16, block_k=1024, num_warps=8, pdl=pdl),
    "cublas": lambda x, p, pdl: F.linear(x, p[0]),
}


def fit(points: list[tuple[float, float]]) -> dict:
    """Least squares t = fixed + bytes / rate over (bytes, seconds): fixed in us, rate in TB/s."""
    slope, intercept = statistics.linear_regression(*zip(*points))
    return {"fixed_us": intercept * 1e6, "rate_tb_s": 1 / slope / 1e12}


def main():
    path, commit = sys.argv[1], sys.argv[2]
    report = {"gpu": torch.cuda.get_device_name(), "commit": commit, "command": " ".join(sys.argv),
              "copy_bandwidth_bytes_per_s": copy_bandwidth("cuda"), "n": N, "runs": {}}
    for clean in (True, False):
        runs = report["runs"]["clean" if clean else "random"] = {}
        for k in KS:
            copies = max(2, (512 << 20) // (N * k * 2) + 1)
            ws = [random_weights(N, k, "cuda", clean) for _ in range(copies)]
            ts = [w12n.encode_best(w) for w in ws]
            for t in ts:
                mma.prepare(t)
            x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
            pairs = list(zip(ws, ts))
            row = runs[k] = {"w12n_bytes": w12n.bits_per_weight(ts[0]) / 8 * N * k, "bf16_bytes": 2 * N * k}
            for name, fn in KERNELS.items():
                for on in (False, True):
                    row[f"{name}{'_pdl' if on else ''}_us"] = time_fn(lambda x, p: fn(x, p, on), pairs, x) * 1e6
            print("clean" if clean else "random", k, {a: round(b, 1) for a, b in row.items() if a.endswith("us")},
                  flush=True)
            del ws, ts, pairs
            torch.cuda.empty_cache()
        fits = runs["fit"] = {}
        for name in KERNELS:
            size = "bf16_bytes" if name in ("ours_bf16", "cublas") else "w12n_bytes"
            for sfx in ("", "_pdl"):
                fits[name + sfx] = fit([(runs[k][size], runs[k][f"{name}{sfx}_us"] / 1e6) for k in KS])
        print("fit", json.dumps(fits), flush=True)
    json.dump(report, open(path, "w"), indent=1)


if __name__ == "__main__":
    main()
