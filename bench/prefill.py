"""Prefill and long prompts on one GPU, side by side in one run (issue 30):

(a) one Gated DeltaNet layer of the Qwen3.5-27B shape (16 key heads, 48 value heads, dims 128, bf16 inputs, fp32
    state), one sequence after a random state: the torch chunk form, our Triton kernel and fla-core's kernel at
    512 / 2,048 / 8,192 / 32,768 tokens, each output and final state compared with the torch form's (max abs
    diff); then decode: our fused recurrent kernel against fla's behind the same pooled-state contract.
(b) whole-model prefill of random:Qwen3.5-27B and random:Qwen3-8B (random weights, real shapes) through
    ModelRunner.prefill / prefill_many at 512 / 2k / 8k / 32k prompt tokens, batch 1 and 8, as achieved TFLOP/s
    against the bf16 tensor-core peak measured in the same run (a large torch.matmul). FLOPs counted: 2 x the
    decoder layers' matrix parameters x prompt tokens, the LM head at the last token of each prompt (all the
    runner computes), causal attention (4 x heads x head dim per (query, key) pair at or before the query), the
    short conv, and the chunked delta rule's matmuls (an estimate, 64-token chunks).
    Then the 27B at 8k tokens with each GDN prefill form (fla, our kernel, torch) in the whole model.
(c) the same prefills chunk by chunk (the runner's prefill_chunk tokens per forward): each chunk's time against
    its position, beside the growth the counted FLOPs predict (attention grows with the prefix; the rest is flat).
(d) time to first token of a fresh process (8B shape, a 10-token prompt, 8 new tokens): its first generate
    against its second, in two processes one after the other (the second finds the first's on-disk caches).

    python3 -m bench prefill --out bench/results/prefill_h200.json             # ~6 min on an H200
    python3 -m bench prefill --out /tmp/prefill.json --quick                    # 2k and 8k only, no TTFT
    python3 -m bench prefill --out /tmp/prefill.json --smoke                    # CPU, tiny shapes, seconds

Each configuration that would overrun --budget-s (estimated from the rate measured so far) or not fit the free
device memory is recorded as skipped with its reason. Prints the elapsed time per section and a table last;
writes the JSON (GPU, commit, command) again after every measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.common import Report, attempt, failed, graph_ms, median, rel_err, run_record, sync, time_ms
from specpilot.bench import shapes
from specpilot.config import EngineConfig, ModelConfig
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.settings import Runtime

GDN_27B = dict(H=16, HV=48, K=128, V=128)  # Qwen3.5-27B's linear-attention heads
GDN_TINY = dict(H=2, HV=4, K=16, V=16)
GDN_CHUNK = 64  # the chunk the delta rule's FLOP estimate assumes (fla's and ours)
TTFT_PREFIX = "TTFT_JSON "  # the child's result line


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a run measures: (a) the GDN layer lengths and decode batches, (b)/(c) the shapes, prompt lengths and
    batches, and whether (d) runs."""

    device: str
    gdn: dict
    gdn_tokens: tuple[int, ...]
    decode_batches: tuple[int, ...]
    models: tuple[str, ...]
    tokens: tuple[int, ...]
    batches: tuple[int, ...]
    ab_tokens: int
    ttft_shape: str | None
    matmul_n: int

    @classmethod
    def of(cls, args) -> Plan:
        if args.smoke:
            return cls("cpu", GDN_TINY, (40, 100), (1, 2), ("tiny-hybrid", "tiny-dense"), (100, 40), (1, 2), 100,
                       None if args.skip_ttft else "tiny-dense", 256)
        tokens = (8192, 2048) if args.quick else (8192, 2048, 512, 32768)  # the issue's target length first
        return cls(args.device, GDN_27B, tuple(sorted(tokens)), (1, 8, 32), ("Qwen3.5-27B", "Qwen3-8B"), tokens,
                   (1, 8), 8192, None if (args.quick or args.skip_ttft) else "Qwen3-8B", 8192)


class Clock:
    """The run's time budget: elapsed seconds, and whether a piece of estimated length still fits."""

    def __init__(self, budget_s: float):
        self.t0, self.budget_s = time.perf_counter(), budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def fits(self, seconds: float) -> bool:
        return self.elapsed() + seconds <= self.budget_s


def section(name: str, clock: Clock, fn, *args):
    t0 = time.perf_counter()
    print(f"== {name} (at {clock.elapsed():.0f} s)", flush=True)
    out = attempt(name, fn, *args)
    print(f"== {name}: {time.perf_counter() - t0:.1f} s (elapsed {clock.elapsed():.0f} s of {clock.budget_s:.0f})",
          flush=True)
    return out


