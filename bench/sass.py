"""SASS of Triton kernels compiled offline for sm_90 (Triton ships ptxas and the disassembler; no GPU needed), and
the main loop of a listing: its size, the size of its fast path and its commonest opcodes."""

from __future__ import annotations

import collections
import re

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
    runs its last iterations in a second, longer copy of the loop, after the main one)."""
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
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    from triton.tools.disasm import get_sass

    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = {**ARG_TYPES, **(types or {})}.get(name, "fp32" if name == "SCALE" else "i32")
        if name in ALIGNED:
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    k = triton.compile(source(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                       target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    return get_sass(k.asm["cubin"]), {"triton": triton.__version__}
