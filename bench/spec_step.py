"""Where a speculative step's time goes: per phase (propose, verify, accept, commit, emit) and per kernel, for a
random-weight target in a real shape with its random DFlash drafter (the `specpilot bench` pair).

One request on a random prompt. Acceptance is synthetic, as in the bench: the oracle drafts what the target's
verify answers (its probe: a verify pass that commits nothing; the oracle's work is labelled "oracle" and left
out of the propose phase and the step wall) under an acceptance profile (dflash2-gsm8k by default), so that
commits move what a bench step moves; the drafter still runs at full cost. After warm-up, --steps steps run
under torch.profiler with each phase labelled. A kernel is charged to the phase whose host range launched it
(through the launch's correlation id; a graph's kernels to the phase that replayed the graph). Output (JSON, and a
table): per phase, host ms per step (the labelled range) and GPU ms per step (kernel and copy durations) with its
top kernels; the step's wall. With --trace, the chrome trace too. Then what a request pays before its first
step: the prompt's prefill (and, on a hybrid target, an interleaved A/B of the GDN chunk form in torch against
the Triton kernel, EngineConfig.ablations.triton_gdn_prefill) and the speculative start.

    python3 -m bench spec_step --target Qwen3.5-27B --tree chain:7 --out /tmp/step.json
    python3 -m bench spec_step --target tiny-hybrid --device cpu --steps 3 --prompt 32 \
        --out /tmp/step.json   # dry run (CPU: host ranges only)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import json
import os
import random
import tempfile
import time

import torch

from bench.common import Report, engine_step, make_runner, run_record, start_requests, sync
from specpilot.bench.harness import BenchConfig, OracleClock
from specpilot.bench.probing import ProbingEngine
from specpilot.bench.shapes import hf_config, random_dflash, random_model
from specpilot.bench.synthetic import AcceptanceProfile, SyntheticDrafter
from specpilot.config import EngineConfig
from specpilot.engine.engine import SpecEngine
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.tree import TreeSpec

PHASES = ("schedule", "propose", "oracle", "verify", "accept", "commit", "emit")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def attribute(trace: dict, steps: int, top: int = 14) -> dict:
    """Chrome trace -> per phase: host ms per step, GPU ms per step, top kernels (GPU ms per step)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    ranges = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                    if e.get("cat") == "user_annotation" and e["name"] in PHASES)
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                 if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}

    def phase_at(ts: float) -> str:
        inner = "outside"
        for a, b, name in ranges:  # a handful per step: a scan is fine; the last range to open is the innermost
            if a <= ts <= b:
                inner = name
        return inner

    out = {p: {"host_ms": 0.0, "gpu_ms": 0.0, "kernels": collections.Counter()} for p in (*PHASES, "outside")}
    for a, b, name in ranges:
        out[name]["host_ms"] += (b - a) / 1e3 / steps
    for e in events:
        if e.get("cat") not in GPU_CATS:
            continue
        ts = launch_ts.get(e.get("args", {}).get("correlation"))
        phase = phase_at(ts) if ts is not None else "outside"
        ms = e["dur"] / 1e3 / steps
        out[phase]["gpu_ms"] += ms
        out[phase]["kernels"][e["name"][:120]] += ms
    out["propose"]["host_ms"] -= out["oracle"]["host_ms"]  # the synthetic oracle runs inside propose
    for v in out.values():
        v["top_kernels"] = [(k, round(ms, 4)) for k, ms in v.pop("kernels").most_common(top)]
    return out