# ---------------------------------------------------------------- (a) one GDN layer, prefill and decode


def gdn_inputs(gdn: dict, B: int, T: int, device, seed: int = 0):
    """bf16 q, k, v and fp32 g, beta, initial state as a layer would hand them (decay rates as random_model's)."""
    from specpilot.ops.gated_delta_rule import gdn_gating

    H, HV, K, V = gdn["H"], gdn["HV"], gdn["K"], gdn["V"]
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, device=device, generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(B, T, HV, V, device=device, generator=gen).bfloat16()
    a, b = (torch.randn(B, T, HV, device=device, generator=gen) for _ in range(2))
    A_log = torch.empty(HV, device=device).uniform_(1, 16, generator=gen).log()
    dt_bias = torch.ones(HV, device=device)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    s0 = torch.randn(B, HV, K, V, device=device, generator=gen) * 0.3
    return dict(q=q, k=k, v=v, a=a.bfloat16(), b=b.bfloat16(), A_log=A_log, dt_bias=dt_bias, g=g, beta=beta, s0=s0)


def fla_status(device: str) -> dict:
    """Whether fla-core imports here, its version, and the import's seconds (paid by the first CUDA prefill)."""
    from specpilot.ops.gated_delta_rule import fla

    if device != "cuda":
        return {"available": False, "reason": "not on CUDA: the dispatcher never takes fla there"}
    t0 = time.perf_counter()
    ok = fla.available()
    out = {"available": ok, "import_s": time.perf_counter() - t0}
    if ok:
        import fla as fla_pkg

        out["version"] = getattr(fla_pkg, "__version__", None)
    else:
        out["reason"] = "fla-core is not installed (python3 -m pip install --no-index --no-deps .whl/*.whl)"
    return out


def ours_run_here(device: str) -> bool:
    """Our Triton kernels: on CUDA, or interpreted on the CPU when the process started with TRITON_INTERPRET=1."""
    return device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def prefill_forms(device: str, fla_ok: bool) -> dict:
    """The GDN prefill forms that run here: name -> fn(q, k, v, g, beta, s0) or a skip reason."""
    from specpilot.ops.gated_delta_rule import chunk
    from specpilot.ops.gated_delta_rule import fla as fla_form

    forms = {"torch": chunk.chunk_gated_delta_rule}
    if ours_run_here(device):
        from specpilot.ops.gated_delta_rule import triton as ours

        forms["triton"] = ours.chunk_gated_delta_rule
    else:
        forms["triton"] = "skipped: Triton kernels run only on CUDA (or on the CPU under TRITON_INTERPRET=1)"
    forms["fla"] = fla_form.chunk_gated_delta_rule if fla_ok else "skipped: fla-core not available"
    return forms


def gdn_prefill(plan: Plan, reps: int, fla_ok: bool, clock: Clock) -> list[dict]:
    """(a) each prefill form at each length: the output and final state against the torch form's, then its time."""
    rows = []
    for T in plan.gdn_tokens:
        x = gdn_inputs(plan.gdn, 1, T, plan.device)
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["s0"])
        row = {"tokens": T, **plan.gdn}
        ref = None
        for name, fn in prefill_forms(plan.device, fla_ok).items():
            if isinstance(fn, str):
                row[name] = {"skipped": fn}
                continue
            if not clock.fits(5):
                row[name] = {"skipped": "time budget"}
                continue
            r = attempt(f"GDN {name} T={T}", _time_form, fn, args, ref, plan.device, reps)
            outputs = r.pop("outputs", None)
            if name == "torch":
                ref = outputs
            row[name] = r
        for name in ("triton", "fla"):
            if "ms_median" in row.get(name, {}) and "ms_median" in row["torch"]:
                row[f"{name}_speedup_vs_torch"] = row["torch"]["ms_median"] / row[name]["ms_median"]
        if "ms_median" in row.get("fla", {}) and "ms_median" in row.get("triton", {}):
            row["fla_speedup_vs_triton"] = row["triton"]["ms_median"] / row["fla"]["ms_median"]
        rows.append(row)
        print(f"GDN T={T}: " + ", ".join(
            f"{n} {row[n]['ms_median']:.2f} ms" if "ms_median" in row[n] else f"{n} {row[n].get('skipped', 'error')}"
            for n in ("torch", "triton", "fla")), flush=True)
    return rows


