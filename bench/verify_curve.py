"""The verify cost curve of this GPU, which the node budget reads: seconds of one verify forward per batch size,
tokens per request and context, for a random-weight target in a real shape (Qwen3.5-27B by default).

Each point is a batch of chains of t tokens per request (B * t tokens in all) at one context, through the engine's
verify call (runner.verify_inputs + runner.verify: the verify CUDA graphs, the tree-attention op, the Triton
GEMVs), timed with CUDA events over back-to-back calls (specpilot/engine/cost_curve.py: measure). Beside each
point the roofline default's prediction (VerifyCostCurve.from_model), to see how far the default is off. The JSON
holds the curve under "curve" (VerifyCostCurve.load reads the file as it is), the GPU, commit, command and the
model fingerprint; it is written again after each batch size. --cache also writes the curve where the engine
looks for it ($SPECPILOT_CACHE/cost_curves/<gpu>-<fingerprint>.json).

    python3 -m bench verify_curve --target Qwen3.5-27B --out bench/results/verify_curve_27b_h200.json
    TRITON_INTERPRET=1 python3 -m bench verify_curve --device cpu --target tiny-dense --out /tmp/vcurve.json \
        --batches 1 4 --tokens 1 4 --contexts 16 64 --reps 2   # dry run
"""

from __future__ import annotations

import argparse

import torch

from bench.common import Report, attempt, failed, make_runner, run_record
from specpilot.bench.shapes import SHAPES, hf_config, random_model
from specpilot.config import EngineConfig
from specpilot.engine.cost_curve import VerifyCostCurve, cache_path, measure, model_fingerprint


def merged(parts: list[VerifyCostCurve]) -> VerifyCostCurve:
    """One curve of several single-batch-size measurements (the same contexts)."""
    return VerifyCostCurve(tuple(b for p in parts for b in p.batches), parts[0].contexts,
                           tuple(t for p in parts for t in p.tokens), tuple(g for p in parts for g in p.seconds_grid))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench verify_curve", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--target", default="Qwen3.5-27B", choices=sorted(SHAPES))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--tokens", type=int, nargs="+", default=list(range(1, 17)), help="tokens per request")
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--reps", type=int, default=10, help="back-to-back calls per timing (median of 3 timings)")
    p.add_argument("--cache", action="store_true", help="also write the curve to the engine's cache")
    p.add_argument("--device", default="cuda")
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    if min(args.batches + args.tokens + [args.reps]) < 1 or min(args.contexts) < 0:
        p.error("--batches, --tokens and --reps take numbers >= 1, --contexts numbers >= 0")
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    engine = EngineConfig()
    model = random_model(hf_config(args.target), device, dtype)
    fingerprint = model_fingerprint(model.config, engine.weight_format, str(dtype).removeprefix("torch."))
    record = {**run_record(device, args.commit), "target": args.target, "fingerprint": fingerprint,
              "engine": engine.to_dict(), "reps": args.reps}
    report = Report(args.out, {**record, "errors": {}})
    runner = make_runner(model, engine)
    roofline = VerifyCostCurve.from_model(model, device)
    parts = []
    for b in sorted(set(args.batches)):
        part = attempt(f"batch {b}", measure, runner, [b], args.tokens, args.contexts, args.reps)
        if failed(part):
            report["errors"][f"batch {b}"] = part["error"]
            report.save()
            continue
        parts.append(part)
        curve = merged(parts)
        report["curve"] = curve.to_dict()
        report["roofline_seconds"] = [[[roofline.seconds(t, bb, c) for t in toks] for c in curve.contexts]
                                      for bb, toks in zip(curve.batches, curve.tokens)]
        print(f"batch {b:>3}: " + "  ".join(f"ctx {c}: " + " ".join(f"{s * 1e3:.2f}" for s in row) + " ms"
                                            for c, row in zip(part.contexts, part.seconds_grid[0])), flush=True)
    if not parts:
        raise SystemExit(f"error: no batch size was measured: {report['errors']}")
    curve = merged(parts)
    print(f"\n{'B':>3} {'ctx':>5} {'t/req':>5} {'tokens':>6} {'ms':>8} {'roofline ms':>11} {'ratio':>6}")
    for bb, toks, rows in zip(curve.batches, curve.tokens, curve.seconds_grid):
        for c, row in zip(curve.contexts, rows):
            for t, s in zip(toks, row):
                r = roofline.seconds(t, bb, c)
                print(f"{bb:>3} {c:>5} {t // bb:>5} {t:>6} {s * 1e3:8.3f} {r * 1e3:11.3f} {s / r:6.2f}")
    if args.cache:
        path = cache_path(record["gpu"], fingerprint)
        curve.save(path, **record)
        print(f"cached at {path}")
