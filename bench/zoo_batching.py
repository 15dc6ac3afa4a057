"""Batch-aware speculation on the trained zoo (CPU, fp32, real acceptance): the continuous-batching engine's closed
loop at batch 4 and 8, its adaptive node budget and depth on (SchedulerConfig's default) and off
(SchedulerConfig(adaptive=False): the tree's full depth for every request every step), beside AR decoding through
the same scheduler (no drafter). Per row, tokens per unit of target cost: emitted tokens per verified token (each
step's root plus its drafted nodes) and per target forward (engine step), tau, and whether every request's output
equals AR's.

Acceptance depends on the models and the prompts, not on the hardware: the zoo's targets and drafters are tiny, so
this runs on a CPU; wall times here say nothing about a GPU.

    python3 -m bench zoo_batching --out bench/results/zoo_batching.json
    python3 -m bench zoo_batching --out /tmp/zb.json --limit 4 --max-new-tokens 16 --batch 2   # a quick look
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch

from bench.common import Report, run_record
from specpilot.bench.serving import closed_loop, mismatches, scheduler_config, summarize
from specpilot.demo import zoo_dir, zoo_pair
from specpilot.engine.engine import SpecEngine
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.prompts import load_prompts, resolve_prompt_set
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.drafters.registry import build_drafter
from specpilot.spec_decode.tree import TreeSpec

# (row name, SchedulerConfig fields other than max_num_seqs); AR has no drafter
ENGINES = (("ar", None), ("adaptive", {}), ("fixed", {"adaptive": False}))


def run_pair(target: str, drafter: str, prompts_text: list[str], args) -> list[dict]:
    """Every batch size x engine of one zoo pair; AR first at each batch size (the outputs the others must equal)."""
    target_dir, drafter_name = zoo_pair(target, drafter)
    model = load_model(str(target_dir), args.device, "float32")
    tok = load_tokenizer(str(target_dir))
    prompts = [tok.encode(t, add_special_tokens=False) for t in prompts_text]
    runner = ModelRunner(model)
    draft = build_drafter(drafter_name, model, tok, runtime=runner.runtime)
    tree = TreeSpec.parse(args.tree)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    rows = []
    for batch in args.batch:
        truth = None
        for name, fields in ENGINES:
            sched = scheduler_config(fields or {}, batch)
            engine = (SpecEngine(runner, None, None, scheduler=sched) if fields is None
                      else SpecEngine(runner, draft, tree, scheduler=sched))
            result = closed_loop(engine, prompts, batch, args.requests_per_client, params)
            row = {"target": target, "drafter": drafter, "engine": name, "batch": batch,
                   "tree": None if fields is None else args.tree, "scheduler": fields, **summarize(result)}
            if truth is None:
                truth = {tuple(prompts[r.prompt]): r.tokens for r in result.records}
            else:
                row["mismatched_requests"] = mismatches(result, truth, prompts)
                row["exact"] = row["mismatched_requests"] == 0
            rows.append(row)
            print(f"{target:6s} {drafter:8s} b{batch} {name:8s} tokens/verified {row.get('tokens_per_verified', 1):.3f}"
                  f"  tokens/forward {row['tokens_per_step']:.2f}  tau {row.get('tau', 1):.2f}"
                  f"  {'exact' if row.get('exact', True) else 'NOT EXACT'}", flush=True)
    return rows


def _check(p: argparse.ArgumentParser, args) -> None:
    """Bad flags: one line and status 2 before anything loads."""
    for pair in args.pairs:
        target, sep, drafter = pair.partition(":")
        if not sep or target not in ("dense", "hybrid") or drafter not in ("dflash", "eagle3", "mtp", "draft-lm", "ngram"):
            p.error(f"--pairs {pair!r}: use TARGET:DRAFTER with TARGET dense or hybrid and DRAFTER dflash, eagle3, "
                    "mtp, draft-lm or ngram (the zoo's: dense has eagle3, hybrid mtp)")
    if min(args.batch + [args.limit, args.max_new_tokens, args.requests_per_client]) < 1:
        p.error("--batch, --limit, --max-new-tokens and --requests-per-client take numbers >= 1")
    try:
        TreeSpec.parse(args.tree)
    except ValueError as e:
        p.error(str(e))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench zoo_batching", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--pairs", nargs="+", default=["dense:dflash", "hybrid:dflash"],
                   help="TARGET:DRAFTER of the zoo (drafter: dflash, eagle3 (dense), mtp (hybrid), draft-lm, ngram)")
    p.add_argument("--prompts", default="humaneval", help="prompt set (held out: the zoo trained on code files)")
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, nargs="+", default=[4, 8])
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--tree", default="chain:7", help="the speculative engines' tree (fixed: always all of it)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    _check(p, args)
    if zoo_dir() is None:
        raise SystemExit("error: no trained zoo (zoo/ or $SPECPILOT_ZOO); rebuild it with `specpilot train zoo`")
    torch.set_grad_enabled(False)
    texts = [q.text for q in load_prompts(resolve_prompt_set(args.prompts), args.limit)]
    report = Report(Path(args.out), {**run_record(args.device), "cpu": platform.processor() or platform.machine(),
                                     "dtype": "float32", "acceptance": "real", "prompts": args.prompts,
                                     "limit": args.limit, "max_new_tokens": args.max_new_tokens,
                                     "requests_per_client": args.requests_per_client, "rows": []})
    for pair in args.pairs:
        target, drafter = pair.split(":")
        report["rows"] = report["rows"] + run_pair(target, drafter, texts, args)
