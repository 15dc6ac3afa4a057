"""How far two valid forward paths of a random-weight target drift apart, per generated position.

Path A is AR decode (one token a step through the decode kernels, as the stock AR baseline runs); path B is
one teacher-forced block over the same tokens (the block kernels: tree attention or SDPA, chunked Gated
DeltaNet). On a trained model the two agree to rounding; the bench's token forcing and its synthetic oracle
assume so. This measures, for a random bf16 target in a real shape cut to several depths (and in fp32 at the
shallowest cut, where the paths must agree to ~1e-5): per decode position, the largest |logit difference|,
its RMS relative to the logits' RMS, whether the argmax agrees, and the forced logits' top-1 - top-2 gap.
An error that grows with the position points at state carried between steps (KV, conv window, recurrent
state); one that is large from the first position and grows with depth is the network amplifying rounding.
--kind margin profiles the margin targets instead (specpilot/bench/shapes.py; the margin_check benchmark holds
their gate against this noise and their speed).

    python3 -m bench path_noise --out bench/results/path_noise_h200.json
    python3 -m bench path_noise --out /tmp/pn.json --device cpu --shapes tiny-hybrid \
        --layers 2 --prompt 16 --tokens 8   # dry run
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from bench.common import Report, attempt, run_record
from specpilot.bench.shapes import SHAPES, margin_model, random_model
from specpilot.runtime.runner import ModelRunner
from specpilot.layers.metadata import BatchMetadata


@torch.inference_mode()
def profile(shape: str, layers: int, dtype: torch.dtype, prompt_len: int, tokens: int, seed: int,
            kind: str = "flat", device: str = "cuda") -> dict:
    config_cls, kw = SHAPES[shape]
    depth = min(layers, kw.get("num_hidden_layers", layers)) if layers > 0 else kw.get("num_hidden_layers")
    cfg = config_cls(**{**kw, "num_hidden_layers": depth})
    model = (margin_model if kind == "margin" else random_model)(cfg, device, dtype)
    runner, dev = ModelRunner(model), device
    rng = random.Random(seed)
    prompt = [rng.randrange(model.config.vocab_size) for _ in range(prompt_len)]
    runner.allocate(1, prompt_len + tokens + 1)
    decoded = [runner.prefill(0, prompt).float()]
    out = [int(decoded[0].argmax())]
    for i in range(tokens - 1):  # greedy AR decode, keeping each step's logits
        logits = runner.decode(torch.tensor([out[-1]], device=dev), torch.tensor([prompt_len + i], device=dev))[0]
        decoded.append(logits.float().clone())  # a decode graph returns the same static buffer every step
        out.append(int(logits.argmax()))
    runner.cache.reset(torch.tensor([0], device=dev))
    ids = torch.tensor((prompt + out)[:-1], device=dev)[None]
    zero = torch.tensor([0], device=dev)
    meta = BatchMetadata.contiguous(ids, zero, zero, 0, runner.runtime.prefill)
    forced = runner.logits(runner.forward(meta))[0, prompt_len - 1:].float()
    dec = torch.stack(decoded)
    diff = (forced - dec).abs()
    top2 = forced.topk(2, dim=-1).values
    res = {"shape": shape, "kind": kind, "layers": depth, "dtype": str(dtype).removeprefix("torch."),
           "prompt": prompt_len,
           "tokens": tokens,
           "max_abs_diff": diff.amax(-1).tolist(),
           "rel_rms_diff": (diff.pow(2).mean(-1).sqrt() / forced.pow(2).mean(-1).sqrt()).tolist(),
           "argmax_agree": (forced.argmax(-1) == dec.argmax(-1)).tolist(),
           "top1_gap": (top2[:, 0] - top2[:, 1]).tolist(),
           "logit_std": forced.std(-1).mean().item()}
    del model, runner
    if dev == "cuda":
        torch.cuda.empty_cache()
    return res


def summary(r: dict) -> str:
    n = len(r["max_abs_diff"])
    q = max(1, n // 4)
    first, last = r["rel_rms_diff"][:q], r["rel_rms_diff"][-q:]
    return (f"{r['shape']:>12} {r['layers']:>3}L {r['dtype']:>8}: logit std {r['logit_std']:.3g}, "
            f"max|diff| {max(r['max_abs_diff']):.3g}, rel rms diff first {sum(first) / q:.3g} -> last "
            f"{sum(last) / q:.3g}, argmax agree {sum(r['argmax_agree'])}/{n}, median top1 gap "
            f"{sorted(r['top1_gap'])[n // 2]:.3g}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench path_noise", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=["Qwen3.5-27B", "Qwen3-8B"])
    p.add_argument("--layers", type=int, nargs="+", default=[4, 16, 0], help="depth cuts (0: the full depth)")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--device", default="cuda")
    p.add_argument("--kind", choices=["flat", "margin"], default="flat", help="random weights: flat or margin")
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    report = Report(args.out, {**run_record(args.device, args.commit), "runs": []})
    for shape in args.shapes:
        runs = [(layers, torch.bfloat16) for layers in args.layers] + [(min(args.layers) or 4, torch.float32)]
        for layers, dtype in runs:
            r = attempt(f"{shape} {layers}L {dtype}", profile, shape, layers, dtype, args.prompt, args.tokens, 0,
                        args.kind, args.device)
            report["runs"].append(r)
            report.save()
            print(summary(r) if "max_abs_diff" in r else json.dumps(r)[:400], flush=True)