def _time_form(fn, args, ref, device, reps) -> dict:
    sync(device)
    t0 = time.perf_counter()
    o, s = fn(*args)  # the first call compiles (and fla autotunes): its time is what a cold prefill pays
    sync(device)
    out = {"first_call_s": time.perf_counter() - t0,
           "outputs": (o.float(), s.float())}  # popped by the caller: the torch form's are the others' reference
    if ref is not None:
        out["o_vs_torch"] = rel_err(o.float(), ref[0])
        out["state_vs_torch"] = rel_err(s.float(), ref[1])
        out["max_abs_diff_o"] = out["o_vs_torch"]["max_abs_err"]
        out["max_abs_diff_state"] = out["state_vs_torch"]["max_abs_err"]
    del o, s
    ms = time_ms(lambda: fn(*args), device, reps, warmup=2)
    return {**out, "ms": ms, "ms_median": median(ms)}


def gdn_decode(plan: Plan, fla_ok: bool) -> list[dict]:
    """(a) one decode token per request (T = 1) at each batch: our fused recurrent kernel (in place in the pool)
    against fla's fused recurrent kernel, alone (state gathered beforehand, final state left in its output) and
    behind our pool contract (gather, kernel, scatter); each checked against the reference first. CUDA-graph
    replays on the GPU (no host launch time), eager calls on the CPU."""
    from specpilot.ops.gated_delta_rule import fla as fla_form
    from specpilot.ops.gated_delta_rule import fused_recurrent_gated_delta_rule_ref

    rows = []
    for B in plan.decode_batches:
        x = gdn_inputs(plan.gdn, B, 1, plan.device, seed=B)
        pool = x["s0"].contiguous()
        idx = torch.arange(B, device=plan.device)
        args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"])
        ref_pool = pool.clone()
        o_ref = fused_recurrent_gated_delta_rule_ref(*args, ref_pool, idx)
        fns = {}
        if ours_run_here(plan.device):
            from specpilot.ops.gated_delta_rule import triton as ours

            fns["ours"] = lambda p: ours.fused_recurrent_gated_delta_rule(*args, p, idx)
        if fla_ok:
            fns["fla_pool"] = lambda p: fla_form.fused_recurrent_gated_delta_rule(*args, p, idx)
            kernel = fla_form._ops().fused_recurrent_gated_delta_rule
            h0 = pool.clone()
            fns["fla_kernel"] = lambda p: kernel(
                x["q"], x["k"], x["v"], g=x["a"], beta=x["b"], initial_state=h0, output_final_state=True,
                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
                use_beta_sigmoid_in_kernel=True)[0]
        row = {"batch": B, **plan.gdn}
        for name, fn in fns.items():
            row[name] = attempt(f"decode {name} B={B}", _time_decode, fn, pool, o_ref, ref_pool, plan.device,
                                name != "fla_kernel")
        if not fns:
            row["skipped"] = "the decode kernels run only on CUDA (or on the CPU under TRITON_INTERPRET=1)"
        for name in ("fla_pool", "fla_kernel"):
            if "us" in row.get("ours", {}) and "us" in row.get(name, {}):
                row[f"{name}_speedup_vs_ours"] = row["ours"]["us"] / row[name]["us"]
        rows.append(row)
    return rows


def _time_decode(fn, pool, o_ref, ref_pool, device, pooled: bool) -> dict:
    work = pool.clone()
    o = fn(work)
    sync(device)
    out = {"o_vs_ref": rel_err(o.float(), o_ref.float())}
    if pooled:
        out["pool_vs_ref"] = rel_err(work, ref_pool)
    if device == "cuda":
        try:  # fla's Python wrapper under capture: eager timing if it cannot be captured
            out["us"] = graph_ms(lambda i: fn(work)) * 1e3
            out["timing"] = "cuda graph"
            return out
        except Exception as e:  # noqa: BLE001
            out["graph_error"] = f"{type(e).__name__}: {e}"[:300]
            sync(device)
    out["us"] = median(time_ms(lambda: fn(work), device, 50 if device == "cuda" else 3, warmup=2)) * 1e3
    out["timing"] = "eager (CUDA events)" if device == "cuda" else "eager (wall clock)"
    return out


# ---------------------------------------------------------------- (b, c) whole-model prefill


def matmul_peak(device: str, n: int, reps: int = 20) -> dict:
    """The bf16 tensor-core peak as torch.matmul reaches it: an n x n x n product, median of reps."""
    a = torch.randn(n, n, device=device).bfloat16()
    b = torch.randn(n, n, device=device).bfloat16()
    ms = median(time_ms(lambda: a @ b, device, reps, warmup=5))
    return {"n": n, "ms": ms, "tflops": 2 * n**3 / (ms / 1e3) / 1e12}


