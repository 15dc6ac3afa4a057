"""Fused W12N decode + GEMV for decode steps (M = 1..16), and the FP8-view GEMV (A plane only).

Each program owns BLOCK_N output rows and walks K segment by segment, BLOCK_K weights at a time (BLOCK_K
divides the segment, so a tile never straddles two segments and needs one XE byte per row). Per tile it loads
the A bytes and the B nibble bytes, rebuilds every weight's fp32 bit pattern in registers with integer ops
(the exact bf16 value, widened), and then, for each activation row m, reduces x[m] * w over the tile into an
fp32 [BLOCK_M, BLOCK_N] accumulator. Decoded weights never go back to memory. The decode has two formulations
with the same bits, picked by the constexpr USE_ASM: PTX byte ops (prmt / lop3 on 16-bit lanes, 4 weights per
inline-asm instance) on a GPU, plain tl integer ops under the interpreter, which cannot run inline asm; the FP8
view likewise uses the hardware e4m3 -> f16 convert or integer ops (README.md: scheme and SASS counts). Verbatim segments
(XE == 255) are rare: a uniform branch loads that tile's bf16 words from the pool at
rvb[row] + (number of verbatim segments already passed in this row), a per-row counter kept in registers.

Determinism and batch invariance: no atomics, no split-K; the [BLOCK_N, BLOCK_K] product of row m and its
sum over K have the same shape (hence layout and reduction tree) for every M, and partial sums are added
tile by tile in K order, so row m of an M-row call equals the M = 1 call on that row bitwise. (On a GPU this
rests on the compiler picking the same layout for that tile at every M; CI on the GPU must check it per
config, see README.md.)
"""

import os

import torch
import triton
import triton.language as tl

from specpilot.weights.w12n import VERBATIM, W12NTensor

MAX_M = 16
assert VERBATIM == 255  # the kernel compares XE against the literal 255

# One instance decodes 4 consecutive weights: $4 = their A bytes, $5 = their B bytes duplicated (b_j b_j b_j+1
# b_j+1), $6 = XE<<7 | XE<<23, $10 = base<<7 | base<<23 (the 16-bit-lane exponent offsets); $0..$3 = the fp32
# bits of weights 0..3. Weights are built two at a time in 16-bit bf16 lanes (lanes = weights 0 and 2, 1 and 3):
#   u  = prmt: lane = A byte << 8 | a B byte holding the lane's nibble in its high half (s c m at 15..8)
#   z  = (a & 0x78787878) + 0x78787878: bit 7 of byte r is set iff code_r != 0 (no carry between bytes)
#   k  = prmt sign-replicate of z's bytes: 0xFFFF lanes where code != 0; e = k ? base : XE (lop3 select)
#   q  = ((u >> 4) & 0x07FF07FF) + e: code+base (or XE) at 14..7, m6..m0 at 6..0; lanes never carry (<= 0x7F7F)
#   q  = lop3 sign bits 15/31 from u; fp32 = lane << 16 (weights 0, 1) or lane & 0xFFFF0000 (weights 2, 3)
_W12N_ASM: tl.constexpr = tl.constexpr("""{
.reg .b32 b4, u02, u13, z, k02, k13, e02, e13, q02, q13;
shl.b32 b4, $5, 4;
prmt.b32 u02, $4, b4, 0x2604;
prmt.b32 u13, $4, $5, 0x3715;
and.b32 z, $4, 0x78787878;
add.u32 z, z, 0x78787878;
prmt.b32 k02, z, 0, 0xAA88;
prmt.b32 k13, z, 0, 0xBB99;
lop3.b32 e02, k02, $10, $6, 0xCA;
lop3.b32 e13, k13, $10, $6, 0xCA;
shr.u32 q02, u02, 4;
shr.u32 q13, u13, 4;
and.b32 q02, q02, 0x07FF07FF;
and.b32 q13, q13, 0x07FF07FF;
add.u32 q02, q02, e02;
add.u32 q13, q13, e13;
lop3.b32 q02, q02, u02, 0x80008000, 0xD8;
lop3.b32 q13, q13, u13, 0x80008000, 0xD8;
shl.b32 $0, q02, 16;
shl.b32 $1, q13, 16;
and.b32 $2, q02, 0xFFFF0000;
and.b32 $3, q13, 0xFFFF0000;
}""")


