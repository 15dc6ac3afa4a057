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

    PYTHONPATH=. python3 bench/sass_count.py --out bench/results/sass_count.json [--sass-dir /tmp/sass]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
from types import SimpleNamespace

ALIGNED = ("x_ptr", "a_ptr", "b_ptr", "xe_ptr", "rvb_ptr", "v_ptr", "y_ptr", "w_ptr", "vq_ptr", "vseg_ptr",
           "vcount_ptr", "stride_xm", "stride_an", "stride_bn", "stride_xen", "stride_ym", "stride_wn")
# x, A, B and the pool as the wrappers pass them: word views (bf16 x as int64, K % 4 == 0: X_WORDS)
ARG_TYPES = {"x_ptr": "*i64", "a_ptr": "*i32", "b_ptr": "*i16", "xe_ptr": "*u8", "rvb_ptr": "*i32",
             "v_ptr": "*i64", "y_ptr": "*i16", "w_ptr": "*i64", "vq_ptr": "*i32", "vseg_ptr": "*i32",
             "vcount_ptr": "*i32"}
# every other runtime argument is an i32 scalar (SCALE: fp32)


# one instruction, as cuobjdump (`/*0040*/  @P0 LDG.E ...;`, Triton 3.6's get_sass) or nvdisasm with control
# codes (`--:-:0:-:1\t@P0 LDG.E ...;`, Triton 3.9's) print it
_INSTRUCTION = re.compile(r"\s*(?:/\*[0-9a-f]+\*/|[0-9a-f-]{2}:[-0-9]:[-0-9]:[-Y]:[0-9a-f])\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*);")


def loop_instructions(sass: str) -> tuple[int, dict] | None:
    """Instructions in the main backward-branch loop of a SASS listing (_main_loop), and its commonest opcodes."""
    found = _main_loop(_parse(sass))
    if found is None:
        return None
    ins, a, b = found
    return b - a + 1, _opcodes(ins[a:b + 1])


def _parse(sass: str) -> tuple[list, dict]:
    """SASS text -> ([(opcode, operands)], {label: index of the next instruction})."""
    labels, ins = {}, []
    for line in sass.splitlines():
        m = re.match(r"\s*(\.L_x_\d+|LBB\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = _INSTRUCTION.match(line)
        if m:
            ins.append((m.group(2), m.group(3)))
    return ins, labels


def _branch_target(op: str, rest: str, labels: dict) -> int | None:
    target = re.search(r"(\.L_x_\d+|LBB\d+)", rest) if op.startswith("BRA") else None
    return labels.get(target.group(1)) if target else None


def _main_loop(parsed) -> tuple[list, int, int] | None:
    """The main loop: the first in program order of at least half the longest one's size (the tensor-core kernel
    runs its last DEPTH iterations in a second, longer copy of the loop, after the main one)."""
    ins, labels = parsed
    loops = [(t, i) for i, (op, rest) in enumerate(ins)
             if (t := _branch_target(op, rest, labels)) is not None and t < i]
    if not loops:
        return None
    longest = max(i - t for t, i in loops)
    t, i = min((t, i) for t, i in loops if 2 * (i - t) >= longest)
    return ins, t, i


def _opcodes(ins) -> dict:
    return dict(collections.Counter(op.split(".")[0] for op, _ in ins).most_common(12))


def loop_breakdown(sass: str) -> dict | None:
    """The main loop (_main_loop): its static size, the size of its fast path (minus the largest
    forward-skipped region, the verbatim fix-up) and the opcodes of that fast path."""
    found = _main_loop(_parse(sass))
    if found is None:
        return None
    ins, a, b = found
    _, labels = _parse(sass)
    skip = (0, 0)
    for i in range(a, b):
        t = _branch_target(*ins[i], labels)
        if t is not None and i < t <= b and t - i - 1 > skip[1] - skip[0]:
            skip = (i + 1, t)
    fast = ins[a:skip[0]] + ins[skip[1]:b + 1] if skip[1] else ins[a:b + 1]
    return {"loop": b - a + 1, "fast": len(fast), "skipped": skip[1] - skip[0], "ops_fast": _opcodes(fast)}


def compile_sass(fn, constexprs: dict, num_warps: int, arch: int = 90, types: dict | None = None) -> tuple[str, dict]:
    """Compiles a Triton kernel for sm_<arch> offline -> (SASS text, {triton version}); `types` overrides the
    argument types (default: ARG_TYPES, else i32)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonJITFunction
    from triton.tools.disasm import get_sass

    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = {**ARG_TYPES, **(types or {})}.get(name, "fp32" if name == "SCALE" else "i32")
        if name in ALIGNED:
            attrs[(i,)] = [["tt.divisibility", 16]]
    if isinstance(fn, GluonJITFunction):
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                       target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    return get_sass(k.asm["cubin"]), {"triton": triton.__version__}


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
    # (with verbatim segments: their pass comes after the K loop, which must stay the same code); HALF: 8 weight
    # rows per program, one row (16 weights) per lane and iteration, one mma for all 16 activation rows
    # (SWIGLU: the epilogue forming silu(gate) * up, after the loop, which must not change)
    for m, two_n, verbatim, half, swiglu in ((1, False, False, False, False), (16, True, False, False, False),
                                             (1, False, True, False, False), (1, False, False, False, True),
                                             (1, False, False, True, False), (16, True, False, True, False)):
        consts = dict(KS=4, SEGMENT=segment, EVEN_K=True, TWO_N=two_n, HAS_VERBATIM=verbatim, DEPTH=1, PDL=False,
                      HALF=half, SWIGLU=swiglu, LATE_TRIGGER=False)
        name = (f"w12n_mma{'_verbatim' if verbatim else ''}{'_swiglu' if swiglu else ''}"
                f"{'_half' if half else ''}.M{m}")
        out.append((name, mma._w12n_mma_gemv_kernel, consts, 4, 16 if half else 32, None))
    # 8 warps (the small-N launch) at segment 256 with verbatim segments: an iteration spans two segments
    consts = dict(KS=8, SEGMENT=256, EVEN_K=True, TWO_N=False, HAS_VERBATIM=True, DEPTH=1, PDL=False, HALF=False,
                  SWIGLU=False, LATE_TRIGGER=False)
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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--sass-dir", default=None, help="also write each kernel's SASS listing here")
    p.add_argument("--segment", type=int, default=512)
    p.add_argument("--block-ns", type=int, nargs="+", default=[8], help="GEMV tile rows (8: the default)")
    p.add_argument("--gdn-tree", action="store_true", help="also the GDN tree kernel's register spills (LDL/STL)")
    args = p.parse_args()
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


if __name__ == "__main__":
    main()
