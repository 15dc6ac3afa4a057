"""Batch-1 (and batch 8/32) autoregressive decode on random-weight bf16 models in real shapes, on one GPU.

Side by side in one process: specpilot's decode step (CUDA graph) and transformers' `generate` on the SAME
weights (HF parameters are views of ours), against the roofline = bytes a decode step must read / measured
device copy bandwidth. Correctness first: our prefill logits and decode logits are compared with HF's.

    PYTHONPATH=. python3 bench/ar_decode.py --out bench/results/ar_decode_h200.json

Prints a table last and writes the full JSON (GPU, commit, command, every timing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import transformers

from specpilot.bench import shapes
from specpilot.config import EngineConfig
from specpilot.engine.runner import ModelRunner
from specpilot.layers.packed import PackedLinear
from specpilot.models.loader import build_empty

DEVICE = "cuda"

SHAPES = shapes.SHAPES


def copy_bandwidth(nbytes: int = 4 << 30, reps: int = 20) -> float:
    """Bytes read + written per second by a large device-to-device copy (median)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    times = []
    for i in range(reps + 3):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * nbytes / statistics.median(times)


def random_model(hf_cfg, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    return shapes.random_model(hf_cfg, DEVICE, dtype)


def hf_view(ours, hf_cfg):
    """transformers' model whose parameters are views of ours (no extra weight memory)."""
    hf_cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        hf = getattr(transformers, hf_cfg.architectures[0])(hf_cfg)
    params, modules = dict(ours.named_parameters()), dict(ours.named_modules())
    state = {}
    for name in hf.state_dict():
        parent, leaf, kind = ("", *name.rsplit(".", 2))[-3:]
        packed = next((m for p, m in modules.items() if isinstance(m, PackedLinear) and p.rsplit(".", 1)[0] == parent
                       and leaf in m.shards), None)
        if packed is not None:
            pname = next(p for p, m in modules.items() if m is packed)
            start, rows = packed.shard_rows(leaf)
            state[name] = params[f"{pname}.{kind}"][start:start + rows]
        else:
            state[name] = params[name]
    hf.load_state_dict(state, strict=True, assign=True)
    hf.model.rotary_emb = type(hf.model.rotary_emb)(hf.config).to(DEVICE)
    for name, buf in hf.named_buffers():
        assert buf.device.type == DEVICE, f"buffer {name} left on {buf.device}"
    return hf.eval()


def time_ours(runner, batch: int, ctx: int, steps: int, vocab: int) -> dict:
    runner.allocate(batch, ctx + 2 * steps + 8)
    prompts = torch.randint(0, vocab, (batch, ctx), device=DEVICE)
    t0 = time.perf_counter()
    logits = torch.stack([runner.prefill(i, prompts[i].tolist()) for i in range(batch)])
    torch.cuda.synchronize()
    prefill_s = time.perf_counter() - t0
    tokens = logits.argmax(-1)
    positions = torch.full((batch,), ctx, dtype=torch.long, device=DEVICE)
    for _ in range(3):  # capture + warm-up (writes beyond the timed region are overwritten)
        tokens = runner.decode(tokens, positions).argmax(-1)
    per_step = []
    for _ in range(steps):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        tokens = runner.decode(tokens, positions).argmax(-1)
        end.record()
        per_step.append((start, end))
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in per_step]
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens = runner.decode(tokens, positions).argmax(-1)
    torch.cuda.synchronize()
    loop_s = (time.perf_counter() - t0) / steps
    return {"batch": batch, "ctx": ctx, "prefill_s": prefill_s, "step_ms_median": statistics.median(ms),
            "step_ms_p10": sorted(ms)[len(ms) // 10], "loop_step_ms": loop_s * 1e3,
            "tok_per_s": batch / (statistics.median(ms) / 1e3)}


def time_hf(hf, ctx: int, new_tokens: int, vocab: int) -> dict:
    ids = torch.randint(0, vocab, (1, ctx), device=DEVICE)
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)

    def run(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    run(2)
    t1, tn = run(1), run(new_tokens)
    step = (tn - t1) / (new_tokens - 1)
    return {"ctx": ctx, "new_tokens": new_tokens, "step_ms": step * 1e3, "tok_per_s": 1 / step}


@torch.inference_mode()
def ours_logits(runner, ids: torch.Tensor, forced: list[int]) -> torch.Tensor:
    """Last prefill logits, then one decode step per forced token: [1 + len(forced), vocab] fp32."""
    runner.allocate(1, ids.shape[1] + len(forced) + 8)
    rows = [runner.prefill(0, ids[0].tolist())]
    positions = torch.tensor([ids.shape[1]], device=DEVICE)
    for tok in forced:
        rows.append(runner.decode(torch.tensor([tok], device=DEVICE), positions)[0].clone())
    return torch.stack(rows)


@torch.inference_mode()
def hf_logits(hf, ids: torch.Tensor, forced: list[int]) -> torch.Tensor:
    out = hf(ids, use_cache=True)
    rows, cache = [out.logits[0, -1].float()], out.past_key_values
    for tok in forced:
        out = hf(torch.tensor([[tok]], device=DEVICE), past_key_values=cache, use_cache=True)
        rows.append(out.logits[0, -1].float())
        cache = out.past_key_values
    return torch.stack(rows)


def compare(a: torch.Tensor, ref: torch.Tensor) -> dict:
    rel = ((a - ref).norm(dim=-1) / ref.norm(dim=-1)).tolist()
    return {"prefill_rel_err": rel[0], "decode_rel_err_max": max(rel[1:]),
            "argmax_agree": int((a.argmax(-1) == ref.argmax(-1)).sum()), "positions": len(rel)}


def check_correctness(ours, hf, runner, vocab: int, steps: int = 8) -> dict:
    """Our prefill + decode logits vs transformers on the same weights, HF's greedy tokens forced on both."""
    ids = torch.randint(0, vocab, (1, 64), device=DEVICE)
    ref = hf_logits(hf, ids, [])
    forced = []
    for _ in range(steps):
        forced.append(int(ref[-1].argmax()))
        ref = hf_logits(hf, ids, forced)
    return compare(ours_logits(runner, ids, forced), ref)


def check_fp32_few_layers(name: str) -> dict:
    """The real shape cut to 4 layers, in fp32 on the GPU: every kernel path (Triton decode attention, fused
    recurrent delta rule, conv update, chunked prefill, compiled pointwise, CUDA graph) against transformers.
    Then the bf16 rounding error of ours and of transformers, both against that fp32 truth."""
    config_cls, kw = SHAPES[name]
    hf_cfg = config_cls(**{**kw, "num_hidden_layers": 4})
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ours = random_model(hf_cfg, torch.float32)
    hf = hf_view(ours, hf_cfg)
    result = {"fp32": check_correctness(ours, hf, ModelRunner(ours), hf_cfg.vocab_size)}
    ids = torch.randint(0, hf_cfg.vocab_size, (1, 64), device=DEVICE)
    forced = torch.randint(0, hf_cfg.vocab_size, (8,)).tolist()
    truth = hf_logits(hf, ids, forced)
    ours16 = build_empty(ours.config, torch.device(DEVICE), torch.bfloat16)
    with torch.no_grad():
        for p16, p32 in zip(ours16.parameters(), ours.parameters()):
            p16.copy_(p32)
    hf16 = hf_view(ours16, hf_cfg)
    result["bf16_ours_vs_fp32"] = compare(ours_logits(ModelRunner(ours16), ids, forced), truth)
    result["bf16_hf_vs_fp32"] = compare(hf_logits(hf16, ids, forced), truth)
    del hf, ours, hf16, ours16
    torch.cuda.empty_cache()
    return result


def profile_step(runner, vocab: int, steps: int = 5) -> dict:
    """Kernel time per decode step by kernel name (eager replay of the same step, compiled pointwise)."""
    from torch.profiler import ProfilerActivity, profile

    runner.allocate(1, 600)
    logits = runner.prefill(0, torch.randint(0, vocab, (512,)).tolist())
    tokens, positions = logits.argmax()[None], torch.tensor([512], device=DEVICE)
    use_graphs, runner.use_graphs = runner.use_graphs, False
    for _ in range(3):
        tokens = runner.decode(tokens, positions).argmax(-1)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            tokens = runner.decode(tokens, positions).argmax(-1)
        torch.cuda.synchronize()
    runner.use_graphs = use_graphs
    rows = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.self_device_time_total > 0:
            rows[e.key] = (e.self_device_time_total / steps, e.count / steps)
    top = sorted(rows.items(), key=lambda kv: -kv[1][0])
    return {"kernel_us_per_step": sum(v[0] for v in rows.values()), "kernels_per_step": sum(v[1] for v in rows.values()),
            "top": [(k[:90], round(t, 1), c) for k, (t, c) in top[:25]]}


def bench_shape(name: str, args, bandwidth: float) -> dict:
    config_cls, kw = SHAPES[name]
    result_fp32 = check_fp32_few_layers(name)
    print(name, "fp32 4-layer correctness", result_fp32, flush=True)
    hf_cfg = config_cls(**kw)
    ours = random_model(hf_cfg)
    hf = hf_view(ours, hf_cfg)
    runner = ModelRunner(ours)
    variants = {"ours": runner, "ours_cublas": ModelRunner(ours, EngineConfig(decode_gemv=False))}
    variants["ours_unfused"] = ModelRunner(ours, EngineConfig(fused_qk_rope_store=False))
    if args.w12n:
        variants["ours_w12n"] = ModelRunner(ours, EngineConfig(weight_format="w12n"))
    cfg = ours.config
    weight_bytes = ours.weight_bytes_per_token()
    kv_per_token = 2 * cfg.num_attention_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    state_bytes = 0
    if cfg.is_hybrid:
        conv = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim
        ssm = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
        state_bytes = cfg.num_linear_layers * 2 * (ssm + conv * (cfg.linear_conv_kernel_dim - 1) * 2)  # read + write
    result = {"shape": name, "params": sum(p.numel() for p in ours.parameters()), "weight_bytes_per_step": weight_bytes,
              "kv_bytes_per_token": kv_per_token, "state_bytes_per_step_per_seq": state_bytes}
    result["correctness_fp32_4_layers"] = result_fp32
    result["correctness_bf16"] = check_correctness(ours, hf, runner, cfg.vocab_size)
    print(name, "bf16 correctness", result["correctness_bf16"], flush=True)
    if args.profile:
        result["profile_b1_ctx512"] = profile_step(runner, cfg.vocab_size)
        print(name, json.dumps(result["profile_b1_ctx512"], indent=0), flush=True)
    runs = []
    for batch, ctx in args.configs:
        r = time_ours(runner, batch, ctx, args.steps, cfg.vocab_size)
        # the same step with cuBLAS for every projection, side by side (caches freed between the two)
        alt = variants["ours_cublas"]
        r["cublas_variant"] = time_ours(alt, batch, ctx, args.steps, cfg.vocab_size)
        alt.cache, alt.graphs = None, {}
        torch.cuda.empty_cache()
        r["gemv_speedup_vs_cublas"] = r["cublas_variant"]["step_ms_median"] / r["step_ms_median"]
        # the same step with q/k norm + RoPE + K/V store unfused (EngineConfig.fused_qk_rope_store), side by side
        alt = variants["ours_unfused"]
        r["unfused_variant"] = time_ours(alt, batch, ctx, args.steps, cfg.vocab_size)
        alt.cache, alt.graphs = None, {}
        torch.cuda.empty_cache()
        r["fusion_speedup"] = r["unfused_variant"]["step_ms_median"] / r["step_ms_median"]
        if "ours_w12n" in variants and batch <= 16:
            w = variants["ours_w12n"]
            r["w12n_variant"] = time_ours(w, batch, ctx, args.steps, cfg.vocab_size)
            w.cache, w.graphs = None, {}
            torch.cuda.empty_cache()
            r["w12n_speedup_vs_bf16"] = r["step_ms_median"] / r["w12n_variant"]["step_ms_median"]
        moved = weight_bytes + batch * (ctx * kv_per_token + state_bytes)
        r["roofline_ms_weights"] = weight_bytes / bandwidth * 1e3
        r["roofline_ms_all_bytes"] = moved / bandwidth * 1e3
        r["fraction_of_roofline_weights"] = r["roofline_ms_weights"] / r["step_ms_median"]
        r["fraction_of_roofline_all_bytes"] = r["roofline_ms_all_bytes"] / r["step_ms_median"]
        if batch == 1 and not args.skip_hf:
            r["hf"] = time_hf(hf, ctx, args.hf_tokens, cfg.vocab_size)
            r["speedup_vs_hf"] = r["hf"]["step_ms"] / r["step_ms_median"]
        print(name, json.dumps(r), flush=True)
        runs.append(r)
    result["runs"] = runs
    del hf, runner, ours
    torch.cuda.empty_cache()
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=["Qwen3-8B", "Qwen3.5-27B"])
    p.add_argument("--configs", nargs="+", default=["1x512", "1x4096", "8x512", "32x512"],
                   help="BATCHxCONTEXT entries")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--hf-tokens", type=int, default=24)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--profile", action="store_true", help="also list kernel time per decode step")
    p.add_argument("--w12n", action="store_true", help="also time the step with W12N weights (batch <= 16)")
    p.add_argument("--commit", default=None, help="commit hash to record (default: git rev-parse HEAD)")
    args = p.parse_args()
    args.configs = [tuple(map(int, c.split("x"))) for c in args.configs]
    torch.manual_seed(0)
    bandwidth = copy_bandwidth()
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
           "commit": commit or "unknown", "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
           "copy_bandwidth_bytes_per_s": bandwidth, "shapes": []}
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    for name in args.shapes:
        out["shapes"].append(bench_shape(name, args, bandwidth))
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    print(f"\n{'shape':12} {'B':>3} {'ctx':>5} {'ms/step':>8} {'tok/s':>8} {'%roof(w)':>8} {'%roof(all)':>10} "
          f"{'cuBLAS ms':>9} {'HF tok/s':>8}")
    for s in out["shapes"]:
        for r in s["runs"]:
            hf = r.get("hf", {}).get("tok_per_s", float("nan"))
            print(f"{s['shape']:12} {r['batch']:>3} {r['ctx']:>5} {r['step_ms_median']:8.2f} {r['tok_per_s']:8.1f} "
                  f"{100 * r['fraction_of_roofline_weights']:7.1f}% {100 * r['fraction_of_roofline_all_bytes']:9.1f}% "
                  f"{r['cublas_variant']['step_ms_median']:9.2f} {hf:8.1f}")


if __name__ == "__main__":
    main()
