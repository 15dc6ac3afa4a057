"""Offline SASS instruction counts of the W12N and FP8-view GEMV kernels' main loops (sm_90, no GPU needed).

Compiles `_w12n_gemv_kernel` and `_fp8_gemv_kernel` with Triton's nvidia backend for an H100/H200 target
(ptxas and cuobjdump ship with Triton), with the wrapper's default config (block_n 8, block_k = the segment
capped at 512, 4 warps) and the argument alignment a real launch gets (pointers and row strides divisible by
16), then counts the instructions of the longest loop of the SASS listing.

Normalisation, per kernel and M:
  loop        = instructions between the loop's label and its backward branch (static count, one iteration)
  fast        = loop minus the largest forward-branch region inside it (the verbatim-segment fix-up, skipped
                by a uniform branch in every tile without a verbatim row): what a normal iteration executes
  weights/it  = BLOCK_N * BLOCK_K / (32 * num_warps): weights one thread decodes per loop iteration
  per_weight  = fast / (weights/it)   (also loop / (weights/it) as per_weight_static)
so per_weight includes everything in the iteration: loads, decode, x loads/converts, the M FMAs per weight
and the per-tile reductions.

    python3 -m bench sass_count --out bench/results/sass_count.json [--sass-dir /tmp/sass]
"""

from __future__ import annotations

import argparse
import json
import os
import re
from types import SimpleNamespace

from bench.sass import compile_sass, loop_breakdown


def kernel_cases(block_n: int = 8, segment: int = 512, num_warps: int = 4, ms=(1, 8, 16)):
    """[(name, kernel fn, constexprs, num_warps, weights per thread per iteration, argument types or None)] at the
    wrappers' defaults; the tensor-core W12N kernel (Gluon; M is a runtime argument there, M.16 = two n tiles)."""
    from specpilot.ops.w12n_gemv import triton as kernels

    block_k = kernels.default_block_k(segment)
    per_thread = block_n * block_k / (32 * num_warps)
    out = []
    for m in ms:
        common = dict(M=m, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=True, EVEN_N=True, X_WORDS=True, OUT_BF16=True,
                      USE_ASM=True)
        out.append((f"w12n.M{m}", kernels._w12n_gemv_kernel, dict(common, SEGMENT=segment), num_warps, per_thread,
                    None))
        if m in (1, 8):  # the FP8 view at its default launch for a 4096-wide K
            f = kernels.fp8_launch(SimpleNamespace(padded_k=4096), m)
            consts = dict(common, BLOCK_N=f["block_n"], BLOCK_K=f["block_k"], PREFETCH=f["prefetch"])
            out.append((f"fp8.M{m}", kernels._fp8_gemv_kernel, consts, f["num_warps"],
                        f["block_n"] * f["block_k"] / (32 * f["num_warps"]), None))
    # the decode to bf16 (products of more than 16 rows): the same walk, each tile stored
    out.append(("w12n_decode", kernels._w12n_decode_kernel,
                dict(BLOCK_N=block_n, BLOCK_K=block_k, SEGMENT=segment, EVEN_N=True, USE_ASM=True), num_warps,
                per_thread, None))
    from specpilot.ops.w12n_gemv import mma

    # the tensor-core kernel: one iteration is one 64-column chunk of rows g and g + 8 per lane (32 weights)
    # (with verbatim segments: their pass comes after the K loop, which must stay the same code)
    # (SWIGLU: the epilogue forming silu(gate) * up, after the loop, which must not change)
    for m, two_n, verbatim, swiglu in ((1, False, False, False), (16, True, False, False), (1, False, True, False),
                                       (1, False, False, True)):
        consts = dict(KS=4, SEGMENT=segment, EVEN_K=True, TWO_N=two_n, HAS_VERBATIM=verbatim, PDL=False,
                      SWIGLU=swiglu)
        name = f"w12n_mma{'_verbatim' if verbatim else ''}{'_swiglu' if swiglu else ''}.M{m}"
        out.append((name, mma._w12n_mma_gemv_kernel, consts, 4, 32, None))
    # 8 warps (the small-N launch) at segment 256 with verbatim segments: an iteration spans two segments
    consts = dict(KS=8, SEGMENT=256, EVEN_K=True, TWO_N=False, HAS_VERBATIM=True, PDL=False, SWIGLU=False)
    out.append(("w12n_mma_verbatim_ks8.M1", mma._w12n_mma_gemv_kernel, consts, 8, 32, None))
    return out


