"""Where a whole-model prefill's time goes on the GPU: the CUDA kernels of one prefill of --tokens tokens (random
weights in a real shape, the runner's chunked prefill) under torch.profiler, summed per kernel name and per kind
(matmul, attention, GDN, conv, norm, other), beside the wall time (the gap is the host's). A dev tool for the
prefill-throughput work of issue 30; the timed figures are bench prefill's.

    python3 dev/profile_prefill.py --shapes Qwen3.5-27B Qwen3-8B --tokens 8192 --out /tmp/prefill_kernels.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import run_record  # noqa: E402
from specpilot.bench.shapes import hf_config, random_model  # noqa: E402
from specpilot.config import EngineConfig  # noqa: E402
from specpilot.runtime.runner import ModelRunner  # noqa: E402
from specpilot.runtime.settings import Runtime  # noqa: E402

KINDS = (("matmul", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "matmul")),
         ("attention", ("flash", "fmha", "attention", "sdpa", "tree_attn")),
         ("gdn", ("chunk", "gated_delta", "fwd_kernel", "recompute", "solve_tril", "delta")),
         ("conv", ("conv",)),
         ("norm", ("norm", "rms")),
         ("copy", ("copy", "cat", "index", "scatter", "gather", "fill")))


def kind_of(name: str) -> str:
    low = name.lower()
    return next((k for k, keys in KINDS if any(s in low for s in keys)), "other")


def profile(shape: str, tokens: int, batch: int, chunk: int) -> dict:
    model = random_model(hf_config(shape), "cuda", torch.bfloat16)
    runner = ModelRunner(model, Runtime.build(EngineConfig(), "cuda"), prefill_chunk=chunk)
    runner.allocate(batch, tokens + 1)
    prompts = torch.randint(0, model.config.vocab_size, (batch, tokens), generator=torch.Generator().manual_seed(0))
    prompts = prompts.tolist()

    def run():
        return runner.prefill(0, prompts[0]) if batch == 1 else runner.prefill_many(prompts)

    run()  # compiles, autotunes
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name[:140], [0.0, 0])
            k[0] += e.device_time / 1e3
            k[1] += 1
    rows = sorted(({"kernel": n, "ms": round(v[0], 3), "calls": v[1], "kind": kind_of(n)} for n, v in kernels.items()),
                  key=lambda r: -r["ms"])
    by_kind: dict[str, float] = {}
    for r in rows:
        by_kind[r["kind"]] = round(by_kind.get(r["kind"], 0.0) + r["ms"], 3)
    return {"shape": shape, "tokens": tokens, "batch": batch, "prefill_chunk": chunk, "wall_ms": round(wall * 1e3, 2),
            "kernel_ms": round(sum(r["ms"] for r in rows), 2), "by_kind_ms": by_kind, "kernels": rows[:60]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["Qwen3.5-27B", "Qwen3-8B"])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prefill-chunk", type=int, default=2048)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    out = {**run_record("cuda"), "rows": []}
    for shape in args.shapes:
        r = profile(shape, args.tokens, args.batch, args.prefill_chunk)
        torch.cuda.empty_cache()  # the model went with profile()'s frame
        out["rows"].append(r)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"{shape} b{args.batch} T{args.tokens}: wall {r['wall_ms']} ms, kernels {r['kernel_ms']} ms, "
              f"by kind {r['by_kind_ms']}", flush=True)
        for k in r["kernels"][:25]:
            print(f"  {k['ms']:9.3f} ms  x{k['calls']:5d}  [{k['kind']}] {k['kernel']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