def prefill_flops(model, cfg: ModelConfig, batch: int, tokens: int, start: int = 0) -> dict:
    """Useful FLOPs of prefilling `tokens` tokens after `start` committed ones, for each of `batch` sequences."""
    matrix = sum(p.numel() for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("model.layers."))
    new = batch * tokens
    pairs = batch * (tokens * start + tokens * (tokens + 1) // 2)  # (query, key) pairs at or before the query
    out = {"matrices": 2 * matrix * new,
           "lm_head": 2 * cfg.vocab_size * cfg.hidden_size * batch,
           "attention": 4 * cfg.num_attention_heads * cfg.head_dim * pairs * cfg.num_attention_layers}
    if cfg.num_linear_layers:
        HV, K, V, L = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim, GDN_CHUNK
        conv_dim = 2 * cfg.linear_num_key_heads * K + HV * V
        # per value head and token: K K^T, Q K^T, the WY factors (L x L by K and V), the intra-chunk output, and
        # the three state products (W S, Q S, K^T U)
        per_token = HV * (2 * L * (3 * K + 2 * V) + 6 * K * V) + 2 * conv_dim * cfg.linear_conv_kernel_dim
        out["gdn_estimate"] = per_token * new * cfg.num_linear_layers
    out["total"] = sum(out.values())
    return out


class ChunkTimer:
    """Wraps runner.forward from outside: a device timestamp pair around each forward (one prefill chunk) and its
    start position, so a prefill's per-chunk times come with no extra synchronisation."""

    def __init__(self, runner: ModelRunner):
        self.inner, self.marks = runner.forward, []
        self.cuda = runner.device.type == "cuda"
        runner.forward = self

    def _stamp(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def __call__(self, meta, layers=()):
        start = self._stamp()
        out = self.inner(meta, layers)
        self.marks.append((int(meta.max_prefix_len), int(meta.input_ids.shape[1]), start, self._stamp()))
        return out

    def take(self) -> list[tuple[int, int, float]]:
        """(start position, tokens, ms) per chunk since the last take (synchronises)."""
        if self.cuda:
            torch.cuda.synchronize()
        out = [(p, n, s.elapsed_time(e) if self.cuda else (e - s) * 1e3) for p, n, s, e in self.marks]
        self.marks.clear()
        return out


def _prefill(runner: ModelRunner, prompts: list[list[int]]) -> torch.Tensor:
    return runner.prefill(0, prompts[0]) if len(prompts) == 1 else runner.prefill_many(prompts)


def cache_bytes(cfg: ModelConfig, batch: int, tokens: int, dtype_bytes: int = 2) -> int:
    """K/V rows of every attention layer plus the recurrent state, for batch sequences of `tokens` tokens."""
    kv = 2 * cfg.num_key_value_heads * cfg.head_dim * dtype_bytes * cfg.num_attention_layers * batch * tokens
    state = 0
    if cfg.num_linear_layers:
        conv = (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
                + cfg.linear_num_value_heads * cfg.linear_value_head_dim) * (cfg.linear_conv_kernel_dim - 1)
        ssm = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
        state = (conv * dtype_bytes + ssm) * cfg.num_linear_layers * batch
    return kv + state


def activation_bytes(cfg: ModelConfig, rows: int) -> int:
    """A generous bound on one chunk's live activations (rows = batch x chunk tokens): the MLP's gate|up and
    product, the residual stream, the projections' outputs, the delta rule's per-chunk states, with margin x2."""
    per_row = 3 * cfg.intermediate_size + 8 * cfg.hidden_size
    if cfg.num_linear_layers:
        per_row += 4 * cfg.linear_num_value_heads * cfg.linear_value_head_dim
        per_row += cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim // GDN_CHUNK
    return 2 * 2 * per_row * rows


def whole_model(name: str, plan: Plan, peak: float, clock: Clock, deadline_s: float, report, args) -> dict:
    """(b)+(c) for one shape: build, then each (batch, length) after a warm-up per batch, per-chunk times kept."""
    from specpilot.ops.gated_delta_rule import prefill_kernel

    hf_cfg = shapes.hf_config(name)
    t0 = time.perf_counter()
    model = shapes.random_model(hf_cfg, plan.device, torch.bfloat16 if plan.device == "cuda" else torch.float32)
    cfg = model.config
    out = {"shape": name, "build_s": time.perf_counter() - t0, "prefill_chunk": args.prefill_chunk,
           "max_position_embeddings": cfg.max_position_embeddings, "runs": []}
    report.data["models"].append(out)
    runner = ModelRunner(model, Runtime.build(EngineConfig(), plan.device), prefill_chunk=args.prefill_chunk)
    if cfg.num_linear_layers:
        q = torch.zeros(1, 1, cfg.linear_num_key_heads, cfg.linear_key_head_dim, device=plan.device,
                        dtype=next(model.parameters()).dtype)
        v = torch.zeros(1, 1, cfg.linear_num_value_heads, cfg.linear_value_head_dim, device=plan.device,
                        dtype=q.dtype)
        out["gdn_prefill_form"] = prefill_kernel(q, q, v, 64, runner.runtime.prefill.gdn_prefill_kernel)
    timer = ChunkTimer(runner)
    if cfg.num_linear_layers:  # first: it decides the layer's GDN path
        out["gdn_form_ab"] = attempt(f"{name} GDN forms", gdn_form_ab, runner, timer, cfg, plan.ab_tokens, clock,
                                     deadline_s)
    rate, rate_tokens = 0.25 * peak, 0  # FLOP/s for the budget: the largest run's so far (a guess before one)
    warmed: set[tuple[int, int]] = set()  # (batch, chunk tokens) compiled
    lines: dict[int, tuple[float, float]] = {}  # batch -> a full chunk's seconds at position 0, and per position
    for batch in plan.batches:
        for T in plan.tokens:
            row = {"batch": batch, "tokens": T}
            out["runs"].append(row)
            flops = prefill_flops(model, cfg, batch, T)
            row["flops"] = flops
            reps = 3 if batch * T <= 16384 else 1
            # the larger of two guesses, 10% added for the warm-up of a new chunk size: the FLOPs at the rate of the
            # largest run so far, and this batch's chunk times extrapolated in the chunk's position (attention
            # grows with the prefix, and its kernel may not keep the rate of the projections)
            est = 1.1 * reps * max(flops["total"] / rate, _extrapolate(lines.get(batch), T, args.prefill_chunk))
            need, free = _memory(runner, cfg, batch, T, args.prefill_chunk)
            if T >= cfg.max_position_embeddings:
                row["skipped"] = f"{T} tokens >= max_position_embeddings {cfg.max_position_embeddings}"
            elif need > 0.92 * free:
                row["skipped"] = (f"does not fit: about {need / 2**30:.1f} GiB of cache and activations, "
                                  f"{free / 2**30:.1f} GiB free")
            elif clock.elapsed() + est > deadline_s:
                row["skipped"] = (f"time budget: about {est:.0f} s at the measured rate, "
                                  f"{deadline_s - clock.elapsed():.0f} s left for this shape")
            if "skipped" in row:
                print(f"{name} B={batch} T={T}: skipped ({row['skipped']})", flush=True)
                continue
            row.update(attempt(f"{name} B={batch} T={T}", _time_prefill, runner, timer, cfg, batch, T, reps, warmed,
                               plan.device))
            if "s_median" in row:
                row["tflops"] = flops["total"] / row["s_median"] / 1e12
                row["fraction_of_peak"] = row["tflops"] * 1e12 / peak
                row["tokens_per_s"] = batch * T / row["s_median"]
                row["chunk_flops"] = [prefill_flops(model, cfg, batch, n, p)["total"] for p, n, _ in row["chunks"]]
                if batch * T >= rate_tokens:
                    rate, rate_tokens = flops["total"] / row["s_median"], batch * T
                lines[batch] = _chunk_line(row["chunks"]) or lines.get(batch)
                print(f"{name} B={batch} T={T}: {row['s_median'] * 1e3:.1f} ms, {row['tflops']:.0f} TFLOP/s "
                      f"({100 * row['fraction_of_peak']:.0f}% of peak)", flush=True)
            report.save()
    del runner.forward  # the class's method again (the timer's bound method would keep the runner in a cycle)
    runner.cache = None
    del runner, model, timer
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    return out


def _chunk_line(chunks: list[tuple[int, int, float]]) -> tuple[float, float] | None:
    """Least-squares seconds of a full chunk as a + b x its start position, from a run's full chunks (two or more)."""
    full = [(p, ms / 1e3) for p, n, ms in chunks if n == chunks[0][1]]
    if len(full) < 2:
        return None
    mp = sum(p for p, _ in full) / len(full)
    mt = sum(t for _, t in full) / len(full)
    b = sum((p - mp) * (t - mt) for p, t in full) / sum((p - mp) ** 2 for p, _ in full)
    return mt - b * mp, max(b, 0.0)


def _extrapolate(line: tuple[float, float] | None, T: int, chunk: int) -> float:
    """Seconds a prefill of T tokens would take chunk by chunk on `line` (0 without one)."""
    if line is None:
        return 0.0
    a, b = line
    return sum((a + b * p) * min(chunk, T - p) / chunk for p in range(0, T, chunk))


def _memory(runner: ModelRunner, cfg: ModelConfig, batch: int, T: int, chunk: int) -> tuple[int, float]:
    """(bytes a prefill of batch x T needs beyond what is allocated, bytes it may use): a new cache if the current
    one is too small (allocate then frees the old one), plus one chunk's activations. Unbounded on the CPU."""
    if runner.device.type != "cuda":
        return 0, float("inf")
    c = runner.cache
    grows = c is None or c.num_slots < batch or c.max_seq_len < T + 1
    held = 0 if c is None else sum(t.numel() * t.element_size() for t in vars(c).values()
                                   if isinstance(t, torch.Tensor))
    need = (cache_bytes(cfg, batch, T + 1) if grows else 0) + activation_bytes(cfg, batch * min(T, chunk))
    return need, torch.cuda.mem_get_info()[0] + (held if grows else 0)


def _time_prefill(runner, timer, cfg, batch, T, reps, warmed: set, device) -> dict:
    runner.allocate(batch, T + 1)
    gen = torch.Generator().manual_seed(T)
    prompts = torch.randint(0, cfg.vocab_size, (batch, T), generator=gen).tolist()
    # a prompt of one chunk of each size this run has that no run had yet: every kernel compiled before the timing
    for n in sorted({min(T, runner.prefill_chunk), T % runner.prefill_chunk} - {0}):
        if (batch, n) not in warmed:
            _prefill(runner, [p[:n] for p in prompts])
            warmed.add((batch, n))
    sync(device)
    timer.take()
    seconds, chunks = [], []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        logits = _prefill(runner, prompts)
        sync(device)
        seconds.append(time.perf_counter() - t0)
        chunks = timer.take()
    return {"s": seconds, "s_median": median(seconds), "reps": reps, "chunks": chunks,
            "logits_finite": bool(torch.isfinite(logits).all())}


def gdn_form_ab(runner, timer, cfg, T: int, clock: Clock, deadline_s: float) -> dict:
    """The whole model's prefill of T tokens (batch 1) with each GDN prefill form (KernelPaths.gdn_prefill_kernel
    "fla", "triton", "torch"), each after a warm-up, interleaved; last-token logits against the torch form's."""
    base = runner.runtime
    out, logits = {}, {}
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (T,), generator=gen).tolist()
    runner.allocate(1, T + 1)
    forms = ("fla", "triton", "torch")
    try:
        for rnd in range(3):  # round 0 warms each form up
            for form in forms:
                if not clock.fits(0) or clock.elapsed() > deadline_s:
                    out.setdefault(form, {})["skipped"] = "time budget"
                    continue
                runner.runtime = dataclasses.replace(
                    base, prefill=dataclasses.replace(base.prefill, gdn_prefill_kernel=form))
                sync(runner.device)
                t0 = time.perf_counter()
                logits[form] = runner.prefill(0, prompt if rnd else prompt[:runner.prefill_chunk]).float()
                sync(runner.device)
                if rnd:
                    out.setdefault(form, {}).setdefault("s", []).append(time.perf_counter() - t0)
            timer.take()
    finally:
        runner.runtime = base
    for form in forms:
        if out.get(form, {}).get("s"):
            out[form]["s_median"] = median(out[form]["s"])
            if form != "torch" and "torch" in logits and form in logits:
                out[form]["max_abs_logit_diff_vs_torch"] = (logits[form] - logits["torch"]).abs().max().item()
    out["tokens"] = T
    return out


# ---------------------------------------------------------------- (d) time to first token of a fresh process


def ttft_child(shape: str, device: str) -> None:
    """In this (fresh) process: build the shape, then two generates of a 10-token prompt; prints one JSON line."""
    from bench.common import make_runner
    from specpilot.engine.generator import Generator
    from specpilot.runtime.sampling import SamplingParams

    started = time.perf_counter()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = shapes.random_model(shapes.hf_config(shape), device, dtype)
    sync(device)
    built = time.perf_counter() - started
    gen = Generator(make_runner(model))
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    prompt = list(range(1, 11))
    ttft, total = [], []
    for _ in range(2):
        r = gen.generate([prompt], params)[0]
        ttft.append(r.ttft_s)
        total.append(r.total_s)
    print(TTFT_PREFIX + json.dumps({"shape": shape, "build_s": built, "first_ttft_s": ttft[0],
                                    "second_ttft_s": ttft[1], "first_total_s": total[0],
                                    "second_total_s": total[1], "prompt_tokens": len(prompt),
                                    "max_new_tokens": params.max_new_tokens}), flush=True)


def ttft(plan: Plan, clock: Clock, timeout_s: float) -> dict:
    """(d) two fresh processes one after the other, each timing its first and second generate."""
    cache = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    out = {"shape": plan.ttft_shape, "triton_cache_dir": str(cache),
           "triton_cache_files_before": sum(1 for _ in cache.rglob("*")) if cache.exists() else 0, "processes": []}
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    for i in range(2):
        left = min(timeout_s, clock.budget_s - clock.elapsed())
        if left < 20:
            out["processes"].append({"skipped": "time budget"})
            continue
        cmd = [sys.executable, "-m", "bench", "prefill", "--ttft-child", plan.ttft_shape, "--device", plan.device,
               "--out", os.devnull]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=left, cwd=root, env=env)
        except subprocess.TimeoutExpired:
            out["processes"].append({"error": f"timed out after {left:.0f} s"})
            continue
        row = {"process_s": time.perf_counter() - t0, "rc": p.returncode}
        line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith(TTFT_PREFIX)), None)
        if line is None:
            row["error"] = (p.stderr or p.stdout)[-2000:]
        else:
            row.update(json.loads(line[len(TTFT_PREFIX):]))
        out["processes"].append(row)
        print(f"TTFT process {i + 1}: {json.dumps(row)[:400]}", flush=True)
    return out


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench prefill", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="2k and 8k tokens only, no time to first token")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: a check of the script in seconds")
    p.add_argument("--skip-ttft", action="store_true", help="leave out (d), the fresh-process time to first token")
    p.add_argument("--skip-gdn-layer", action="store_true",
                   help="leave out (a), the single GDN layer's forms and decode kernels (the budget goes to (b), (c))")
    p.add_argument("--budget-s", type=float, default=400.0,
                   help="the run's time budget: configurations that would overrun it are skipped (default 400)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions of each GDN layer call (default 5)")
    p.add_argument("--prefill-chunk", type=int, default=2048, help="tokens per prefill forward (the runner's)")
    p.add_argument("--commit", default=None, help="commit hash to record (default: SPECPILOT_COMMIT or git)")
    p.add_argument("--ttft-child", metavar="SHAPE", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reps < 1 or args.prefill_chunk < 1 or args.budget_s <= 0:
        p.error("--reps and --prefill-chunk must be >= 1 and --budget-s > 0")
    if args.ttft_child:
        ttft_child(args.ttft_child, args.device)
        return 0
    if args.smoke:
        args.device = "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device: run on the GPU, or --smoke for the CPU check")
    plan = Plan.of(args)
    if args.smoke:
        args.prefill_chunk = min(args.prefill_chunk, 32)  # several chunks per tiny prompt
    clock = Clock(args.budget_s)
    torch.manual_seed(0)
    report = Report(args.out, {**run_record(plan.device, args.commit), "plan": dataclasses.asdict(plan),
                               "budget_s": args.budget_s, "models": []})
    report["fla"] = fla_status(plan.device)
    fla_ok = report["fla"]["available"]
    report["matmul_peak"] = section("bf16 matmul peak", clock, matmul_peak, plan.device, plan.matmul_n)
    peak = report["matmul_peak"].get("tflops", 989.0) * 1e12 if not failed(report["matmul_peak"]) else 989e12
    if args.skip_gdn_layer:
        report["gdn_prefill"] = report["gdn_decode"] = {"skipped": "--skip-gdn-layer"}
    else:
        report["gdn_prefill"] = section("(a) GDN layer prefill", clock, gdn_prefill, plan, args.reps, fla_ok, clock)
        report["gdn_decode"] = section("(a) GDN decode", clock, gdn_decode, plan, fla_ok)
    # the rest of the budget: the first shape gets 60% of what (d) leaves, the second the remainder
    reserve = 75.0 if plan.ttft_shape else 0.0
    for i, name in enumerate(plan.models):
        left = args.budget_s - reserve - clock.elapsed()
        deadline = clock.elapsed() + (0.6 * left if i == 0 and len(plan.models) > 1 else left)
        r = section(f"(b, c) whole-model prefill {name}", clock, whole_model, name, plan, peak, clock, deadline,
                    report, args)
        if failed(r):
            models = report["models"]
            if models and models[-1]["shape"] == name:  # built, then failed
                models[-1]["error"] = r["error"]
            else:
                models.append({"shape": name, **r})
        report.save()
    if plan.ttft_shape:
        report["ttft"] = section("(d) time to first token", clock, ttft, plan, clock, 150.0)
    report["elapsed_s"] = clock.elapsed()
    print_table(report.data)
    return 0


