"""Margin targets against flat random targets in the real shapes: the top-2 logit gap against the bf16 path-to-path
noise, then the AR decode speed of both, side by side in one run.

Correctness first. Per shape and depth, both kinds of target (specpilot.bench.shapes: "margin", the planted
circuit; "flat", every weight random) decode --prompts random prompts greedily, --batch at a time, through the AR
decode path (decode kernels and graphs, one token a step), keeping every step's logits; then one teacher-forced
block over each prompt and its output (the block kernels a verify runs). Per generated position: the largest
|logit difference| between the two paths, the forced logits' top-1 - top-2 gap, whether the argmaxes agree. The
noise of a target is the largest difference over all its positions; the margin target passes when its gap
exceeds 20 x its noise at >= 99.9% of positions (the flat target's noise and gaps are recorded beside it: its gap
is below its own noise at most positions).

Then timing: AR decode tok/s of the two targets at batch 1 and --batch, the median of --reps repetitions,
interleaved margin, flat, margin, ... after a warm-up of each: the same shapes and kernels must give the same
speed within noise.

    python3 -m bench margin_check --out bench/results/margin_check_h200.json
    python3 -m bench margin_check --out /tmp/mc.json --device cpu --shapes tiny-dense tiny-hybrid \
        --layers 0 --prompts 2 --batch 2 --tokens 12 --reps 1   # dry run
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from bench.common import Report, attempt, run_record, sync
from specpilot.bench.shapes import hf_config, margin_model, random_model
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.layers.metadata import BatchMetadata

RATIO, SHARE = 20.0, 0.999  # the gate: gap > RATIO x noise at >= SHARE of positions


def build(kind: str, shape: str, layers: int, overrides: dict, device: str, dtype: torch.dtype):
    cfg = hf_config(shape, **overrides, **({"num_hidden_layers": layers} if layers else {}))
    return (margin_model if kind == "margin" else random_model)(cfg, device, dtype)


def prompts_for(vocab: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length + (i % 5))] for i in range(n)]  # ragged by a few tokens


@torch.inference_mode()
def decode_with_logits(runner: ModelRunner, prompts: list[list[int]], tokens: int):
    """Greedy AR decode of the prompts together (slot per prompt): outputs and each step's logits [n, tokens, V]
    (bf16 holds them exactly: the LM head's output is bf16)."""
    dev, n = runner.device, len(prompts)
    runner.allocate(n, max(map(len, prompts)) + tokens + 1)
    first = torch.stack([runner.prefill(i, p) for i, p in enumerate(prompts)])
    logits = torch.empty(n, tokens, first.shape[-1], dtype=torch.bfloat16, device=dev)
    logits[:, 0] = first
    ids = first.argmax(-1)
    out = [ids]
    positions = torch.tensor([len(p) for p in prompts], device=dev)
    for t in range(1, tokens):
        step = runner.decode(ids, positions)  # a decode graph returns one static buffer: copied out here
        logits[:, t] = step
        ids = step.argmax(-1)
        out.append(ids)
    return torch.stack(out, 1).tolist(), logits


@torch.inference_mode()
def forced_logits(runner: ModelRunner, prompt: list[int], output: list[int]) -> torch.Tensor:
    """One teacher-forced block over prompt + output[:-1] (the block kernels): the logits predicting each output."""
    dev = runner.device
    runner.cache.reset(torch.tensor([0], device=dev))
    ids = torch.tensor(list(prompt) + list(output[:-1]), device=dev)[None]
    zero = torch.tensor([0], device=dev)
    hidden = runner.forward(BatchMetadata.contiguous(ids, zero, zero, 0, runner.runtime.prefill))
    return runner.logits(hidden)[0, len(prompt) - 1:]


def path_stats(model, prompts: list[list[int]], tokens: int, batch: int) -> dict:
    """Per generated position: max |AR decode - forced| logit, the forced top-2 gap, argmax agreement."""
    runner = ModelRunner(model)
    diff, gap, agree = [], [], []
    for i in range(0, len(prompts), batch):
        group = prompts[i:i + batch]
        outs, decoded = decode_with_logits(runner, group, tokens)
        for j, (p, o) in enumerate(zip(group, outs)):
            forced = forced_logits(runner, p, o).float()
            dec = decoded[j].float()
            diff += (forced - dec).abs().amax(-1).tolist()
            top = forced.topk(2, dim=-1).values
            gap += (top[:, 0] - top[:, 1]).tolist()
            agree += (forced.argmax(-1) == dec.argmax(-1)).tolist()
    runner.cache = None
    noise = max(diff)
    cleared = sum(g > RATIO * noise for g in gap) / len(gap)
    q = statistics.quantiles(gap, n=1000)
    return {"positions": len(gap), "noise": noise, "noise_p999": statistics.quantiles(diff, n=1000)[-1],
            "gap_min": min(gap), "gap_p001": q[0], "gap_p01": q[9], "gap_median": statistics.median(gap),
            "argmax_agree": sum(agree) / len(agree), "gap_over_ratio_x_noise": cleared,
            "passed": cleared >= SHARE, "gaps": gap}


def time_ar(models: dict, prompts: list[list[int]], tokens: int, batch: int, reps: int) -> dict:
    """AR decode tok/s of each model on the same prompts: warm-up, then reps rounds interleaving the models."""
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    group = prompts[:batch]
    runners = {name: ModelRunner(m) for name, m in models.items()}
    seconds = {name: [] for name in models}
    for r in runners.values():
        r.allocate(batch, max(map(len, group)) + tokens + 1)
        Generator(r).generate(group, SamplingParams(max_new_tokens=8, ignore_eos=True))  # graphs, compiles
    for _ in range(reps):
        for name, r in runners.items():
            sync(r.device)
            t0 = time.perf_counter()
            Generator(r).generate(group, params)
            sync(r.device)
            seconds[name].append(time.perf_counter() - t0)
    for r in runners.values():
        r.graphs.clear()
        r.cache = None
    out = {name: {"tok_per_s": batch * tokens / statistics.median(s), "seconds": s} for name, s in seconds.items()}
    if {"margin", "flat"} <= set(out):
        out["margin_over_flat"] = out["margin"]["tok_per_s"] / out["flat"]["tok_per_s"]
        # the noise the ratio is judged against: each model's spread of repetitions (max / min - 1), summed
        out["rep_spread"] = sum(max(s) / min(s) - 1 for s in seconds.values())
        out["within_noise"] = abs(out["margin_over_flat"] - 1) <= max(out["rep_spread"], 0.01)
    return out


def run(shape: str, layers: int, args, overrides: dict) -> dict:
    dtype = getattr(torch, args.dtype)
    models = {kind: build(kind, shape, layers, overrides, args.device, dtype) for kind in ("margin", "flat")}
    cfg = models["margin"].config
    prompts = prompts_for(cfg.vocab_size, args.prompts, args.prompt)
    res = {"shape": shape, "layers": cfg.num_hidden_layers, "dtype": args.dtype, "overrides": overrides,
           "prompts": args.prompts, "prompt_len": args.prompt, "tokens": args.tokens}
    for kind, model in models.items():
        res[kind] = attempt(f"{shape} {layers} {kind} paths", path_stats, model, prompts, args.tokens, args.batch)
    if "noise" in res["flat"] and "noise" in res["margin"]:
        # the stricter reading: the margin target's gaps against the larger of the two targets' noise
        worst = max(res["margin"]["noise"], res["flat"]["noise"])
        gaps = res["margin"].pop("gaps")
        res["margin"]["gap_over_ratio_x_worst_noise"] = sum(g > RATIO * worst for g in gaps) / len(gaps)
    for kind in models:
        res[kind].pop("gaps", None)
    res["timing"] = {f"b{b}": attempt(f"{shape} {layers} timing b{b}", time_ar, models, prompts, args.timing_tokens,
                                      b, args.reps) for b in sorted({1, args.batch})}
    del models
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return res


def summary(r: dict) -> str:
    m, f = r["margin"], r["flat"]
    if "noise" not in m or "noise" not in f:
        return f"{r['shape']:>12} {r['layers']:>3}L: failed ({m.get('error', f.get('error', ''))[:200]})"
    speed = "".join(f", AR {b} margin/flat {t['margin_over_flat']:.3f} (spread {t['rep_spread']:.3f}, "
                    f"{'within' if t['within_noise'] else 'OUTSIDE'} noise)"
                    for b, t in r["timing"].items() if "margin_over_flat" in t)
    worst = m.get("gap_over_ratio_x_worst_noise")
    also = f"(against the flat noise too: {100 * worst:.2f}%) " if worst is not None else ""
    return (f"{r['shape']:>12} {r['layers']:>3}L: margin noise {m['noise']:.3g}, gap min {m['gap_min']:.3g} "
            f"p0.1% {m['gap_p001']:.3g}, >{RATIO:g}x noise at {100 * m['gap_over_ratio_x_noise']:.2f}% {also}"
            f"[{'PASS' if m['passed'] else 'FAIL'}] | flat noise {f['noise']:.3g}, gap median {f['gap_median']:.3g}, "
            f"argmax agree {100 * f['argmax_agree']:.1f}%{speed}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench margin_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=["Qwen3.5-27B", "Qwen3-8B"])
    p.add_argument("--layers", type=int, nargs="+", default=[4, 8, 0], help="depth cuts (0: the full depth)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt", type=int, default=64, help="prompt length (+ 0..4, ragged)")
    p.add_argument("--tokens", type=int, default=128, help="generated tokens per prompt for the noise and gaps")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--timing-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--override", nargs="*", default=[], help="config fields KEY=INT (CPU dry runs of the real "
                                                               "hidden sizes with a smaller vocabulary, ...)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    overrides = {k: int(v) for k, v in (o.split("=") for o in args.override)}
    report = Report(args.out, {**run_record(args.device, args.commit), "ratio": RATIO, "share": SHARE, "runs": []})
    ok = True
    for shape in args.shapes:
        for layers in args.layers:
            r = attempt(f"{shape} {layers}L", run, shape, layers, args, overrides)
            report["runs"].append(r if "error" not in r else {"shape": shape, "layers": layers, **r})
            report.save()
            print(summary(r) if "margin" in r else json.dumps(r)[:400], flush=True)
            ok = ok and r.get("margin", {}).get("passed", False)
    return 0 if ok else 1