def use_asm(device: torch.device) -> bool:
    """PTX decode on a CUDA device; the pure-tl decode (same bits) under the Triton interpreter."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def _w12n_decode(a, bb, xe, base, USE_ASM: tl.constexpr):
    """A bytes a [BN, BK], B bytes bb [BN, BK/2] (uint8), segment XE xe [BN, 1] (uint32) -> the exact weights as
    fp32 [BN, BK] (a bf16 widened: its bits << 16). base: the tensor's base exponent."""
    if USE_ASM:
        lanes = tl.zeros(a.shape, tl.uint32)
        return tl.inline_asm_elementwise(
            _W12N_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r",
            [a, tl.join(bb, bb).reshape(a.shape), lanes + ((xe << 7) | (xe << 23)), lanes + ((base << 7) | (base << 23))],
            dtype=tl.float32, is_pure=True, pack=4)
    else:
        a = a.to(tl.uint32)
        nib = tl.join(bb & 0xF, bb >> 4).reshape(a.shape).to(tl.uint32)
        # fp32 bits: sign<<31 | exponent<<23 | m6..m4<<20 | m3..m0<<16, exponent = base + code (code != 0) or XE
        exp23 = tl.where((a & 0x78) == 0, xe << 23, base.to(tl.uint32) << 23)
        bits = ((a & 0x80) << 24) | (((a & 0x7F) << 20) + exp23) | (nib << 16)
        return bits.to(tl.float32, bitcast=True)


@triton.jit
def _fp8_view(a, USE_ASM: tl.constexpr):
    """A bytes a [BN, BK] uint8 -> the E4M3fn values they hold, fp32 (exact, subnormals included)."""
    if USE_ASM:  # hardware cvt e4m3x2 -> f16x2 (1 per 2 weights), then f16 -> f32
        return a.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:  # the interpreter has no usable uint8 -> fp8 bitcast: the same bits with integer ops
        a = a.to(tl.uint32)
        sign = (a & 0x80) << 24
        normal = sign | (((a & 0x7F) << 20) + (120 << 23))  # 2^(code-7) * 1.m6m5m4
        sub = ((a & 7).to(tl.float32) * 0.001953125).to(tl.uint32, bitcast=True) | sign  # (m/8) * 2^-6
        return tl.where((a & 0x78) == 0, sub, normal).to(tl.float32, bitcast=True)


