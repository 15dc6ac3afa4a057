"""The cost model against measurement: for each configuration (shape, batch size, tree, weight format, acceptance) the
measured tok/s of the speculative engine and the cost model's prediction, side by side in one run.

Per shape (margin targets in the real shapes, random weights; their random DFlash drafter; SYNTHETIC acceptance):
the pilot's calibration of this GPU and target is measured first (ceilings, verify curve, components per batch
size: specpilot/pilot/calibration.py; its seconds are recorded), then each configuration runs as a static batch of
random prompts, every request its full tree (no budget), warm-up steps and then timed steps back to back
(specpilot/pilot/workload.py; the oracle's work is out of the wall time). Three predictions per row:
- `prior`: from the profile's per-depth acceptance (and its variation where the row has it): what the model says
  before anything runs;
- `counts`: from the per-depth acceptance counted in the run (what `specpilot profile` uses);
- `step`: the measured tokens per step over the predicted step time (the step-time model alone).
Within 10% is checked on `counts` (the issue's bar) and reported for all three. W12N rows (Qwen3-8B, batch 1: the
W12N GEMV takes products of up to 16 rows) get their own calibration, and also the bf16 calibration's what-if
prediction (the model carrying the bf16 verify to W12N by the ratio of the two ceilings).

    python3 -m bench cost_model_validation --out bench/results/cost_model_validation_h200.json
    python3 -m bench cost_model_validation --shapes Qwen3.5-27B --out /tmp/cmv_27b.json   # one shape per command

Estimated (not yet measured) on an H200: a few minutes per shape, the 8B's W12N rows adding the planes' encoding
(about a minute, bench/results/ar_decode_w12n_8b_random_h200.json).
    python3 -m bench cost_model_validation --smoke --out /tmp/cmv.json   # CPU dry run (tiny shapes), seconds
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from dataclasses import dataclass, replace

import torch

from bench.common import Report, attempt, failed, make_runner, run_record
from specpilot.bench.harness import OracleClock
from specpilot.bench.shapes import RandomTarget, random_dflash
from specpilot.bench.synthetic import AcceptanceProfile
from specpilot.config import EngineConfig
from specpilot.pilot import calibration
from specpilot.pilot.cost_model import AcceptanceStats, Configuration, DrafterShape, ModelShape
from specpilot.pilot.workload import build_engine, reserve, run_steps, truth_for
from specpilot.spec_decode.tree import TreeSpec


@dataclass(frozen=True)
class Row:
    batch: int
    tree: str
    weight_format: str = "bf16"
    variation: bool = False  # the profile's two-state variation (else i.i.d. per step)


def rows_for(shape: str, smoke: bool) -> list[Row]:
    if smoke:
        return [Row(1, "chain:7"), Row(2, "static:2,2,2")]
    if shape == "Qwen3.5-27B":
        return [Row(1, "chain:7"), Row(1, "static:2,2,2"), Row(8, "chain:7"), Row(8, "chain:3"),
                Row(8, "static:2,2,2"), Row(8, "chain:7", variation=True), Row(32, "chain:7"), Row(32, "chain:3")]
    return [Row(1, "chain:7"), Row(1, "static:2,2,2"), Row(8, "chain:7"), Row(8, "static:2,2,2"), Row(32, "chain:7"),
            Row(32, "chain:3"), Row(1, "chain:7", "w12n"), Row(1, "static:2,2,2", "w12n")]


def steps_for(batch: int, smoke: bool) -> int:
    """Timed steps: enough request-steps that the mean tokens per step is known to a few percent."""
    if smoke:
        return 2
    return 96 if batch == 1 else 32 if batch <= 8 else 16


def row_tokens(row: Row, warmup: int, smoke: bool) -> int:
    """Tokens each request may emit: the start, the warm-up, the timed steps and one more, at most depth + 1 a step."""
    return (warmup + steps_for(row.batch, smoke) + 4) * (TreeSpec.parse(row.tree).depth + 1) + 8


def measure_row(runner, drafter, cost, model, row: Row, profile: AcceptanceProfile, prompt: int, warmup: int,
                smoke: bool, seed: int, what_if=None) -> dict:
    device = runner.device
    prof = profile if row.variation else profile.with_variation(None)
    rng = random.Random(seed)
    vocab = runner.config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(prompt)] for _ in range(row.batch)]
    spec = TreeSpec.parse(row.tree)
    steps = steps_for(row.batch, smoke)
    tokens = row_tokens(row, warmup, smoke)
    clock = OracleClock(device)
    truth = truth_for(model, runner, prompts, tokens)
    engine = build_engine(runner, drafter, row.tree, row.batch, prompt + tokens + 1, prof, truth, clock, seed=seed)
    run = run_steps(engine, prompts, warmup, steps, tokens, clock)
    out = {"shape_row": row.__dict__, "profile": prof.label, "measured": run.to_dict()}
    children = spec.branching if spec.kind == "static" else None
    stats = {"prior": AcceptanceStats.from_profile(prof),
             "counts": AcceptanceStats.from_counts(run.drafted, run.accepted, run.steps * run.batch,
                                                   prof.sibling_decay, prof.variation, children)}
    for name, acc in stats.items():
        p = cost.predict(Configuration(row.batch, row.tree, run.context, acc, row.weight_format))
        out[f"predicted_{name}"] = {**p.to_dict(), "error": p.tok_s / run.tok_s - 1.0}
    p = out["predicted_counts"]
    step_tok_s = run.tau * row.batch / (p["step_ms"] / 1e3)
    out["predicted_step"] = {"tok_s": step_tok_s, "step_ms": p["step_ms"], "error": step_tok_s / run.tok_s - 1.0}
    out["step_ms_error"] = p["step_ms"] / (run.step_s * 1e3) - 1.0
    if what_if is not None:  # the bf16 calibration's prediction for this (W12N) row
        q = what_if.predict(Configuration(row.batch, row.tree, run.context, stats["counts"], row.weight_format))
        out["predicted_from_bf16"] = {**q.to_dict(), "error": q.tok_s / run.tok_s - 1.0}
    return out


def free(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def run_shape(shape: str, args, report: Report, plan: calibration.CalibrationPlan, profile: AcceptanceProfile) -> None:
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    t0 = time.perf_counter()
    model = RandomTarget(shape, "margin").build(device, dtype)
    report["shapes"][shape] = {"build_s": time.perf_counter() - t0, "calibrations": {}}
    report.save()
    rows = [r for r in rows_for(shape, args.smoke) if r.weight_format in args.formats]
    costs = {}
    for fmt in dict.fromkeys(r.weight_format for r in rows):
        if fmt != "bf16" and dtype != torch.bfloat16:
            for r in rows:
                if r.weight_format == fmt:
                    report["rows"].append({"shape": shape, "shape_row": r.__dict__,
                                           "skipped": f"{fmt} needs a bf16 model (a GPU run)"})
            continue
        t1 = time.perf_counter()
        runner = make_runner(model, EngineConfig(weight_format=fmt))
        setup = time.perf_counter() - t1  # W12N: the planes encoded at the runner's build
        drafter = random_dflash(model, shape, runtime=runner.runtime)
        mine = [r for r in rows if r.weight_format == fmt]
        batches = tuple(sorted({r.batch for r in mine}))
        longest = max(args.prompt + row_tokens(r, args.warmup, args.smoke) + 1 for r in mine)
        reserve(runner, drafter, max(batches), max(longest, 4 * args.prompt + 16), [r.tree for r in mine])
        cal = calibration.cached(runner, drafter, replace(plan, batches=batches), refresh=not args.reuse_calibration,
                                 log=lambda m: print(m, flush=True))
        mshape = ModelShape.from_model(model)
        cost = cal.cost_model(mshape, DrafterShape.from_drafter(drafter, mshape, drafter.max_depth))
        costs[fmt] = cost
        report["shapes"][shape]["calibrations"][fmt] = {"runner_setup_s": setup, "seconds": cal.seconds,
                                                        "fingerprint": cal.fingerprint, **cal.to_dict()}
        report.save()
        for i, row in enumerate(r for r in rows if r.weight_format == fmt):
            label = f"{shape} b{row.batch} {row.tree} {fmt}" + (" variation" if row.variation else "")
            t2 = time.perf_counter()
            out = attempt(label, measure_row, runner, drafter, cost, model, row, profile, args.prompt, args.warmup,
                          args.smoke, args.seed + i, costs.get("bf16") if fmt != "bf16" else None)
            out = {"shape": shape, "label": label, "seconds": time.perf_counter() - t2, **out}
            report["rows"].append(out)
            report.save()
            if not failed(out):
                m, p = out["measured"], out["predicted_counts"]
                print(f"{label}: measured {m['tok_s']:.1f} tok/s ({m['step_ms']:.2f} ms/step, tau {m['tau']:.2f}); "
                      f"predicted {p['tok_s']:.1f} ({p['step_ms']:.2f} ms/step), {100 * p['error']:+.1f}%",
                      flush=True)
        del runner, drafter
        free(device)
    del model
    free(device)


def summary(rows: list[dict]) -> dict:
    done = [r for r in rows if "measured" in r]
    out = {"rows": len(done), "failed": sum("error" in r for r in rows), "skipped": sum("skipped" in r for r in rows)}
    for name in ("prior", "counts", "step"):
        errs = [abs(r[f"predicted_{name}"]["error"]) for r in done]
        out[name] = {"within_10pct": sum(e <= 0.10 for e in errs), "max_abs_error": max(errs, default=None),
                     "mean_abs_error": sum(errs) / len(errs) if errs else None}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench cost_model_validation", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=None, help="default: Qwen3.5-27B Qwen3-8B (smoke: the tiny ones)")
    p.add_argument("--profile", default="dflash2-gsm8k", help="synthetic acceptance profile")
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 512; smoke 16)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per row (default 4; smoke 1)")
    p.add_argument("--formats", nargs="+", default=["bf16", "w12n"], choices=["bf16", "w12n"],
                   help="weight formats whose rows run (W12N rows encode the 8B planes first: about a minute)")
    p.add_argument("--reuse-calibration", action="store_true", help="take a cached calibration if there is one")
    p.add_argument("--smoke", action="store_true", help="CPU dry run on the tiny shapes")
    p.add_argument("--device", default=None, help="default: cuda (smoke: cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    args.device = args.device or ("cpu" if args.smoke else "cuda")
    args.shapes = args.shapes or (["tiny-hybrid", "tiny-dense"] if args.smoke else ["Qwen3.5-27B", "Qwen3-8B"])
    args.prompt = args.prompt if args.prompt is not None else (16 if args.smoke else 512)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 4)
    if args.prompt < 2 or args.warmup < 0:
        p.error("--prompt takes a number >= 2, --warmup a number >= 0")
    try:  # an unknown shape or profile fails here, before anything is built
        for shape in args.shapes:
            RandomTarget(shape).check()
        profile = AcceptanceProfile.load(args.profile)
    except ValueError as e:
        p.error(str(e))
    plan = calibration.CalibrationPlan.tiny() if args.smoke else calibration.CalibrationPlan(
        contexts=(args.prompt, 4 * args.prompt), prompt=args.prompt)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    report = Report(args.out, {**run_record(args.device, args.commit), "synthetic": True, "profile": profile.label,
                               "smoke": args.smoke, "prompt": args.prompt, "shapes": {}, "rows": []})
    for shape in args.shapes:
        out = attempt(shape, run_shape, shape, args, report, plan, profile)
        if failed(out):
            report["shapes"].setdefault(shape, {})["error"] = out["error"]
    report["summary"] = summary(report["rows"])
    report["seconds"] = time.perf_counter() - t0
    report.save()
    print(f"\n{'row':<44} {'meas tok/s':>10} {'pred':>8} {'err':>7} {'prior err':>9} {'step ms m/p':>13}")
    for r in report["rows"]:
        if "measured" not in r:
            print(f"{r.get('label', r['shape']):<44} {r.get('skipped') or r.get('error', '')[:60]}")
            continue
        m, c = r["measured"], r["predicted_counts"]
        print(f"{r['label']:<44} {m['tok_s']:10.1f} {c['tok_s']:8.1f} {100 * c['error']:+6.1f}% "
              f"{100 * r['predicted_prior']['error']:+8.1f}% {m['step_ms']:6.2f}/{c['step_ms']:<6.2f}")
    s = report["summary"]
    print(f"within 10% (counts): {s['counts']['within_10pct']} of {s['rows']}; prior: {s['prior']['within_10pct']}; "
          f"step model: {s['step']['within_10pct']}; {report['seconds']:.0f} s")
