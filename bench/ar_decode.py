"""Batch-1 (and batch 8/32) autoregressive decode on random-weight bf16 models in real shapes, on one GPU.

Side by side in one process: specpilot's decode step (CUDA graph) and transformers' `generate` on the SAME
weights (HF parameters are views of ours), against the roofline = bytes a decode step must read / measured
device copy bandwidth. Correctness first: our prefill logits and decode logits are compared with HF's.

    python3 -m bench ar_decode --out bench/results/ar_decode_h200.json
    python3 -m bench ar_decode --out /tmp/ar.json --device cpu --shapes tiny-dense tiny-hybrid \
        --configs 1x16 2x16 --steps 3 --hf-tokens 3 --w12n --profile   # dry run

Prints a table last and writes the full JSON (GPU, commit, command, every timing), again after every
measurement; each measurement runs inside its own try/except (an error is recorded and the rest goes on).
With --w12n, the W12N step's logits are first compared with the bf16 step's (same weights, bit-exact decode).
With --w12n-only, after every bf16 run the same model drops its bf16 copies (EngineConfig.weight_format
"w12n_only"), is checked against the bf16 logits and timed: what lets a whole Qwen3.5-27B run W12N on one GPU.
--variant NAME:FIELD=VALUE,... times the step with EngineConfig fields changed, beside the main one, after a
greedy check against it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass

import torch
import transformers

from bench.common import Report, attempt, copy_bandwidth, failed, make_runner, run_record, sync
from specpilot.bench import shapes
from specpilot.config import EngineConfig
from specpilot.layers.packed import PackedLinear
from specpilot.models.loader import build_empty

SHAPES = shapes.SHAPES


@dataclass(frozen=True)
class Setup:
    """What every measurement of a run shares: the device, the kind of random weights, and the EngineConfig under
    every runner (--base, --no-fused-prologue; each variant changes fields of it)."""

    device: str = "cuda"
    clean_weights: bool = False  # --clean-weights
    base: EngineConfig = EngineConfig()

    def model(self, hf_cfg, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
        return shapes.random_model(hf_cfg, self.device, dtype, clean_weights=self.clean_weights)

    def engine(self, **fields) -> EngineConfig:
        return self.base.replace(**fields)


class _Stamp:
    """A point on the device timeline: a CUDA event on the GPU, the wall clock on the CPU."""

    def __init__(self, device: torch.device):
        self.event = torch.cuda.Event(True) if device.type == "cuda" else None
        if self.event is not None:
            self.event.record()
        else:
            self.t = time.perf_counter()

    def ms_since(self, start: _Stamp) -> float:
        if self.event is not None:
            return start.event.elapsed_time(self.event)
        return (self.t - start.t) * 1e3


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
    device = next(ours.parameters()).device
    hf.model.rotary_emb = type(hf.model.rotary_emb)(hf.config).to(device)
    for name, buf in hf.named_buffers():
        assert buf.device == device, f"buffer {name} left on {buf.device}"
    return hf.eval()


def time_ours(runner, batch: int, ctx: int, steps: int, vocab: int) -> dict:
    device = runner.device
    runner.allocate(batch, ctx + 2 * steps + 8)
    prompts = torch.randint(0, vocab, (batch, ctx), device=device)
    t0 = time.perf_counter()
    logits = torch.stack([runner.prefill(i, prompts[i].tolist()) for i in range(batch)])
    sync(device)
    prefill_s = time.perf_counter() - t0
    tokens = logits.argmax(-1)
    positions = torch.full((batch,), ctx, dtype=torch.long, device=device)
    for _ in range(3):  # capture + warm-up (writes beyond the timed region are overwritten)
        tokens = runner.decode(tokens, positions).argmax(-1)
    per_step = []
    for _ in range(steps):
        start = _Stamp(device)
        tokens = runner.decode(tokens, positions).argmax(-1)
        per_step.append((start, _Stamp(device)))
    sync(device)
    ms = [e.ms_since(s) for s, e in per_step]
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens = runner.decode(tokens, positions).argmax(-1)
    sync(device)
    loop_s = (time.perf_counter() - t0) / steps
    return {"batch": batch, "ctx": ctx, "prefill_s": prefill_s, "step_ms_median": statistics.median(ms),
            "step_ms_p10": sorted(ms)[len(ms) // 10], "loop_step_ms": loop_s * 1e3,
            "tok_per_s": batch / (statistics.median(ms) / 1e3)}


def time_hf(hf, ctx: int, new_tokens: int, vocab: int) -> dict:
    ids = torch.randint(0, vocab, (1, ctx), device=hf.device)
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)

    def run(n):
        sync(hf.device)
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        sync(hf.device)
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
    positions = torch.tensor([ids.shape[1]], device=runner.device)
    for tok in forced:
        rows.append(runner.decode(torch.tensor([tok], device=runner.device), positions)[0].clone())
    return torch.stack(rows)


@torch.inference_mode()
def hf_logits(hf, ids: torch.Tensor, forced: list[int]) -> torch.Tensor:
    out = hf(ids, use_cache=True)
    rows, cache = [out.logits[0, -1].float()], out.past_key_values
    for tok in forced:
        out = hf(torch.tensor([[tok]], device=hf.device), past_key_values=cache, use_cache=True)
        rows.append(out.logits[0, -1].float())
        cache = out.past_key_values
    return torch.stack(rows)


def compare(a: torch.Tensor, ref: torch.Tensor) -> dict:
    rel = ((a - ref).norm(dim=-1) / ref.norm(dim=-1)).tolist()
    return {"prefill_rel_err": rel[0], "decode_rel_err_max": max(rel[1:]),
            "argmax_agree": int((a.argmax(-1) == ref.argmax(-1)).sum()), "positions": len(rel)}


def check_correctness(ours, hf, runner, vocab: int, steps: int = 8) -> dict:
    """Our prefill + decode logits vs transformers on the same weights, HF's greedy tokens forced on both."""
    ids = torch.randint(0, vocab, (1, 64), device=runner.device)
    ref = hf_logits(hf, ids, [])
    forced = []
    for _ in range(steps):
        forced.append(int(ref[-1].argmax()))
        ref = hf_logits(hf, ids, forced)
    return compare(ours_logits(runner, ids, forced), ref)