@triton.jit
def _store_rows(y_ptr, acc, m_ids, rows, mask, stride_ym, OUT_BF16: tl.constexpr):
    """Stores the fp32 [BLOCK_M, BLOCK_N] result; OUT_BF16: y_ptr is the int16 view of a bf16 output and the
    value is rounded to nearest even with integer ops, bit-identical to torch's fp32 -> bf16 (subnormals, inf,
    NaN included). Why not `.to(tl.bfloat16)`: same result on a GPU, but the interpreter truncates instead."""
    y_ptrs = y_ptr + m_ids[:, None] * stride_ym + rows[None, :]
    if OUT_BF16:
        u = acc.to(tl.uint32, bitcast=True)
        rne = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        bits = tl.where((u & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, rne)  # NaN -> canonical quiet NaN, like torch
        tl.store(y_ptrs, bits.to(tl.uint16).to(tl.int16, bitcast=True), mask=mask)
    else:
        tl.store(y_ptrs, acc, mask=mask)


@triton.jit
def _w12n_gemv_kernel(x_ptr, a_ptr, b_ptr, xe_ptr, rvb_ptr, v_ptr, y_ptr, N, K, S, BASE,
                      stride_xm, stride_an, stride_bn, stride_xen, stride_ym,
                      M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SEGMENT: tl.constexpr, EVEN_K: tl.constexpr, OUT_BF16: tl.constexpr, USE_ASM: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows64 = rows.to(tl.int64)
    a_rows = a_ptr + rows64[:, None] * stride_an
    b_rows = b_ptr + rows64[:, None] * stride_bn
    cols0 = tl.arange(0, BLOCK_K)
    half0 = tl.arange(0, BLOCK_K // 2)
    m_ids = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # pool row of this row's next verbatim segment: rvb[row], bumped after each verbatim segment
    pool_row = tl.load(rvb_ptr + rows, mask=row_ok, other=0)
    for s in range(0, S):
        xe = tl.load(xe_ptr + rows64 * stride_xen + s, mask=row_ok, other=0).to(tl.uint32)
        is_v = xe == 255
        any_v = tl.max(is_v.to(tl.int32), axis=0)
        for kk in range(0, SEGMENT, BLOCK_K):
            k0 = s * SEGMENT + kk
            a = tl.load(a_rows + (k0 + cols0)[None, :], mask=row_ok[:, None], other=0)
            bb = tl.load(b_rows + (k0 // 2 + half0)[None, :], mask=row_ok[:, None], other=0)
            w = _w12n_decode(a, bb, xe[:, None], BASE, USE_ASM)
            if any_v > 0:  # uniform, rare: the tile holds a verbatim segment of some row
                vw = tl.load(v_ptr + pool_row.to(tl.int64)[:, None] * SEGMENT + (kk + cols0)[None, :],
                             mask=is_v[:, None] & row_ok[:, None], other=0)
                # the pool's bf16 bits (an int16 view) widened by a shift: exact for subnormals too, which the
                # interpreter's bf16 -> fp32 conversion mangles
                vw = (vw.to(tl.uint16).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
                w = tl.where(is_v[:, None], vw, w)
            acc = _accumulate(acc, w, x_ptr, stride_xm, k0, cols0, K, m_ids, M, EVEN_K)
        pool_row += is_v.to(tl.int32)
    _store_rows(y_ptr, acc, m_ids, rows, (m_ids[:, None] < M) & row_ok[None, :], stride_ym, OUT_BF16)


@triton.jit
def _accumulate(acc, w, x_ptr, stride_xm, k0, cols0, K, m_ids, M: tl.constexpr, EVEN_K: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] += x[m, k0:k0+BK] . w[n, :] for each row m < M: the same product and reduction
    shape for every m and M (batch invariance)."""
    for m in tl.static_range(M):
        # x loaded in the tile's shape (every row reads the same addresses): the load then takes the tile's
        # layout instead of a 1-D one converted through shared memory for every m (measured: -1.2 instr/weight)
        offs = tl.broadcast_to((k0 + cols0)[None, :], w.shape)
        if EVEN_K:
            x = tl.load(x_ptr + m * stride_xm + offs).to(tl.float32)
        else:  # padding columns: x reads 0 (the pad weights decode to finite values, never inf/NaN)
            x = tl.load(x_ptr + m * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
        part = tl.sum(w * x, axis=1)
        acc = tl.where(m_ids[:, None] == m, acc + part[None, :], acc)
    return acc


@triton.jit
def _fp8_gemv_kernel(x_ptr, a_ptr, y_ptr, N, K, KP, SCALE,
                     stride_xm, stride_an, stride_ym,
                     M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     EVEN_K: tl.constexpr, OUT_BF16: tl.constexpr, USE_ASM: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * stride_an
    cols0 = tl.arange(0, BLOCK_K)
    m_ids = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, KP, BLOCK_K):
        # KP is a multiple of BLOCK_K (it divides the segment): A loads need no column mask
        a = tl.load(a_rows + (k0 + cols0)[None, :], mask=row_ok[:, None], other=0)
        acc = _accumulate(acc, _fp8_view(a, USE_ASM), x_ptr, stride_xm, k0, cols0, K, m_ids, M, EVEN_K)
    # the view's scale 2^(base-120) is a power of two: applied once here, the sums round exactly as if every
    # weight carried it (barring fp32 overflow/underflow of the partial sums)
    _store_rows(y_ptr, acc * SCALE, m_ids, rows, (m_ids[:, None] < M) & row_ok[None, :], stride_ym, OUT_BF16)


def default_block_k(segment: int, cap: int = 512) -> int:
    """The largest power of two that divides the segment, at most cap (the segment itself for 128/256/512)."""
    return min(segment & -segment, cap)


def _out(y: torch.Tensor) -> torch.Tensor:
    """The buffer the kernel stores into: bf16 outputs as their int16 bit patterns (see _store_rows)."""
    return y.view(torch.int16) if y.dtype == torch.bfloat16 else y


def _check(x: torch.Tensor, t: W12NTensor, block_n: int, block_k: int) -> None:
    if x.dim() != 2 or x.shape[1] != t.k or not 1 <= x.shape[0] <= MAX_M:
        raise ValueError(f"x must be [M <= {MAX_M}, K={t.k}] for a {t.n}x{t.k} W12N weight, got {list(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16) or x.stride(1) != 1:
        raise ValueError(f"x must be fp32 or bf16 with a dense last dim, got {x.dtype} strides {x.stride()}")
    if block_k < 2 or block_k & (block_k - 1) or t.segment % block_k:
        raise ValueError(f"block_k must be a power of two >= 2 dividing the segment {t.segment}, got {block_k}")
    if block_n < 1 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two, got {block_n}")
    for name in ("a", "b", "xe"):
        if getattr(t, name).stride(1) != 1:
            raise ValueError(f"W12N plane {name!r} must have dense rows")
    if t.a.device != x.device:
        raise ValueError(f"x is on {x.device} but the W12N planes are on {t.a.device}")


def w12n_gemv(x: torch.Tensor, t: W12NTensor, *, block_n: int = 8, block_k: int | None = None,
              num_warps: int = 4, asm: bool | None = None) -> torch.Tensor:
    """Same contract as w12n_gemv_ref: x [M <= 16, K] fp32/bf16, t = W12N of W [N, K] -> y [M, N] in x.dtype.

    block_k (default: the segment, capped at 512) must be a power of two dividing t.segment. asm (default:
    use_asm(x.device)) picks the PTX decode or the pure-tl one; both give the same bits.
    """
    block_k = default_block_k(t.segment) if block_k is None else block_k
    _check(x, t, block_n, block_k)
    M = x.shape[0]
    y = torch.empty(M, t.n, dtype=x.dtype, device=x.device)
    pool = t.verbatim if t.verbatim.numel() else t.verbatim.new_zeros(1, t.segment)  # never read when V = 0
    pool = pool.view(torch.int16)
    _w12n_gemv_kernel[(triton.cdiv(t.n, block_n),)](
        x, t.a, t.b, t.xe, t.rvb, pool, _out(y), t.n, t.k, t.padded_k // t.segment, t.base,
        x.stride(0), t.a.stride(0), t.b.stride(0), t.xe.stride(0), y.stride(0),
        M=M, BLOCK_M=triton.next_power_of_2(M), BLOCK_N=block_n, BLOCK_K=block_k, SEGMENT=t.segment,
        EVEN_K=t.k == t.padded_k, OUT_BF16=y.dtype == torch.bfloat16, USE_ASM=use_asm(x.device) if asm is None else asm,
        num_warps=num_warps)
    return y


def fp8_gemv(x: torch.Tensor, t: W12NTensor, *, block_n: int = 8, block_k: int | None = None,
             num_warps: int = 4, asm: bool | None = None) -> torch.Tensor:
    """Same contract as fp8_gemv_ref: y = x @ (fp8_view(t) * scale).T, reading only the A plane."""
    block_k = default_block_k(t.segment) if block_k is None else block_k
    _check(x, t, block_n, block_k)
    M = x.shape[0]
    y = torch.empty(M, t.n, dtype=x.dtype, device=x.device)
    _fp8_gemv_kernel[(triton.cdiv(t.n, block_n),)](
        x, t.a, _out(y), t.n, t.k, t.padded_k, 2.0 ** (t.base - 120),
        x.stride(0), t.a.stride(0), y.stride(0),
        M=M, BLOCK_M=triton.next_power_of_2(M), BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=t.k == t.padded_k, OUT_BF16=y.dtype == torch.bfloat16, USE_ASM=use_asm(x.device) if asm is None else asm,
        num_warps=num_warps)
    return y