@torch.inference_mode()
def profile_steps(args) -> dict:
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = random_model(hf_config(args.target), device, dtype)
    vocab = model.config.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt)] for _ in range(args.batch)]
    prompt = prompts[0]
    fields = dict(BenchConfig.parse(f"engine={args.engine}", args.tree).engine)  # the bench's --engine syntax
    cfg = EngineConfig.from_dict(fields)
    tokens = (args.warmup + 2 * args.steps) * 8 + 64
    stock = make_runner(model, cfg)
    truth = Generator(stock).generate(prompts, SamplingParams(max_new_tokens=tokens, ignore_eos=True))
    runner = make_runner(model, cfg)
    clock, labels = OracleClock(torch.device(device)), [contextlib.nullcontext]

    def oracle(fn, *args):
        with labels[0]("oracle"):
            return clock(fn, *args)

    drafter = SyntheticDrafter(random_dflash(model, args.target, runtime=runner.runtime),
                               {tuple(p): list(t.token_ids) for p, t in zip(prompts, truth)},
                               AcceptanceProfile.load(args.profile), vocab, untimed=oracle)
    spec = TreeSpec.parse(args.tree)
    engine = ProbingEngine(runner, drafter, spec, scheduler=SchedulerConfig(adaptive=args.adaptive))
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    reqs = start_requests(engine, prompts, params)

    def step(label=None):
        engine_step(engine, label)

    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(args.warmup):
        step()
    sync(device)
    walls, emitted0 = [], sum(len(r.result.token_ids) for r in reqs)
    for _ in range(args.steps):
        t0, probed = time.perf_counter(), clock.seconds
        step()
        sync(device)
        walls.append((time.perf_counter() - t0 - (clock.seconds - probed)) * 1e3)
    emitted = sum(len(r.result.token_ids) for r in reqs) - emitted0
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    labels[0] = record_function
    with profile(activities=acts) as prof:
        for _ in range(args.steps):
            step(record_function)
            sync(device)
    path = args.trace or os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        phases = attribute(json.load(f), args.steps)
    walls.sort()
    for r in reqs:
        engine.abort(r.request_id)
    prefill = time_prefill(runner, prompt, device)
    prefill["request_start_ms"] = time_start(engine, prompt, params, device)
    if model.config.is_hybrid:
        prefill["triton_gdn_prefill"] = ab_gdn_prefill(model, cfg, prompt, device)
    nodes = [sum(s["nodes"]) for s in list(engine.step_log)[-args.steps:]]
    return {"prefill": prefill, "target": args.target, "tree": args.tree, "engine": fields, "profile": args.profile,
            "batch": args.batch, "adaptive": args.adaptive, "draft_nodes_per_step": sorted(nodes)[len(nodes) // 2],
            "prompt": args.prompt, "steps": args.steps, "tokens_per_step": emitted / args.steps,
            "step_wall_ms_median": walls[len(walls) // 2], "phases": phases,
            "gpu_ms_per_step": sum(p["gpu_ms"] for n, p in phases.items() if n != "oracle"),
            "note": "phase GPU ms: kernels launched in that phase's host range, per step (the profiled steps)"}


def time_prefill(runner: ModelRunner, prompt: list[int], device, reps: int = 3) -> dict:
    """What every request pays before its first step, and the ops that dominate it: the prompt's prefill (after
    the warm-up above compiled it), median of `reps`, then one more under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    slot = runner.cache.num_slots - 1
    ms = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        runner.prefill(slot, prompt)
        sync(device)
        ms.append((time.perf_counter() - t0) * 1e3)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        runner.prefill(slot, prompt)
        sync(device)
    rows = prof.key_averages()
    host = sorted(rows, key=lambda r: r.self_cpu_time_total, reverse=True)[:12]
    gpu = sorted(rows, key=lambda r: getattr(r, "self_device_time_total", 0), reverse=True)[:12]
    return {"tokens": len(prompt), "ms_median": sorted(ms)[len(ms) // 2], "ms": ms,
            "top_host_ops_ms": [(r.key[:80], r.count, round(r.self_cpu_time_total / 1e3, 3)) for r in host],
            "top_gpu_ops_ms": [(r.key[:80], r.count, round(getattr(r, "self_device_time_total", 0) / 1e3, 3))
                               for r in gpu]}


def ab_gdn_prefill(model, engine: EngineConfig, prompt: list[int], device, reps: int = 3) -> dict:
    """The prompt's prefill with the GDN chunk form in torch (a) and as one Triton kernel per layer (b,
    EngineConfig.ablations.triton_gdn_prefill), each on a runner of its own, interleaved, after a warm-up of each;
    and how far their logits differ."""
    runners = {on: make_runner(model, engine.replace(triton_gdn_prefill=on)) for on in (False, True)}
    ms, logits = {False: [], True: []}, {}
    for runner in runners.values():
        runner.allocate(1, len(prompt) + 1)
    for i in range(reps + 1):
        for on, runner in runners.items():
            sync(device)
            t0 = time.perf_counter()
            logits[on] = runner.prefill(0, prompt).float()
            sync(device)
            if i:  # the first round compiles
                ms[on].append((time.perf_counter() - t0) * 1e3)
    for runner in runners.values():
        runner.cache = None
    diff = (logits[True] - logits[False]).abs().max().item()
    same = int(logits[True].argmax()) == int(logits[False].argmax())
    return {"torch_ms": ms[False], "triton_ms": ms[True], "max_abs_logit_diff": diff,
            "logit_std": logits[False].std().item(), "same_argmax": same}


def time_start(engine: SpecEngine, prompt: list[int], params, device, reps: int = 3) -> list[float]:
    """What a speculative request pays before its first step: the engine's start (prefill with the drafter's
    feature layers, the drafter's start) and the first proposal, which takes in the prompt's features."""
    drafter, ms = getattr(engine.drafter, "inner", engine.drafter), []  # the real drafter, not the oracle
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        reqs = start_requests(engine, [prompt], params)
        drafter.propose([r.slot for r in reqs], [r.root for r in reqs], engine.tree)
        sync(device)
        ms.append((time.perf_counter() - t0) * 1e3)
        for r in reqs:
            engine.abort(r.request_id)
    return ms


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench spec_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--target", default="Qwen3.5-27B", help="a shape of specpilot.bench.shapes (random weights)")
    p.add_argument("--tree", default="chain:7")
    p.add_argument("--engine", default="block_attention:tree;verify_graphs:true", help="EngineConfig FIELD:VALUE;...")
    p.add_argument("--profile", default="dflash2-gsm8k", help="synthetic acceptance profile")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--batch", type=int, default=1, help="requests decoding together (random prompts)")
    p.add_argument("--adaptive", action="store_true", help="the engine's node budget (default: the full tree)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--trace", default=None, help="also keep the chrome trace here (.json or .json.gz)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    if min(args.batch, args.steps, args.prompt) < 1 or args.warmup < 0:
        p.error("--batch, --steps and --prompt take numbers >= 1, --warmup a number >= 0")
    torch.manual_seed(0)
    report = Report(args.out, {**run_record(args.device, args.commit), "synthetic": True})
    r = profile_steps(args)
    report.data.update(r)
    report.save()
    print(f"{args.target} {args.tree} batch {args.batch}: step wall {r['step_wall_ms_median']:.2f} ms, GPU {r['gpu_ms_per_step']:.2f} "
          f"ms, {r['tokens_per_step']:.2f} tokens/step (synthetic acceptance)")
    print(f"prefill of {r['prefill']['tokens']} tokens: {r['prefill']['ms_median']:.2f} ms; a speculative request's "
          f"start with its first proposal: {min(r['prefill']['request_start_ms']):.2f} ms")
    if "triton_gdn_prefill" in r["prefill"]:
        ab = r["prefill"]["triton_gdn_prefill"]
        print(f"GDN prefill, torch chunk form vs Triton kernel: {min(ab['torch_ms']):.2f} vs "
              f"{min(ab['triton_ms']):.2f} ms, max |logit diff| {ab['max_abs_logit_diff']:.3g}")
    print(f"{'phase':>9} {'host ms':>8} {'GPU ms':>8}  top kernels (GPU ms per step)")
    for name, ph in r["phases"].items():
        if ph["host_ms"] or ph["gpu_ms"]:
            tops = "; ".join(f"{k[:48]} {ms:.3f}" for k, ms in ph["top_kernels"][:3])
            print(f"{name:>9} {ph['host_ms']:8.3f} {ph['gpu_ms']:8.3f}  {tops}")

