"""Acceptance report of the zoo: tau and per-depth acceptance of every drafter x target, greedy, on held-out
prompts (HumanEval by default: code the zoo never trained on), chain and tree.

Acceptance depends on the models and the prompts, not on the hardware, so this runs anywhere (CPU by default,
fp32). Requests run in batches through the speculative engine; every output goes through token forcing (one
stock teacher-forced pass) so a reported tau is a tau of lossless output. The JSON feeds the synthetic
acceptance profiles (specpilot/bench/synthetic.py).

    python3 -m bench zoo_acceptance --out bench/results/zoo_acceptance.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

from specpilot.engine.engine import SpecEngine
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.prompts import load_prompts, resolve_prompt_set
from specpilot.spec_decode.drafters.registry import build_drafter
from specpilot.spec_decode.forcing import ForcingReport, force_check
from specpilot.spec_decode.tree import TreeSpec

PAIRS = (("dense", "dense-dflash"), ("dense", "dense-eagle3"), ("dense", "draft-lm"),
         ("hybrid", "hybrid-dflash"), ("hybrid", "hybrid-eagle3"), ("hybrid", "draft-lm"))


def measure(zoo: Path, target: str, drafter: str, tree: str, prompts: list[list[int]], new_tokens: int,
            batch: int, device: str) -> dict:
    model = load_model(str(zoo / target), device, "float32")
    tok = load_tokenizer(str(zoo / target))
    runner = ModelRunner(model)
    draft = build_drafter(str(zoo / drafter), model, tok, runtime=runner.runtime)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    engine = SpecEngine(runner, draft, TreeSpec.parse(tree), scheduler=SchedulerConfig(adaptive=False))
    steps = emitted = 0
    drafted, accepted = [0] * 8, [0] * 8
    report, outputs = ForcingReport(), []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        for result, stats in engine.generate(prompts[i:i + batch], params):
            outputs.append(result.token_ids)
            steps += stats.steps
            emitted += len(result.token_ids)
            for counts, per_depth in ((drafted, stats.drafted_per_depth), (accepted, stats.accepted_per_depth)):
                for d, n in enumerate(per_depth):  # the two lists have their own lengths
                    counts[d] += n
    seconds = time.perf_counter() - t0
    checker = ModelRunner(model)
    for i, (p, out) in enumerate(zip(prompts, outputs)):
        force_check(checker, p, out, report, i)
    depth = [round(a / n, 4) if n else None for n, a in zip(drafted, accepted)]
    return {"target": target, "drafter": drafter, "tree": tree, "prompts": len(prompts), "tokens": emitted,
            "steps": steps, "tau": round(emitted / steps, 4), "acceptance_per_depth": depth,
            "drafted_per_depth": drafted, "accepted_per_depth": accepted, "seconds": round(seconds, 2),
            "forcing": {"tokens": report.tokens, "mismatches": len(report.mismatches),
                        "max_margin": report.max_margin, "passed": not report.failures(1e-3)}}


def chain_profile(row: dict) -> dict:
    """A synthetic-acceptance profile (specpilot/bench/profiles) from a measured chain row: per depth, the chance
    that the drafted token is right given that its parent was (accepted at d / accepted at d-1)."""
    reached, per_depth = row["steps"], []
    for drafted, accepted in zip(row["drafted_per_depth"], row["accepted_per_depth"]):
        if not reached or not drafted:
            break
        per_depth.append(round(accepted / reached, 4))
        reached = accepted
    name = row["drafter"] if row["drafter"].startswith(row["target"]) else f"{row['target']}-{row['drafter']}"
    return {"name": f"zoo-{name}", "per_depth": per_depth, "sibling_decay": 0.5,
            "source": f"measured: zoo {row['target']} + {row['drafter']}, {row['tree']}, {row['prompts']} HumanEval "
                      f"prompts, greedy, {row['tokens'] // row['prompts']} new tokens, tau {row['tau']} "
                      "(bench/results/zoo_acceptance.json); sibling_decay assumed"}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench zoo_acceptance", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--zoo", default="zoo")
    p.add_argument("--prompts", default="humaneval")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--trees", nargs="+", default=["chain:7", "dynamic:4,7,24"])
    p.add_argument("--pairs", nargs="+", default=[f"{t}:{d}" for t, d in PAIRS], help="TARGET:DRAFTER names")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--profiles", default=None, help="also write each chain row as a synthetic profile here")
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)
    zoo = Path(args.zoo)
    tok = load_tokenizer(str(zoo / "dense"))
    texts = [q.text for q in load_prompts(resolve_prompt_set(args.prompts), args.limit)]
    prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"command": "python3 -m bench zoo_acceptance " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                                    vars(args).items() if k != "out"),
           "commit": commit, "device": args.device, "cpu": platform.processor() or platform.machine(),
           "zoo": json.loads((zoo / "zoo.json").read_text()).get("built_at_commit"), "dtype": "float32",
           "prompts": args.prompts, "greedy": True, "rows": []}
    for pair in args.pairs:
        target, drafter = pair.split(":")
        for tree in args.trees:
            row = measure(zoo, target, drafter, tree, prompts, args.max_new_tokens, args.batch, args.device)
            doc["rows"].append(row)
            Path(args.out).write_text(json.dumps(doc, indent=1))
            if args.profiles and row["tree"].startswith("chain"):
                prof = chain_profile(row)
                Path(args.profiles).mkdir(parents=True, exist_ok=True)
                Path(args.profiles, f"{prof['name']}.json").write_text(json.dumps(prof, indent=1) + "\n")
            print(f"{target:7s} {drafter:14s} {tree:16s} tau {row['tau']:.2f} per depth {row['acceptance_per_depth']}"
                  f" forcing {'pass' if row['forcing']['passed'] else 'FAIL'} ({row['seconds']:.0f} s)", flush=True)