def check_fp32_few_layers(name: str, setup: Setup) -> dict:
    """The real shape cut to 4 layers, in fp32 on the GPU: every kernel path (Triton decode attention, fused
    recurrent delta rule, conv update, chunked prefill, compiled pointwise, CUDA graph) against transformers.
    Then the bf16 rounding error of ours and of transformers, both against that fp32 truth."""
    config_cls, kw = SHAPES[name]
    hf_cfg = config_cls(**{**kw, "num_hidden_layers": 4})
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ours = setup.model(hf_cfg, torch.float32)
    hf = hf_view(ours, hf_cfg)
    result = {"fp32": check_correctness(ours, hf, make_runner(ours, setup.base), hf_cfg.vocab_size)}
    ids = torch.randint(0, hf_cfg.vocab_size, (1, 64), device=setup.device)
    forced = torch.randint(0, hf_cfg.vocab_size, (8,)).tolist()
    truth = hf_logits(hf, ids, forced)
    ours16 = build_empty(ours.config, torch.device(setup.device), torch.bfloat16)
    with torch.no_grad():
        for p16, p32 in zip(ours16.parameters(), ours.parameters()):
            p16.copy_(p32)
    hf16 = hf_view(ours16, hf_cfg)
    result["bf16_ours_vs_fp32"] = compare(ours_logits(make_runner(ours16, setup.base), ids, forced), truth)
    result["bf16_hf_vs_fp32"] = compare(hf_logits(hf16, ids, forced), truth)
    del hf, ours, hf16, ours16
    _empty_cache()
    return result


def _empty_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def profile_step(model, engine: EngineConfig, vocab: int, steps: int = 5) -> dict:
    """Kernel time per decode step by kernel name (the step of `engine` run eagerly, compiled pointwise)."""
    from torch.profiler import ProfilerActivity, profile

    runner = make_runner(model, engine.replace(cuda_graphs=False))
    device = runner.device
    runner.allocate(1, 600)
    logits = runner.prefill(0, torch.randint(0, vocab, (512,)).tolist())
    tokens, positions = logits.argmax()[None], torch.tensor([512], device=device)
    for _ in range(3):
        tokens = runner.decode(tokens, positions).argmax(-1)
    sync(device)
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            tokens = runner.decode(tokens, positions).argmax(-1)
        sync(device)
    _release(runner)
    rows = {}
    for e in prof.key_averages():
        t = e.self_device_time_total if cuda else e.self_cpu_time_total
        if (e.device_type.name == "CUDA" or not cuda) and t > 0:
            rows[e.key] = (t / steps, e.count / steps)
    top = sorted(rows.items(), key=lambda kv: -kv[1][0])
    return {"kernel_us_per_step": sum(v[0] for v in rows.values()), "kernels_per_step": sum(v[1] for v in rows.values()),
            "top": [(k[:90], round(t, 1), c) for k, (t, c) in top[:25]]}