def count(fn, constexprs: dict, num_warps: int, per_thread: float, types: dict | None = None,
          sass_path: str | None = None) -> dict:
    constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}
    sass, meta = compile_sass(fn, constexprs, num_warps, types=types)
    if sass_path:
        with open(sass_path, "w") as f:
            f.write(sass)
    br = loop_breakdown(sass)
    if br is None:
        return {"error": "no loop found", **meta}
    return {"per_weight": round(br["fast"] / per_thread, 2), "per_weight_static": round(br["loop"] / per_thread, 2),
            "weights_per_thread_per_iteration": per_thread, **br, **meta,
            "config": {k: v for k, v in constexprs.items()}, "num_warps": num_warps}


GDN_TREE_TYPES = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "g_ptr": "*fp32", "beta_ptr": "*fp32",
                  "mask_ptr": "*u8", "s0_ptr": "*fp32", "slot_ptr": "*i64", "o_ptr": "*bf16", "kn_ptr": "*fp32",
                  "u_ptr": "*fp32", "G_ptr": "*fp32", "scale": "fp32"}


def gdn_tree_spills(nodes=(16, 32, 64), precisions=("ieee", "tf32")) -> dict:
    """Local-memory traffic (LDL/STL: register spills) of the GDN tree kernel at the 27B heads (K = V = 128,
    3 value heads per key head), per node tile and dot precision, at the wrapper's warps for that tile."""
    from specpilot.ops.gdn_tree import triton as gdn

    out = {}
    for bt in nodes:
        for prec in precisions:
            consts = dict(GROUP=3, K=128, BT=bt, BV=32, EPS=1e-6, HAS_SLOTS=True,
                          PREC=prec, BK=32)
            warps = gdn.TREE_GDN_CONFIG[bt][0]
            try:
                sass, meta = compile_sass(gdn._tree_gdn_kernel, consts, warps, types=GDN_TREE_TYPES)
            except Exception as e:  # noqa: BLE001
                out[f"BT{bt}.{prec}"] = {"error": f"{type(e).__name__}: {e}"[:500]}
                continue
            out[f"BT{bt}.{prec}"] = {"num_warps": warps, "LDL": len(re.findall(r"\bLDL\b", sass)),
                                     "STL": len(re.findall(r"\bSTL\b", sass)), **meta}
            print(f"gdn_tree BT={bt:3} {prec:5} warps={warps:2}: {out[f'BT{bt}.{prec}']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench sass_count", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--sass-dir", default=None, help="also write each kernel's SASS listing here")
    p.add_argument("--segment", type=int, default=512)
    p.add_argument("--block-ns", type=int, nargs="+", default=[8], help="GEMV tile rows (8: the default)")
    p.add_argument("--gdn-tree", action="store_true", help="also the GDN tree kernel's register spills (LDL/STL)")
    args = p.parse_args(argv)
    if args.sass_dir:
        os.makedirs(args.sass_dir, exist_ok=True)
    res = {}
    cases = [(name + (f".bn{bn}" if bn != 8 else ""), *rest) for bn in args.block_ns
             for name, *rest in kernel_cases(block_n=bn, segment=args.segment)]
    for name, fn, consts, warps, per_thread, types in cases:
        path = os.path.join(args.sass_dir, name + ".sass") if args.sass_dir else None
        try:
            res[name] = count(fn, consts, warps, per_thread, types, path)
        except Exception as e:  # noqa: BLE001 - one kernel failing to compile must not hide the others
            res[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        r = res[name]
        print(f"{name:8} " + (f"{r['per_weight']:6.2f} instr/weight (fast path {r['fast']}, loop {r['loop']}, "
                              f"{r['weights_per_thread_per_iteration']:.0f} weights/thread/iter) {r['ops_fast']}" if "per_weight" in r else r["error"]),
              flush=True)
    if args.gdn_tree:
        res["gdn_tree_spills"] = gdn_tree_spills()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

