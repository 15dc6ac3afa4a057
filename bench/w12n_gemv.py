"""W12N decode GEMV vs cuBLAS bf16 vs our bf16 GEMV, and the FP8 view, on every projection shape of Qwen3-8B and
Qwen3.5-27B at M = 1, 4, 8, 16; plus SASS instructions per weight in the kernels' main loops.

Correctness first: each kernel against its reference (W12N bitwise-exact weights: the fp32-accumulated GEMV of
the decoded matrix), and batch invariance (row 0 of M rows equals M=1 bitwise); errors are recorded per shape
and M (a failed check is reported, the timing still runs). Times are CUDA-graph replays of back-to-back
launches over weights rotated past the L2 (bench/projections.py, as the gemv benchmark). Every timing runs in
its own try/except, and the JSON is written again after each shape.

    python3 -m bench w12n_gemv --out bench/results/w12n_gemv_h200.json
    TRITON_INTERPRET=1 python3 -m bench w12n_gemv --out /tmp/w.json --device cpu   # dry run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import dataclasses
import time

import torch
import torch.nn.functional as F

from bench.common import Report, attempt, copy_bandwidth, failed, rel_err, run_record
from bench.projections import SHAPES, time_fn
from bench.sass import loop_instructions
from specpilot.bench.shapes import clean
from specpilot.layers import pointwise as pw
from specpilot.ops import gemv as bf16_gemv
from specpilot.ops.w12n_gemv import mma as mma_kernel
from specpilot.ops.w12n_gemv import triton as kernels
from specpilot.ops.w12n_gemv import w12n_linear
from specpilot.ops.w12n_gemv.reference import fp8_gemv_ref, w12n_gemv_ref
from specpilot.weights import w12n

TINY_SHAPES = {"tiny.a": (24, 1000), "tiny.b": (40, 512)}  # --device cpu (Triton interpreter): a dry run


def _constexprs(kernel, fn) -> dict:
    """The constexpr arguments a compiled kernel was specialised on, by name (Triton-internal layout)."""
    out = {}
    for key, value in getattr(kernel.src, "constants", {}).items():
        idx = key[0] if isinstance(key, tuple) else key
        out[fn.arg_names[idx] if isinstance(idx, int) else idx] = value
    return out


def sass_counts(block_n: int, block_k: int, num_warps: int) -> dict:
    """Per-weight instruction counts of the compiled kernels (the cache of the launches already made). Each
    compiled variant's own BLOCK_N, BLOCK_K and num_warps are used where Triton exposes them (else the given
    defaults): instructions per weight = loop instructions / (BLOCK_N * BLOCK_K / threads)."""
    out = {}
    try:
        from triton.tools.disasm import get_sass
    except ImportError:
        return {"error": "triton.tools.disasm unavailable"}
    for name, fn in (("w12n", kernels._w12n_gemv_kernel), ("fp8", kernels._fp8_gemv_kernel),
                     ("w12n_mma", mma_kernel._w12n_mma_gemv_kernel)):
        try:
            compiled = [k for cache in fn.device_caches.values() for k in cache[0].values()]
            rows = []
            for k in compiled:
                try:
                    consts = _constexprs(k, fn)
                except Exception:  # noqa: BLE001
                    consts = {}
                bn, bk = consts.get("BLOCK_N", block_n), consts.get("BLOCK_K", block_k)
                warps = getattr(k.metadata, "num_warps", num_warps)
                s = loop_instructions(get_sass(k.asm["cubin"]))
                if s:
                    # the tensor-core kernel: one iteration is one 64-column chunk of 2 rows per lane (32 weights)
                    per_thread = 32 if name == "w12n_mma" else bn * bk / (warps * 32)
                    rows.append({"loop_instructions": s[0], "instructions_per_weight": round(s[0] / per_thread, 2),
                                 "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps,
                                 "M": consts.get("M"), "SEGMENT": consts.get("SEGMENT"), "ops": s[1]})
            out[name] = rows
        except Exception as e:  # the cache layout is Triton-internal: report, never fail the run
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def timer(device: str):
    """time_fn on a GPU (graph replays, weights rotated); a plain median of calls on the CPU (dry run)."""
    if device == "cuda":
        return time_fn

    def cpu_time(fn, pairs, x, reps: int = 3):
        fn(x, pairs[0])
        times = []
        for i in range(reps):
            t0 = time.perf_counter()
            fn(x, pairs[i % len(pairs)])
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return cpu_time


def check(x, t, fp8_launches: dict | None = None) -> dict:
    """Both kernels against their references, and batch invariance of the exact one (fp8_launches: name ->
    fp8_gemv keywords, each against the reference too)."""
    fp8_ref = fp8_gemv_ref(x, t).float()
    out = {"w12n": rel_err(kernels.w12n_gemv(x, t).float(), w12n_gemv_ref(x, t).float()),
           "fp8": rel_err(kernels.fp8_gemv(x, t).float(), fp8_ref),
           "fp8_launches": {k: rel_err(kernels.fp8_gemv(x, t, **kw).float(), fp8_ref)
                            for k, kw in (fp8_launches or {}).items()}}
    if x.shape[0] > 1:
        out["batch_invariant"] = bool(torch.equal(kernels.w12n_gemv(x[:1], t), kernels.w12n_gemv(x, t)[:1]))
    base = kernels.w12n_gemv(x, t)
    out["block_n_bitwise"] = {bn: bool(torch.equal(kernels.w12n_gemv(x, t, block_n=bn), base)) for bn in (16, 32)}
    if x.is_cuda:  # the tensor-core kernel (Gluon) runs on a GPU only
        mma = mma_kernel.w12n_mma_gemv(x, t)
        out["mma"] = rel_err(mma.float(), w12n_gemv_ref(x, t).float())
        out["mma_batch_invariant"] = all(torch.equal(mma_kernel.w12n_mma_gemv(x[m:m + 1], t), mma[m:m + 1])
                                         for m in range(x.shape[0]))
    out["ok"] = (out["w12n"]["rel_rms_err"] < 1e-2 and out["fp8"]["rel_rms_err"] < 1e-2 and not out["w12n"]["nan"]
                 and out.get("batch_invariant", True) and all(out["block_n_bitwise"].values())
                 and out.get("mma", {"rel_rms_err": 0})["rel_rms_err"] < 1e-2 and out.get("mma_batch_invariant", True)
                 and all(e["rel_rms_err"] < 1e-2 for e in out["fp8_launches"].values()))
    return out


def random_weights(N: int, K: int, dev: str, clean_weights: bool) -> torch.Tensor:
    """N(0, 0.02) bf16 weights. These have verbatim segments (about 0.2% at segment 256: two escape exponents
    among the values near zero), so the tensor-core kernel runs its verbatim pass after the K loop. clean_weights:
    magnitudes below 1e-4 raised to 1e-4, so every exponent lies in the window: no escapes, no verbatim segments,
    as in most tensors of trained checkpoints."""
    w = torch.randn(N, K, device=dev) * 0.02
    if clean_weights:
        w = clean(w)
    return w.to(torch.bfloat16)


def fp8_config(text: str) -> dict:
    """'bn16.bk1024.w8.p1' -> fp8_gemv keywords (block_n, block_k, num_warps, prefetch); parts may be left out."""
    keys = {"bn": "block_n", "bk": "block_k", "w": "num_warps", "p": "prefetch"}
    out = {}
    for part in text.split("."):
        key = part.rstrip("0123456789")
        if key not in keys or key == part:
            raise argparse.ArgumentTypeError(f"FP8 config part {part!r} of {text!r}: expected bnN, bkN, wN or pN")
        out[keys[key]] = bool(int(part[len(key):])) if key == "p" else int(part[len(key):])
    return out


def bench_shape(name, N, K, args, bw, time_it) -> dict:
    dev = args.device
    copies = max(2, (512 << 20) // (N * K * 2) + 1) if dev == "cuda" else 2
    weights = [random_weights(N, K, dev, args.clean_weights) for _ in range(copies)]
    t0 = time.perf_counter()
    encoded = [w12n.encode_best(w) for w in weights]
    if dev == "cuda":  # derived tables built now, not inside the timing's graph capture
        for e in encoded:
            mma_kernel.prepare(e)
            if args.mma_swiglu and mma_kernel.glu_supported(e):
                mma_kernel.prepare(e, swiglu=True)
    row = {"N": N, "K": K, "bf16_bytes": N * K * 2, "w12n_bits_per_weight": w12n.bits_per_weight(encoded[0]),
           "segment": encoded[0].segment, "escape_rate": w12n.stats(encoded[0])["escape_rate"],
           "verbatim_fraction": w12n.stats(encoded[0])["verbatim_fraction"],
           "encode_s_per_matrix": (time.perf_counter() - t0) / copies, "m": {}}
    # the same weights at fixed segments: encode_best picks the smallest encoding, which for random weights is
    # segment 256, while the kernel's loop costs fewer instructions per weight at 512 (offline SASS)
    fixed = {seg: [w12n.encode(w, segment=seg) for w in weights] for seg in args.segments}
    for e in (e for enc in fixed.values() for e in enc if dev == "cuda"):
        mma_kernel.prepare(e)
    row["fixed_segments"] = {seg: {"bits_per_weight": w12n.bits_per_weight(enc[0]),
                                   "verbatim_fraction": w12n.stats(enc[0])["verbatim_fraction"]}
                             for seg, enc in fixed.items()}
    fp8_launches = {}  # FP8-view launches: rows per program, tile width, warps, prefetch
    for cfg in args.fp8_configs:
        kw = fp8_launches[f"fp8_{cfg}"] = fp8_config(cfg)  # block_k: at most the padded K's power-of-two factor
        if "block_k" in kw:
            kw["block_k"] = min(kw["block_k"], encoded[0].padded_k & -encoded[0].padded_k)
    for m in args.ms:
        x = torch.randn(m, K, device=dev).to(torch.bfloat16)
        r = row["m"][m] = {"check": attempt(f"{name} M={m} check", check, x, encoded[0], fp8_launches)}
        if dev == "cuda":
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            r["mma_launch"] = dataclasses.asdict(mma_kernel.default_launch(encoded[0], m, sms))
        pairs = [(w, e, {seg: enc[i] for seg, enc in fixed.items()}) for i, (w, e) in enumerate(zip(weights, encoded))]
        variants = {"cublas_bf16": lambda a, wt: F.linear(a, wt[0]),
                    "w12n": lambda a, wt: kernels.w12n_gemv(a, wt[1]),
                    "fp8_view": lambda a, wt: kernels.fp8_gemv(a, wt[1])}
        for key, kw in fp8_launches.items():
            variants[key] = lambda a, wt, kw=kw: kernels.fp8_gemv(a, wt[1], **kw)
        for bn in args.block_ns:  # wider tiles: fewer instructions per weight, fewer programs
            variants[f"w12n_bn{bn}"] = lambda a, wt, bn=bn: kernels.w12n_gemv(a, wt[1], block_n=bn)
        if dev == "cuda":  # the tensor-core kernel: decode into mma fragments; K split over `ks` warps
            variants["w12n_mma"] = lambda a, wt: mma_kernel.w12n_mma_gemv(a, wt[1])
            if args.mma_swiglu and mma_kernel.glu_supported(encoded[0]):  # the matrix read as an MLP's [gate; up]
                variants["w12n_mma_silu_mul"] = lambda a, wt: pw.silu_mul(mma_kernel.w12n_mma_gemv(a, wt[1]))
                variants["w12n_mma_swiglu"] = lambda a, wt: mma_kernel.w12n_swiglu_gemv(a, wt[1])
            for ks in args.mma_warps:
                if (encoded[0].padded_k // 64) % ks == 0:
                    variants[f"w12n_mma_ks{ks}"] = lambda a, wt, ks=ks: mma_kernel.w12n_mma_gemv(a, wt[1], warps=ks)
                    for cap in args.mma_regs:  # a register cap: more programs per SM
                        variants[f"w12n_mma_ks{ks}_r{cap}"] = lambda a, wt, ks=ks, cap=cap: (
                            mma_kernel.w12n_mma_gemv(a, wt[1], warps=ks, maxnreg=cap))
            for seg in args.segments:
                variants[f"w12n_mma_seg{seg}"] = lambda a, wt, seg=seg: mma_kernel.w12n_mma_gemv(a, wt[2][seg])
        for seg in args.segments:
            variants[f"w12n_seg{seg}"] = lambda a, wt, seg=seg: kernels.w12n_gemv(a, wt[2][seg])
        variants["ours_bf16"] = lambda a, wt: bf16_gemv.gemv(a, wt[0])
        if dev == "cuda":  # the default config again, last: drift between the first and last timing
            variants["w12n_mma_last"] = variants["w12n_mma"]
        times, errors = {}, {}
        for key, fn in variants.items():
            t = attempt(f"{name} M={m} {key}", time_it, fn, pairs, x)
            if failed(t):
                errors[key] = t["error"]
            else:
                times[key] = t
        r["seconds"] = times
        if errors:
            r["errors"] = errors
        if "cublas_bf16" in times:
            r.update({f"{k}_vs_cublas": times["cublas_bf16"] / v for k, v in times.items()})
        for key in ("w12n", "w12n_mma"):
            if key in times:
                r[f"{key}_fraction_of_copy_bw"] = row["w12n_bits_per_weight"] / 8 * N * K / times[key] / bw
        if "cublas_bf16" in times:
            r["cublas_fraction_of_copy_bw"] = 2 * N * K / times["cublas_bf16"] / bw
        print(f"{name:18} M={m:2} " + " ".join(f"{k} {v * 1e6:7.1f}us" for k, v in times.items())
              + (f"  ERRORS {list(errors)}" if errors else "")
              + ("" if r["check"].get("ok") else f"  CHECK FAILED {json.dumps(r['check'])[:300]}"), flush=True)
    for m in args.large_ms:  # above 16 rows: the decode kernel writes W as bf16, then cuBLAS (w12n_linear)
        x = torch.randn(m, K, device=dev).to(torch.bfloat16)
        pairs = [(w, e) for w, e in zip(weights, encoded)]
        same = torch.equal(w12n_linear(x, encoded[0]), F.linear(x, weights[0]))  # the same bf16 W, the same GEMM
        r = row["m"][m] = {"equal_to_bf16_linear": bool(same)}
        timed = (("cublas_bf16", lambda a, wt: F.linear(a, wt[0])),
                 ("w12n_decode_cublas", lambda a, wt: w12n_linear(a, wt[1])))
        times = {key: attempt(f"{name} M={m} {key}", time_it, fn, pairs, x) for key, fn in timed}
        r["seconds"] = {k: v for k, v in times.items() if not failed(v)}
        if len(r["seconds"]) == 2:
            r["w12n_decode_cublas_vs_cublas"] = r["seconds"]["cublas_bf16"] / r["seconds"]["w12n_decode_cublas"]
        print(f"{name:18} M={m:2} " + " ".join(f"{k} {v * 1e6:7.1f}us" for k, v in r["seconds"].items())
              + f"  equal {r['equal_to_bf16_linear']}", flush=True)
    del weights, encoded, fixed
    if dev == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench w12n_gemv", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--commit", default=None)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--large-ms", type=int, nargs="*", default=[],
                   help="also time products of this many rows (> 16): decode kernel + cuBLAS against cuBLAS bf16")
    p.add_argument("--mma-warps", type=int, nargs="*", default=[4, 8, 16],
                   help="also time the tensor-core kernel with K split over these many warps")
    p.add_argument("--clean-weights", action="store_true",
                   help="weights without escapes or verbatim segments (the kernels' fast path only)")
    p.add_argument("--mma-regs", type=int, nargs="*", default=[],
                   help="also time each --mma-warps config at these register caps (maxnreg)")
    p.add_argument("--block-ns", type=int, nargs="*", default=[],
                   help="also time the W12N GEMV at these block_n (default 8 is the 'w12n' column)")
    p.add_argument("--segments", type=int, nargs="*", default=[],
                   help="also time encodings at these fixed segments (block_n 8 and --block-ns)")
    p.add_argument("--fp8-configs", nargs="*", default=[],
                   help="also time the FP8 view at these launches, e.g. bn16.bk1024.w8.p1 (block_n, block_k, "
                        "warps, prefetch)")
    p.add_argument("--mma-swiglu", action="store_true",
                   help="also time the SwiGLU epilogue (w12n_swiglu_gemv) against the product then silu_mul")
    p.add_argument("--shapes", nargs="+", default=None, help="subset of the projection shapes (default: all)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a dry run on tiny shapes (needs TRITON_INTERPRET=1)")
    args = p.parse_args(argv)
    for cfg in args.fp8_configs:  # a typo fails here, not after minutes of encoding
        fp8_config(cfg)
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        p.error("--device cpu runs the Triton kernels in the interpreter: set TRITON_INTERPRET=1")
    shapes = SHAPES if args.device == "cuda" else TINY_SHAPES
    if args.shapes:
        shapes = {k: v for k, v in shapes.items() if k in args.shapes}
    torch.manual_seed(0)
    report = Report(args.out, {**run_record(args.device, args.commit), "shapes": {}})
    bw = attempt("copy bandwidth", copy_bandwidth, args.device)
    if failed(bw):
        report["copy_bandwidth_error"] = bw
        bw = 4.2e12
    report["copy_bandwidth_bytes_per_s"] = bw
    time_it = timer(args.device)
    for name, (N, K) in shapes.items():
        report["shapes"][name] = attempt(f"shape {name}", bench_shape, name, N, K, args, bw, time_it)
        report.save()
    if args.device == "cuda":
        report["sass"] = attempt("sass", sass_counts, 8, 512, 4)
    else:
        report["sass"] = {"skipped": "no cubin under the Triton interpreter"}
    print(json.dumps(report["sass"])[:2000])
    checks = [(n, m, r["check"] if "check" in r else {"ok": r["equal_to_bf16_linear"]})
              for n, row in report["shapes"].items() if "m" in row for m, r in row["m"].items()]
    bad = [(n, m) for n, m, c in checks if not c.get("ok")]
    report["all_checks_ok"] = not bad and bool(checks)
    print(f"correctness: {len(checks) - len(bad)}/{len(checks)} (shape, M) checks ok"
          + (f"; failed: {bad}" if bad else ""))

