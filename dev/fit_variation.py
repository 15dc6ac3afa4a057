"""Fits the acceptance variation model (specpilot/bench/variation.py) to the trained zoo's per-request acceptance
traces and writes bench/results/zoo_variation_fit.json.

Records, per target/drafter pair, the accepted drafts of every step of every request (chain:7 at every step, greedy,
fp32 CPU, continuous batching of `--batch` requests): a thin wrapper around the drafter logs len(accepted) at each
commit, per request; the engine is untouched. Then fits the model's shape (between-request Beta mix, per-step
redraw, easy/hard contrast) by simulated moments (the per-request tau spread, the within-request autocorrelation at
lags 1, 2, 4, 8, the pooled lag-1), per pair and jointly over the two DFlash pairs (the shape the dflash2 profiles
carry), and puts the traces' statistics beside the fitted model's and the i.i.d. profile's, simulated by the plain
per-request reference (specpilot.bench.variation.simulate).

    OMP_NUM_THREADS=1 python3 dev/fit_variation.py --out bench/results/zoo_variation_fit.json
    python3 dev/fit_variation.py --traces-from bench/results/zoo_variation_fit.json --out ...  # refit only
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from specpilot.bench.synthetic import AcceptanceProfile
from specpilot.bench.variation import MOMENTS, fit, moment_errors, pooled_per_depth, simulate, trace_stats
from specpilot.demo import zoo_dir
from specpilot.engine.engine import SpecEngine
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.prompts import load_prompts, resolve_prompt_set
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.drafters.registry import build_drafter
from specpilot.spec_decode.tree import TreeSpec

PAIRS = (("dense", "dense-dflash"), ("hybrid", "hybrid-dflash"), ("dense", "dense-eagle3"),
         ("hybrid", "mtp"), ("dense", "draft-lm"), ("hybrid", "draft-lm"))  # mtp: the layer in zoo/hybrid itself
JOINT = ("dense:dense-dflash", "hybrid:hybrid-dflash")  # the dflash2 profiles' shape: the zoo's DFlash drafters
TREE, DEPTH = "chain:7", 7
PROFILES, PROFILE_TOKENS = ("dflash2-gsm8k", "dflash2-mixed"), 2048


class Recorder:
    """Delegates to a drafter; logs, per request (told apart by its prompt), the number of drafts accepted at each
    commit. Slots are reused by new requests; a request resumed after a preemption starts again with its prompt
    and what it emitted, and its trace goes on."""

    def __init__(self, inner, prompts: list[list[int]]):
        self.inner = inner
        self.traces = {tuple(p): [] for p in prompts}
        if len(self.traces) != len(prompts):
            raise ValueError("the prompts repeat: traces are kept per prompt")
        self.slot: dict[int, list[int]] = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start(self, slot, prompt_ids, features=None):
        seq = tuple(prompt_ids)
        prompt = max((p for p in self.traces if seq[:len(p)] == p), key=len)
        self.slot[slot] = self.traces[prompt]
        self.inner.start(slot, prompt_ids, features)

    def commit(self, slot, accepted, features=None):
        self.slot[slot].append(len(accepted))
        self.inner.commit(slot, accepted, features)


def record(zoo: Path, target: str, drafter: str, prompts: list[list[int]], new_tokens: int, batch: int) -> dict:
    model = load_model(str(zoo / target), "cpu", "float32")
    tok = load_tokenizer(str(zoo / target))
    runner = ModelRunner(model)
    source = "mtp" if drafter == "mtp" else str(zoo / drafter)
    rec = Recorder(build_drafter(source, model, tok, runtime=runner.runtime), prompts)
    # every step the full chain: acceptance is the models' (the adaptive budget would cut the chain per request)
    engine = SpecEngine(runner, rec, TreeSpec.parse(TREE), scheduler=SchedulerConfig(max_num_seqs=batch,
                                                                                   adaptive=False))
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    engine.generate(prompts, params)
    traces = [rec.traces[tuple(p)] for p in prompts]
    return {"target": target, "drafter": drafter, "traces": ["".join(map(str, t)) for t in traces],
            "seconds": round(time.perf_counter() - t0, 1)}


def described(model, per_depth) -> dict:
    """The fit in readable terms beside its fields: the mixes' mean and spread, the steps between redraws, the two
    states' per-depth acceptance."""
    size = model.mix_a + model.mix_b
    easy, hard = model.tables(per_depth)
    return {**model.to_dict(), "mix_mean": round(model.mix_mean, 4),
            "mix_sd": round((model.mix_mean * (1 - model.mix_mean) / (size + 1)) ** 0.5, 4),
            "steps_between_redraws": round(1 / model.redraw, 2) if model.redraw else None,
            "easy_per_depth": [round(x, 4) for x in easy], "hard_per_depth": [round(x, 4) for x in hard]}


