"""A tiny PTX interpreter for the inline-asm blocks of the W12N kernels, so their text is tested on a CPU.

Covers the instructions those blocks use (shl, shr, and, add, prmt incl. sign-replicate, lop3, mov.b64 / b32
unpack, cvt.u32.u16, cvt.rn.f16x2.e4m3x2, cvt.f32.f16, mma.sync m16n8k16 bf16 -> f32). Registers hold int64
tensors of 32-bit patterns; for mma the last dimension is the warp's 32 lanes (the instruction is
warp-collective). Products are summed in float64 and rounded to fp32
once: not the tensor cores' rounding, exact whenever the sum is (one-hot rows).
"""

from __future__ import annotations

import re

import torch

M32 = 0xFFFFFFFF


def run(asm: str, operands: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Executes asm with $N bound to operands[N] (int64 bit patterns); returns every $N it wrote."""
    regs: dict[str, torch.Tensor] = {f"${k}": v for k, v in operands.items()}
    for line in asm.replace("{\n", "\n").splitlines():
        line = line.strip().rstrip(";")
        if not line or line in ("{", "}") or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        args = [a.strip() for a in re.split(r",(?![^{]*})", rest)]
        _step(op, args, regs)
    return {int(k[1:]): v for k, v in regs.items() if k.startswith("$") and int(k[1:]) not in operands}


def _val(tok: str, regs: dict) -> torch.Tensor | int:
    return regs[tok] if tok in regs else int(tok, 0)


def _step(op: str, args: list[str], regs: dict) -> None:
    v = [_val(a, regs) for a in args[1:]] if not op.startswith(("mma", "mov.b")) else None
    if op == "cvt.u32.u16":
        regs[args[0]] = v[0] & 0xFFFF
    elif op == "cvt.rn.f16x2.e4m3x2":  # low byte -> low half
        e4m3 = torch.stack([v[0] & 0xFF, (v[0] >> 8) & 0xFF], -1).to(torch.uint8).view(torch.float8_e4m3fn)
        halves = e4m3.to(torch.float16).view(torch.int16).long() & 0xFFFF
        regs[args[0]] = halves[..., 0] | (halves[..., 1] << 16)
    elif op == "cvt.f32.f16":
        half = (v[0] & 0xFFFF).to(torch.int16).view(torch.float16)
        regs[args[0]] = half.float().view(torch.int32).long() & M32
    elif op == "mov.b32":  # {lo, hi} = 32-bit register, as two 16-bit halves
        lo, hi = args[0].strip("{}").split(",")
        src = regs[args[1]]
        regs[lo.strip()], regs[hi.strip()] = src & 0xFFFF, (src >> 16) & 0xFFFF
    elif op == "shl.b32":
        regs[args[0]] = (v[0] << v[1]) & M32
    elif op == "shr.u32":
        regs[args[0]] = (v[0] & M32) >> v[1]
    elif op == "and.b32":
        regs[args[0]] = v[0] & v[1]
    elif op == "add.u32":
        regs[args[0]] = (v[0] + v[1]) & M32
    elif op == "prmt.b32":
        regs[args[0]] = _prmt(v[0], v[1], v[2])
    elif op == "lop3.b32":
        regs[args[0]] = _lop3(v[0], v[1], v[2], v[3])
    elif op == "mov.b64":
        lo, hi = args[0].strip("{}").split(",")
        src = regs[args[1]]
        regs[lo.strip()], regs[hi.strip()] = src & M32, (src >> 32) & M32
    elif op.startswith("mma.sync.aligned.m16n8k16"):
        d, a, b, c = ([r.strip() for r in group.strip("{}").split(",")] for group in args)
        for name, value in zip(d, _mma(*([regs[r] for r in names] for names in (a, b, c)))):
            regs[name] = value
    else:
        raise NotImplementedError(op)


def _bytes(x) -> list:
    return [(x >> (8 * i)) & 0xFF for i in range(4)]


def _prmt(a, b, sel: int):
    pool = _bytes(a) + _bytes(b if not isinstance(b, int) else torch.zeros_like(a) + b)
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = pool[nib & 7]
        if nib & 8:  # sign-replicate mode
            byte = torch.where((byte & 0x80) != 0, 0xFF, 0)
        out = out | (byte << (8 * i))
    return out


def _lop3(a, b, c, lut: int):
    a, b, c = (x if not isinstance(x, int) else x for x in (a, b, c))
    out = 0
    for idx in range(8):
        if lut >> idx & 1:
            term = ((a if idx & 4 else ~a) & (b if idx & 2 else ~b) & (c if idx & 1 else ~c)) & M32
            out = out | term
    return out


def _bf16(bits: torch.Tensor) -> torch.Tensor:
    return ((bits & 0xFFFF) << 16).to(torch.int32).view(torch.float32).double()


def _mma(a: list, b: list, c: list) -> list:
    """m16n8k16, row.col, bf16 inputs, f32 accumulators; registers [..., 32 lanes]."""
    lane = torch.arange(32)
    g, t = lane // 4, lane % 4
    shape = a[0].shape[:-1]
    A = torch.zeros(*shape, 16, 16, dtype=torch.float64)
    B = torch.zeros(*shape, 16, 8, dtype=torch.float64)
    C = torch.zeros(*shape, 16, 8, dtype=torch.float64)
    for reg, (dr, dk) in zip(a, [(0, 0), (8, 0), (0, 8), (8, 8)]):
        A[..., g + dr, 2 * t + dk] = _bf16(reg)
        A[..., g + dr, 2 * t + dk + 1] = _bf16(reg >> 16)
    for reg, dk in zip(b, [0, 8]):
        B[..., 2 * t + dk, g] = _bf16(reg)
        B[..., 2 * t + dk + 1, g] = _bf16(reg >> 16)
    for reg, (dr, dn) in zip(c, [(0, 0), (0, 1), (8, 0), (8, 1)]):
        C[..., g + dr, 2 * t + dn] = reg.to(torch.int32).view(torch.float32).double()
    D = (A @ B + C).float()
    return [D[..., g + dr, 2 * t + dn].view(torch.int32).long() & M32 for dr, dn in [(0, 0), (0, 1), (8, 0), (8, 1)]]