def check_w12n(runner, w12n_runner, vocab: int, steps: int = 8) -> dict:
    """The W12N step against the bf16 step on the same (bit-exact) weights: logits of a prefill and of decode
    steps with the same forced tokens. They differ only by accumulation order in the projections."""
    ids = torch.randint(0, vocab, (1, 64), device=runner.device)
    forced = torch.randint(0, vocab, (steps,)).tolist()
    return compare(ours_logits(w12n_runner, ids, forced), ours_logits(runner, ids, forced))


def w12n_only_runs(name: str, setup: Setup, ours, runner, runs: list, args, vocab: int) -> dict:
    """--w12n-only, after every bf16 run: the bf16 reference logits, then the same model with its bf16 copies
    dropped (weight_format w12n_only: a 27B fits), checked against them and timed at each config of <= 16 rows."""
    ids = torch.randint(0, vocab, (1, 64), device=setup.device)
    forced = torch.randint(0, vocab, (8,)).tolist()
    ref = ours_logits(runner, ids, forced)
    _release(runner)
    t0 = time.perf_counter()
    only = make_runner(ours, setup.engine(weight_format="w12n_only"))
    out = {"w12n_only_encode_s": time.perf_counter() - t0,
           "w12n_only_vs_bf16": compare(ours_logits(only, ids, forced), ref)}
    if setup.device == "cuda":
        out["w12n_only_gpu_bytes"] = torch.cuda.memory_allocated()
    print(name, "W12N only vs bf16", out["w12n_only_vs_bf16"], flush=True)
    for r in runs:
        if r["batch"] <= 16:
            r["w12n_only_variant"] = attempt(f"{name} {r['batch']}x{r['ctx']} W12N only", time_ours, only,
                                             r["batch"], r["ctx"], args.steps, vocab)
            _release(only)
            if "step_ms_median" in r and "step_ms_median" in r["w12n_only_variant"]:
                r["w12n_only_speedup_vs_bf16"] = r["step_ms_median"] / r["w12n_only_variant"]["step_ms_median"]
    return out


def _release(runner) -> None:
    runner.cache, runner.graphs = None, {}
    _empty_cache()


def w12n_ab(model, setup: Setup, batch: int, ctx: int, steps: int, vocab: int) -> dict:
    """--w12n-ab: the W12N step (planes already attached) without the SwiGLU epilogue (product, then silu_mul,
    EngineConfig.ablations.w12n_swiglu off), timed as the main W12N step is; then the default again (drift)."""
    out = {}
    for name, fields in (("no_swiglu", {"w12n_swiglu": False}), ("default_again", {})):
        runner = make_runner(model, setup.engine(weight_format="w12n", **fields))
        try:
            out[name] = time_ours(runner, batch, ctx, steps, vocab)
        finally:
            _release(runner)
    return out


def time_variant(model, setup: Setup, fields: dict, batch: int, ctx: int, steps: int, vocab: int) -> dict:
    """The main runner's step with some EngineConfig fields changed: first its greedy continuation against the
    main runner's (same prompt, batch 1), then timed the same way; freed after."""
    want, want_logits = main_greedy(model, setup.base, ctx, vocab)
    runner = make_runner(model, setup.engine(**fields))
    try:
        got, got_logits = greedy_run(runner, _check_prompt(ctx, vocab), 16)
        check = {"greedy_tokens_equal": sum(a == b for a, b in zip(want, got)), "of": len(want),
                 "first_step_logits_rel_diff": ((got_logits - want_logits).norm() / want_logits.norm()).item()}
        return {"check_vs_main": check, **time_ours(runner, batch, ctx, steps, vocab)}
    finally:
        _release(runner)


_MAIN_GREEDY: dict[tuple[int, int], tuple[list[int], torch.Tensor]] = {}


def main_greedy(model, engine: EngineConfig, ctx: int, vocab: int) -> tuple[list[int], torch.Tensor]:
    """The main runner's greedy continuation of the check prompt, computed once per model and context."""
    key = (id(model), ctx)
    if key not in _MAIN_GREEDY:
        main = make_runner(model, engine)
        _MAIN_GREEDY[key] = greedy_run(main, _check_prompt(ctx, vocab), 16)
        _release(main)
    return _MAIN_GREEDY[key]