def judged(traces: list[list[int]], per_depth, model, budget: int, seed: int) -> dict:
    """The traces' statistics beside the fitted model's and the i.i.d. profile's (no variation), simulated."""
    out = {"measured": trace_stats(traces, DEPTH)}
    for name, m in (("fitted", model), ("iid", None)):
        sim = simulate(m, per_depth, DEPTH, 4000, budget, random.Random(seed))
        out[name] = trace_stats(sim, DEPTH)
    return out


def profile_run(name: str, model, seed: int) -> dict:
    """A published profile with the joint shape, simulated at the benchmark's length (2,048 new tokens): the
    spread and correlation a synthetic run will show, beside the i.i.d. profile's."""
    per_depth = AcceptanceProfile.load(name).per_depth
    easy, hard = model.tables(per_depth)
    out = {"new_tokens": PROFILE_TOKENS, "easy_per_depth": [round(x, 4) for x in easy],
           "hard_per_depth": [round(x, 4) for x in hard]}
    for label, m in (("varied", model), ("iid", None)):
        out[label] = trace_stats(simulate(m, per_depth, DEPTH, 1000, PROFILE_TOKENS - 1, random.Random(seed)), DEPTH)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", default="humaneval")
    p.add_argument("--limit", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--pairs", nargs="+", default=[f"{t}:{d}" for t, d in PAIRS])
    p.add_argument("--traces-from", default=None, help="refit the traces of an earlier output (no zoo run)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if args.traces_from:
        old = json.loads(Path(args.traces_from).read_text())
        recorded, run = {k: v["recorded"] for k, v in old["pairs"].items()}, old["run"]
    else:
        zoo = zoo_dir()
        tok = load_tokenizer(str(zoo / "dense"))
        texts = [q.text for q in load_prompts(resolve_prompt_set(args.prompts), args.limit)]
        prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
        run = {"command": "OMP_NUM_THREADS=1 python3 dev/fit_variation.py " + " ".join(
                   f"--{k.replace('_', '-')} {' '.join(v) if isinstance(v, list) else v}"
                   for k, v in vars(args).items() if v is not None),
               "commit": commit, "device": "cpu", "cpu": platform.processor() or platform.machine(),
               "dtype": "float32", "tree": TREE, "prompts": args.prompts, "requests": len(prompts),
               "max_new_tokens": args.max_new_tokens, "greedy": True,
               "zoo": json.loads((zoo / "zoo.json").read_text()).get("built_at_commit")}
        recorded = {}
        for pair in args.pairs:
            target, drafter = pair.split(":")
            recorded[pair] = record(zoo, target, drafter, prompts, args.max_new_tokens, args.batch)
            print(f"{pair}: {len(recorded[pair]['traces'])} traces in {recorded[pair]['seconds']} s", flush=True)
        # the traces first: a fit that fails leaves them to refit (--traces-from)
        write(args.out, {"run": run, "pairs": {pair: {"recorded": rec} for pair, rec in recorded.items()}})
    budget = run["max_new_tokens"] - 1  # the prefill emits the first token; steps emit the rest
    command = "python3 dev/fit_variation.py " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = {"run": run, "fit_command": command, "fit_commit": commit,
           "model": "2-state Markov chain per request (specpilot/bench/variation.py)",
           "fit_method": "simulated moments: " + ", ".join(MOMENTS) + " (each in units of its standard error from "
                         "resampling the requests; simulated at the run's token budget, 1,000 requests)",
           "pairs": {}}
    for pair, rec in recorded.items():
        traces = [list(map(int, t)) for t in rec["traces"]]
        per_depth = pooled_per_depth(traces, DEPTH)
        model, loss = fit([(traces, per_depth)], budget, seed=args.seed)
        doc["pairs"][pair] = {"per_depth": [round(x, 4) for x in per_depth], "fit": described(model, per_depth),
                              "moment_loss": round(loss, 2), "moment_errors": moment_errors(traces, DEPTH),
                              **judged(traces, per_depth, model, budget, args.seed),
                              "recorded": rec}
        print(f"{pair}: {model}", flush=True)
    groups = [(tr, pooled_per_depth(tr, DEPTH)) for tr in
              ([list(map(int, t)) for t in recorded[pair]["traces"]] for pair in JOINT if pair in recorded)]
    if len(groups) == len(JOINT):
        model, loss = fit(groups, budget, seed=args.seed)
        doc["joint"] = {"pairs": list(JOINT), "fit": model.to_dict(), "moment_loss": round(loss, 2),
                        "described": {pair: described(model, pd) for pair, (_, pd) in zip(JOINT, groups)},
                        "per_pair": {pair: judged(tr, pd, model, budget, args.seed)
                                     for pair, (tr, pd) in zip(JOINT, groups)}}
        print(f"joint {JOINT}: {model}", flush=True)
        doc["profiles"] = {name: profile_run(name, model, args.seed) for name in PROFILES}
    write(args.out, doc)


def write(path: str, doc: dict) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    main()