def _f(x, fmt: str) -> str:
    width = fmt.split(".")[0]
    return format(x, fmt) if isinstance(x, (int, float)) else format("-", f">{width}")


def print_table(r: dict) -> None:
    peak = r.get("matmul_peak", {})
    print(f"\n{r['gpu']}  commit {r['commit']}  fla {r['fla'].get('version', r['fla'].get('reason'))}  "
          f"bf16 matmul peak {_f(peak.get('tflops'), '.0f')} TFLOP/s  elapsed {_f(r.get('elapsed_s'), '.0f')} s")
    print(f"\n(a) GDN layer prefill {r['plan']['gdn']}: ms (max |o - torch form|)")
    print(f"{'tokens':>7} {'torch':>9} {'ours':>9} {'fla':>9} {'ours/fla':>8} {'|do| ours':>10} {'|do| fla':>9} "
          f"{'fla 1st call s':>14}")
    for row in r.get("gdn_prefill", []) if isinstance(r.get("gdn_prefill"), list) else []:
        t, o, fl = (row.get(n, {}) for n in ("torch", "triton", "fla"))
        print(f"{row['tokens']:>7} {_f(t.get('ms_median'), '9.2f')} {_f(o.get('ms_median'), '9.2f')} "
              f"{_f(fl.get('ms_median'), '9.2f')} {_f(row.get('fla_speedup_vs_triton'), '8.2f')} "
              f"{_f(o.get('max_abs_diff_o'), '10.1e')} {_f(fl.get('max_abs_diff_o'), '9.1e')} "
              f"{_f(fl.get('first_call_s'), '14.2f')}")
    print("\n(a) GDN decode, one token: us per call")
    print(f"{'batch':>5} {'ours':>8} {'fla kernel':>10} {'fla+pool':>9}")
    for row in r.get("gdn_decode", []) if isinstance(r.get("gdn_decode"), list) else []:
        print(f"{row['batch']:>5} {_f(row.get('ours', {}).get('us'), '8.1f')} "
              f"{_f(row.get('fla_kernel', {}).get('us'), '10.1f')} {_f(row.get('fla_pool', {}).get('us'), '9.1f')}")
    print("\n(b) whole-model prefill: TFLOP/s against the measured peak; (c) last chunk / first full chunk")
    print(f"{'shape':12} {'B':>2} {'tokens':>6} {'ms':>9} {'tok/s':>9} {'TFLOP/s':>7} {'%peak':>5} "
          f"{'chunks':>6} {'last/1st':>8} {'FLOP ratio':>10}")
    for m in r.get("models", []):
        for row in m.get("runs", []):
            head = f"{m['shape']:12} {row['batch']:>2} {row['tokens']:>6}"
            if "s_median" not in row:
                print(f"{head} {row.get('skipped') or row.get('error', '')[:80]}")
                continue
            growth, flop_growth = _chunk_growth(row)
            print(f"{head} {row['s_median'] * 1e3:9.1f} {row['tokens_per_s']:9.0f} {row['tflops']:7.0f} "
                  f"{100 * row['fraction_of_peak']:5.0f} {len(row['chunks']):>6} {_f(growth, '8.2f')} "
                  f"{_f(flop_growth, '10.2f')}")
        ab = m.get("gdn_form_ab")
        if isinstance(ab, dict) and ab.get("tokens"):
            forms = ", ".join(f"{k} {_f(v.get('s_median', None) and v['s_median'] * 1e3, '.1f')} ms"
                              for k, v in ab.items() if isinstance(v, dict))
            print(f"{m['shape']:12} GDN prefill form in the whole model, 1 x {ab['tokens']}: {forms} "
                  f"(layer picks {m.get('gdn_prefill_form')})")
    t = r.get("ttft")
    if isinstance(t, dict):
        print(f"\n(d) time to first token, {t.get('shape')}, 10-token prompt: first / second generate per process")
        for i, pr in enumerate(t.get("processes", [])):
            print(f"process {i + 1}: {_f(pr.get('first_ttft_s'), '.3f')} s / {_f(pr.get('second_ttft_s'), '.3f')} s "
                  f"{pr.get('error', pr.get('skipped', ''))[:120]}")


def _chunk_growth(row: dict) -> tuple[float | None, float | None]:
    """The last chunk's time over the first full chunk's, and the same ratio of their counted FLOPs."""
    chunks, flops = row.get("chunks") or [], row.get("chunk_flops") or []
    full = [i for i, (_, n, _) in enumerate(chunks) if n == chunks[0][1]]
    if len(full) < 2:
        return None, None
    first, last = full[0], full[-1]
    return chunks[last][2] / chunks[first][2], flops[last] / flops[first]


if __name__ == "__main__":
    sys.exit(main())