def _check_prompt(ctx: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (ctx,), generator=torch.Generator().manual_seed(1)).tolist()


def greedy_run(runner, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of `steps` decode steps after the prompt (slot 0), and the first step's logits."""
    runner.allocate(1, len(prompt) + steps + 8)
    token = runner.prefill(0, prompt).argmax(-1).view(1)
    positions = torch.full((1,), len(prompt), dtype=torch.long, device=runner.device)
    out, first = [], None
    for _ in range(steps):
        logits = runner.decode(token, positions)
        first = logits[0].float().clone() if first is None else first
        token = logits.argmax(-1)
        out.append(int(token))
    return out, first


def parse_fields(text: str) -> dict:
    """'decode_pdl=true,block_attention=tree' -> EngineConfig fields (true/false and integers converted)."""
    out = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        low = value.lower()
        out[key] = low == "true" if low in ("true", "false") else int(value) if value.isdigit() else value
    return out


def bench_shape(name: str, setup: Setup, args, bandwidth: float, report: Report) -> dict:
    config_cls, kw = SHAPES[name]
    result = {"shape": name}
    if args.layers:
        kw = {**kw, "num_hidden_layers": args.layers}
        result["layers"] = args.layers
    report["shapes"].append(result)
    if not args.skip_checks:
        result["correctness_fp32_4_layers"] = attempt(f"{name} fp32 check", check_fp32_few_layers, name, setup)
        print(name, "fp32 4-layer correctness", result["correctness_fp32_4_layers"], flush=True)
        report.save()
    hf_cfg = config_cls(**kw)
    ours = setup.model(hf_cfg)
    hf = (attempt(f"{name} transformers view", hf_view, ours, hf_cfg) if not args.skip_checks
          else {"error": "skipped (--skip-checks)"})
    runner = make_runner(ours, setup.base)
    alt = make_runner(ours, setup.engine(decode_gemv=False))  # cuBLAS for every projection
    # q/k norm-RoPE and K/V store unfused (the main runner already is with --no-fused-prologue)
    unfused = make_runner(ours, setup.engine(fused_qk_rope_store=False)) if setup.base.ablations.fused_qk_rope_store else None
    cfg = ours.config
    weight_bytes = ours.weight_bytes_per_token()
    kv_per_token = 2 * cfg.num_attention_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    state_bytes = 0
    if cfg.is_hybrid:
        conv = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim
        ssm = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
        state_bytes = cfg.num_linear_layers * 2 * (ssm + conv * (cfg.linear_conv_kernel_dim - 1) * 2)  # read + write
    result.update({"params": sum(p.numel() for p in ours.parameters()), "weight_bytes_per_step": weight_bytes,
                   "kv_bytes_per_token": kv_per_token, "state_bytes_per_step_per_seq": state_bytes})
    if not failed(hf):
        result["correctness_bf16"] = attempt(f"{name} bf16 check", check_correctness, ours, hf, runner,
                                             cfg.vocab_size)
    else:
        result["correctness_bf16"] = hf
    print(name, "bf16 correctness", result["correctness_bf16"], flush=True)
    report.save()
    w12n = None
    if args.w12n:
        t0 = time.perf_counter()
        w = attempt(f"{name} W12N encode", make_runner, ours, setup.engine(weight_format="w12n"))
        result["w12n_encode_s"] = time.perf_counter() - t0
        if failed(w):
            result["correctness_w12n_vs_bf16"] = w
            for m in ours.modules():  # planes attached before the failure (e.g. out of memory)
                if getattr(m, "w12n", None) is not None:
                    m.w12n = None
            _empty_cache()
        else:
            w12n = w
            result["correctness_w12n_vs_bf16"] = attempt(f"{name} W12N check", check_w12n, runner, w12n,
                                                         cfg.vocab_size)
            _release(w12n)
            _release(runner)
        print(name, "W12N vs bf16", result["correctness_w12n_vs_bf16"], flush=True)
        report.save()
    if args.profile:
        result["profile_b1_ctx512"] = attempt(f"{name} profile", profile_step, ours, setup.base, cfg.vocab_size)
        print(name, json.dumps(result["profile_b1_ctx512"], indent=0)[:3000], flush=True)
        if w12n is not None:  # the same step with W12N projections: where its time goes besides the GEMVs
            result["profile_w12n_b1_ctx512"] = attempt(f"{name} W12N profile", profile_step, ours,
                                                       setup.engine(weight_format="w12n"), cfg.vocab_size)
            print(name, "W12N", json.dumps(result["profile_w12n_b1_ctx512"], indent=0)[:3000], flush=True)
        report.save()
    runs = result["runs"] = []
    for batch, ctx in args.configs:
        r = {"batch": batch, "ctx": ctx}
        runs.append(r)
        main = attempt(f"{name} {batch}x{ctx} ours", time_ours, runner, batch, ctx, args.steps, cfg.vocab_size)
        r.update(main)
        report.save()
        # the same step with cuBLAS for every projection, side by side (caches freed between the two)
        r["cublas_variant"] = attempt(f"{name} {batch}x{ctx} cuBLAS", time_ours, alt, batch, ctx, args.steps,
                                      cfg.vocab_size)
        _release(alt)
        ok = "step_ms_median" in r
        if ok and "step_ms_median" in r["cublas_variant"]:
            r["gemv_speedup_vs_cublas"] = r["cublas_variant"]["step_ms_median"] / r["step_ms_median"]
        # the step without the fused decode prologue (EngineConfig.ablations.fused_qk_rope_store), side by side
        if unfused is not None:
            r["unfused_variant"] = attempt(f"{name} {batch}x{ctx} unfused", time_ours, unfused, batch, ctx,
                                           args.steps, cfg.vocab_size)
            _release(unfused)
            if ok and "step_ms_median" in r["unfused_variant"]:
                r["fusion_speedup"] = r["unfused_variant"]["step_ms_median"] / r["step_ms_median"]
        for vname, fields in args.variant:
            vr = attempt(f"{name} {batch}x{ctx} {vname}", time_variant, ours, setup, fields, batch, ctx, args.steps,
                         cfg.vocab_size)
            r.setdefault("variants", {})[vname] = {"engine": fields, **(vr if isinstance(vr, dict) else {})}
            if ok and "step_ms_median" in vr:
                r["variants"][vname]["speedup_vs_main"] = r["step_ms_median"] / vr["step_ms_median"]
        if w12n is not None and batch <= 16:
            r["w12n_variant"] = attempt(f"{name} {batch}x{ctx} W12N", time_ours, w12n, batch, ctx, args.steps,
                                        cfg.vocab_size)
            _release(w12n)
            if ok and "step_ms_median" in r["w12n_variant"]:
                r["w12n_speedup_vs_bf16"] = r["step_ms_median"] / r["w12n_variant"]["step_ms_median"]
            if args.w12n_ab:
                r["w12n_ab"] = attempt(f"{name} {batch}x{ctx} W12N A/B", w12n_ab, ours, setup, batch, ctx, args.steps,
                                       cfg.vocab_size)
        moved = weight_bytes + batch * (ctx * kv_per_token + state_bytes)
        r["roofline_ms_weights"] = weight_bytes / bandwidth * 1e3
        r["roofline_ms_all_bytes"] = moved / bandwidth * 1e3
        if ok:
            r["fraction_of_roofline_weights"] = r["roofline_ms_weights"] / r["step_ms_median"]
            r["fraction_of_roofline_all_bytes"] = r["roofline_ms_all_bytes"] / r["step_ms_median"]
        report.save()
        if batch == 1 and not args.skip_hf and not failed(hf):
            r["hf"] = attempt(f"{name} {batch}x{ctx} HF generate", time_hf, hf, ctx, args.hf_tokens,
                              cfg.vocab_size)
            if ok and "step_ms" in r["hf"]:
                r["speedup_vs_hf"] = r["hf"]["step_ms"] / r["step_ms_median"]
        print(name, json.dumps(r)[:1500], flush=True)
        report.save()
    if args.w12n_only:  # last: it drops the bf16 weights every runner above reads
        del hf, alt, unfused
        _empty_cache()
        hf = alt = unfused = None
        result["w12n_only"] = attempt(f"{name} W12N only", w12n_only_runs, name, setup, ours, runner, runs, args,
                                      cfg.vocab_size)
        report.save()
    _MAIN_GREEDY.clear()  # keyed by id(model): a later model may reuse the id
    del hf, runner, alt, unfused, w12n, ours
    _empty_cache()
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench ar_decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=["Qwen3-8B", "Qwen3.5-27B"])
    p.add_argument("--configs", nargs="+", default=["1x512", "1x4096", "8x512", "32x512"],
                   help="BATCHxCONTEXT entries")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--hf-tokens", type=int, default=24)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--skip-checks", action="store_true",
                   help="skip the checks against transformers (fp32 4-layer and bf16; the W12N check stays) and HF")
    p.add_argument("--clean-weights", action="store_true",
                   help="random weights without W12N escapes or verbatim segments (shapes.random_model)")
    p.add_argument("--layers", type=int, default=None,
                   help="override the shapes' layer count (a 27B at 32 layers fits its W12N planes beside bf16)")
    p.add_argument("--profile", action="store_true", help="also list kernel time per decode step")
    p.add_argument("--w12n", action="store_true", help="also time the step with W12N weights (batch <= 16)")
    p.add_argument("--w12n-only", action="store_true",
                   help="last, time the step with the bf16 copies dropped (weight_format w12n_only; batch <= 16): "
                        "the model holds W12N planes alone, so a whole Qwen3.5-27B fits one GPU")
    p.add_argument("--w12n-ab", action="store_true",
                   help="with --w12n: also time the W12N step without the SwiGLU epilogue")
    p.add_argument("--no-fused-prologue", action="store_true",
                   help="every runner with EngineConfig(fused_qk_rope_store=False) (if the fused kernel fails)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:FIELD=VALUE[,...]",
                   help="also time the step with these EngineConfig fields changed, side by side (repeatable)")
    p.add_argument("--base", default="", metavar="FIELD=VALUE[,...]", help="EngineConfig fields of every runner")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of the script")
    p.add_argument("--commit", default=None, help="commit hash to record (default: git rev-parse HEAD)")
    args = p.parse_args(argv)
    base = {"fused_qk_rope_store": False} if args.no_fused_prologue else {}
    base.update(parse_fields(args.base))
    args.variant = [(v.partition(":")[0], parse_fields(v.partition(":")[2])) for v in args.variant]
    args.configs = [tuple(map(int, c.split("x"))) for c in args.configs]
    try:  # a misspelt field fails here, not after the first shape's checks
        setup = Setup(args.device, args.clean_weights, EngineConfig().replace(**base))
        for _, fields in args.variant:
            setup.engine(**fields)
    except (TypeError, ValueError) as e:
        p.error(f"--base / --variant: {e}")
    torch.manual_seed(0)
    report = Report(args.out, {**run_record(setup.device, args.commit), "engine_base": base, "shapes": []})
    bandwidth = attempt("copy bandwidth", copy_bandwidth, setup.device)
    if failed(bandwidth):
        report["copy_bandwidth_error"] = bandwidth
        bandwidth = 4.2e12  # the H200's usual figure, so that the rooflines still print
    report["copy_bandwidth_bytes_per_s"] = bandwidth
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    for name in args.shapes:
        r = attempt(f"shape {name}", bench_shape, name, setup, args, bandwidth, report)
        if failed(r):
            report["shapes"][-1]["error"] = r["error"]
        report.save()

    def f(d, key, fmt):
        v = d.get(key) if isinstance(d, dict) else None
        return format(v, fmt) if isinstance(v, (int, float)) else format("-", fmt.split(".")[0].rstrip("f") + "s")

    print(f"\n{'shape':12} {'B':>3} {'ctx':>5} {'ms/step':>8} {'tok/s':>8} {'%roof(w)':>8} {'%roof(all)':>10} "
          f"{'cuBLAS ms':>9} {'W12N ms':>8} {'HF tok/s':>8}")
    for s in report["shapes"]:
        for r in s.get("runs", []):
            roof_w = 100 * r["fraction_of_roofline_weights"] if "fraction_of_roofline_weights" in r else None
            roof_a = 100 * r["fraction_of_roofline_all_bytes"] if "fraction_of_roofline_all_bytes" in r else None
            print(f"{s['shape']:12} {r['batch']:>3} {r['ctx']:>5} {f(r, 'step_ms_median', '8.2f')} "
                  f"{f(r, 'tok_per_s', '8.1f')} {f({'x': roof_w}, 'x', '7.1f')}% {f({'x': roof_a}, 'x', '9.1f')}% "
                  f"{f(r.get('cublas_variant'), 'step_ms_median', '9.2f')} "
                  f"{f(r.get('w12n_variant') or r.get('w12n_only_variant'), 'step_ms_median', '8.2f')} "
                  f"{f(r.get('hf'), 'tok_per_s', '8.1f')}")

