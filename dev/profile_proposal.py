"""Where a drafter's proposal time goes on the GPU: the CUDA kernels of --steps proposals (bench drafter_proposal's
workload and random drafters), under torch.profiler, summed per kernel name. A dev tool for the proposal-cost work
of issue 31; the timed figures are bench drafter_proposal's.

    python3 dev/profile_proposal.py --drafters dspark dflash --batch 1 --out /tmp/proposal_kernels.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.drafter_proposal import Workload, build  # noqa: E402
from specpilot.bench.shapes import hf_config, random_model  # noqa: E402
from specpilot.config import EngineConfig  # noqa: E402
from specpilot.runtime.settings import Runtime  # noqa: E402
from specpilot.spec_decode.tree import TreeSpec  # noqa: E402


def profile(kind: str, target, shape: str, runtime, batch: int, steps: int, context: int) -> dict:
    drafter = build(kind, target, shape, runtime)
    depth = min(7, drafter.max_depth or 7) if kind != "mtp" else 3
    spec = TreeSpec.parse(f"chain:{depth}")
    drafter.allocate(batch, context + 4 * (steps + 20) + 64)
    work = Workload(drafter, batch, context, 4, target.config.vocab_size, "cuda")
    work.start(drafter)
    for i in range(10):  # graphs captured, compiles done
        work.step(drafter, i, spec)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(10, 10 + steps):
            work.step(drafter, i, spec)
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name[:120], [0.0, 0])
            k[0] += e.device_time / steps / 1e3  # ms per step
            k[1] += 1 / steps
    rows = sorted(({"kernel": n, "ms_per_step": round(v[0], 4), "calls_per_step": round(v[1], 2)}
                   for n, v in kernels.items()), key=lambda r: -r["ms_per_step"])
    return {"drafter": kind, "batch": batch, "depth": depth,
            "kernel_ms_per_step": round(sum(r["ms_per_step"] for r in rows), 4), "kernels": rows[:40]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="Qwen3.5-27B")
    p.add_argument("--drafters", nargs="+", default=["dspark", "dflash"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    target = random_model(hf_config(args.target, num_hidden_layers=4), "cuda", torch.bfloat16)
    runtime = Runtime.build(EngineConfig(), "cuda")
    out = [profile(k, target, args.target, runtime, args.batch, args.steps, args.context) for k in args.drafters]
    Path(args.out).write_text(json.dumps(out, indent=1))
    for r in out:
        print(f"{r['drafter']} b{r['batch']}: {r['kernel_ms_per_step']} ms of kernels per step")
        for k in r["kernels"][:15]:
            print(f"  {k['ms_per_step']:8.4f} ms  x{k['calls_per_step']:5.1f}  {k['kernel']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
