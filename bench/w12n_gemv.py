"""W12N decode GEMV vs cuBLAS bf16 vs our bf16 GEMV, and the FP8 view, on every projection shape of Qwen3-8B and
Qwen3.5-27B at M = 1, 4, 8, 16; plus SASS instructions per weight in the kernels' main loops.

Correctness first: each kernel against its reference (W12N bitwise-exact weights: the fp32-accumulated GEMV of
the decoded matrix), and batch invariance (row m of M=8 equals M=1 bitwise). Times are CUDA-graph replays of
back-to-back launches over weights rotated past the L2 (same method as bench/gemv.py).

    PYTHONPATH=. python3 bench/w12n_gemv.py --out bench/results/w12n_gemv_h200.json
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time

import torch
import torch.nn.functional as F

from bench.ar_decode import copy_bandwidth
from bench.gemv import SHAPES, time_fn
from specpilot.ops import gemv as bf16_gemv
from specpilot.ops.w12n_gemv import triton as kernels
from specpilot.ops.w12n_gemv.reference import fp8_gemv_ref, w12n_gemv_ref
from specpilot.weights import w12n


def loop_instructions(sass: str) -> tuple[int, dict] | None:
    """Instructions in the longest backward-branch loop of a SASS listing, and the most common opcodes."""
    labels, ins = {}, []
    for line in sass.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*);", line)
        if m:
            ins.append((m.group(2), m.group(3)))
    best = None
    for i, (op, rest) in enumerate(ins):
        target = re.search(r"(\.L_x_\d+)", rest) if op.startswith("BRA") else None
        if target and labels.get(target.group(1), i) < i:
            span = (i - labels[target.group(1)] + 1, labels[target.group(1)], i)
            best = span if best is None or span[0] > best[0] else best
    if best is None:
        return None
    n, a, b = best
    return n, dict(collections.Counter(op.split(".")[0] for op, _ in ins[a:b + 1]).most_common(12))


def sass_counts(block_n: int, block_k: int, num_warps: int) -> dict:
    """Per-weight instruction counts of the compiled kernels (the cache of the launches already made)."""
    out = {}
    try:
        from triton.tools.disasm import get_sass
    except ImportError:
        return {"error": "triton.tools.disasm unavailable"}
    for name, fn in (("w12n", kernels._w12n_gemv_kernel), ("fp8", kernels._fp8_gemv_kernel)):
        try:
            compiled = [k for cache in fn.device_caches.values() for k in cache[0].values()]
            per_thread = block_n * block_k / (num_warps * 32)
            stats = [loop_instructions(get_sass(k.asm["cubin"])) for k in compiled]
            out[name] = [{"loop_instructions": s[0], "instructions_per_weight": round(s[0] / per_thread, 2),
                          "ops": s[1]} for s in stats if s]
        except Exception as e:  # the cache layout is Triton-internal: report, never fail the run
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--commit", default="unknown")
    p.add_argument("--ms", type=int, nargs="+", default=[1, 4, 8, 16])
    args = p.parse_args()
    bw = copy_bandwidth()
    out = {"gpu": torch.cuda.get_device_name(), "commit": args.commit, "command": " ".join(sys.argv),
           "date": time.strftime("%Y-%m-%d"), "copy_bandwidth_bytes_per_s": bw, "shapes": {}}
    for name, (N, K) in SHAPES.items():
        copies = max(2, (512 << 20) // (N * K * 2) + 1)
        weights = [(torch.randn(N, K, device="cuda") * 0.02).to(torch.bfloat16) for _ in range(copies)]
        encoded = [w12n.encode_best(w) for w in weights]
        row = {"N": N, "K": K, "bf16_bytes": N * K * 2, "w12n_bits_per_weight": w12n.bits_per_weight(encoded[0]),
               "escape_rate": w12n.stats(encoded[0])["escape_rate"], "m": {}}
        for m in args.ms:
            x = torch.randn(m, K, device="cuda").to(torch.bfloat16)
            ref = w12n_gemv_ref(x, encoded[0]).float()
            got = kernels.w12n_gemv(x, encoded[0]).float()
            assert ((got - ref).norm() / ref.norm()) < 1e-2, f"{name} M={m}: W12N GEMV off its reference"
            if m > 1:
                assert torch.equal(kernels.w12n_gemv(x[:1], encoded[0]), kernels.w12n_gemv(x, encoded[0])[:1]), \
                    f"{name} M={m}: not batch-invariant"
            fp8_ref = fp8_gemv_ref(x, encoded[0]).float()
            assert ((kernels.fp8_gemv(x, encoded[0]).float() - fp8_ref).norm() / fp8_ref.norm()) < 1e-2
            pairs = list(zip(weights, encoded))
            times = {
                "cublas_bf16": time_fn(lambda a, wt: F.linear(a, wt[0]), pairs, x),
                "w12n": time_fn(lambda a, wt: kernels.w12n_gemv(a, wt[1]), pairs, x),
                "fp8_view": time_fn(lambda a, wt: kernels.fp8_gemv(a, wt[1]), pairs, x),
            }
            if m <= 4:
                times["ours_bf16"] = time_fn(lambda a, wt: bf16_gemv.gemv(a, wt[0]), pairs, x)
            row["m"][m] = {"seconds": times, **{f"{k}_vs_cublas": times["cublas_bf16"] / v for k, v in times.items()},
                           "w12n_fraction_of_copy_bw": row["w12n_bits_per_weight"] / 8 * N * K / times["w12n"] / bw}
            print(f"{name:18} M={m:2} " + " ".join(f"{k} {v * 1e6:7.1f}us" for k, v in times.items()), flush=True)
        out["shapes"][name] = row
        del weights, encoded
        torch.cuda.empty_cache()
    out["sass"] = sass_counts(8, 512, 4)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out["sass"])[:2000])


if __name__ == "__main__":
    main()
