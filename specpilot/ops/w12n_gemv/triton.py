"""Fused W12N decode + GEMV for decode steps (M = 1..16), the FP8-view GEMV (A plane only), and the decode to
bf16 that larger batches multiply with cuBLAS (`w12n_decode`: the GEMV's walk, storing each tile).

Each program owns BLOCK_N output rows and walks K segment by segment, BLOCK_K weights at a time (BLOCK_K
divides the segment, so a tile never straddles two segments and needs one XE byte per row). A tile is read in
words of 4 weights: A as int32, B as int16 (4 nibbles), bf16 x as int64, so every load, the decode and the FMAs
share one register layout (no shared-memory conversion). The decode rebuilds every weight's fp32 bit pattern
(the exact bf16 value, widened) in registers; each activation row m keeps its own fp32 partial sums, one per
(row, word) lane, updated by one fused multiply-add per weight; they are reduced once, after the K loop.
Decoded weights never go back to memory. The decode has two formulations with the same bits, picked by the
constexpr USE_ASM: PTX byte ops (prmt / lop3 on 16-bit lanes, one A word per inline-asm instance) on a GPU,
plain tl integer ops under the interpreter, which cannot run inline asm; the FP8 view likewise uses the
hardware e4m3 -> f16 convert or integer ops (README.md: scheme and SASS counts). Verbatim segments
(XE == 255) are rare: a uniform branch loads that tile's bf16 words from the pool at
rvb[row] + (number of verbatim segments already passed in this row), a per-row counter kept in registers.

Determinism and batch invariance: no atomics, no split-K. Row m's partial sums go through the same elementwise
fma chain (tiles in K order, weights 4w+0..3 in order) for every M, and the final reduction is a fixed pairwise
tree written out with split/add, so neither depends on the register layout the compiler picks: row m of an
M-row call equals the M = 1 call on that row bitwise, by construction.
"""

import os

import torch
import triton
import triton.language as tl

from specpilot.weights.w12n import VERBATIM, W12NTensor

MAX_M = 16
assert VERBATIM == 255  # the kernel compares XE against the literal 255

# One instance decodes one A word and one B half-word: 4 consecutive weights. $4 = their A bytes, $5 = their B
# nibbles (weight i at bits 4i+3..4i), $6 = XE<<7 | XE<<23, $7 = base<<7 | base<<23 (16-bit-lane exponent
# offsets); $0..$3 = the fp32 bits of weights 0..3. Weights are built two at a time in 16-bit bf16 lanes
# (lanes = weights 0 and 2, 1 and 3):
#   u  = prmt: lane = A byte << 8 | a B byte holding the lane's nibble in its high half (s c m at 15..8)
#   z  = (a & 0x78787878) + 0x78787878: bit 7 of byte r is set iff code_r != 0 (no carry between bytes)
#   k  = prmt sign-replicate of z's bytes: 0xFFFF lanes where code != 0; e = k ? base : XE (lop3 select)
#   q  = ((u >> 4) & 0x07FF07FF) + e: code+base (or XE) at 14..7, m6..m0 at 6..0; lanes never carry (<= 0x7F7F)
#   q  = lop3 sign bits 15/31 from u; fp32 = lane << 16 (weights 0, 1) or lane & 0xFFFF0000 (weights 2, 3)
_W12N_ASM: tl.constexpr = tl.constexpr("""{
.reg .b32 b, b4, u02, u13, z, k02, k13, e02, e13, q02, q13;
cvt.u32.u16 b, $5;
shl.b32 b4, b, 4;
prmt.b32 u02, $4, b4, 0x2504;
prmt.b32 u13, $4, b, 0x3514;
and.b32 z, $4, 0x78787878;
add.u32 z, z, 0x78787878;
prmt.b32 k02, z, 0, 0xAA88;
prmt.b32 k13, z, 0, 0xBB99;
lop3.b32 e02, k02, $7, $6, 0xCA;
lop3.b32 e13, k13, $7, $6, 0xCA;
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


_FP8_ASM: tl.constexpr = tl.constexpr("""{
.reg .b16 lo, hi, f0, f1, f2, f3;
.reg .b32 h01, h23;
mov.b32 {lo, hi}, $4;
cvt.rn.f16x2.e4m3x2 h01, lo;
cvt.rn.f16x2.e4m3x2 h23, hi;
mov.b32 {f0, f1}, h01;
mov.b32 {f2, f3}, h23;
cvt.f32.f16 $0, f0;
cvt.f32.f16 $1, f1;
cvt.f32.f16 $2, f2;
cvt.f32.f16 $3, f3;
}""")


def use_asm(device: torch.device) -> bool:
    """PTX decode on a CUDA device; the pure-tl decode (same bits) under the Triton interpreter."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def _w12n_decode(a, b, xe, base, USE_ASM: tl.constexpr):
    """A words a [BN, W] (uint32: 4 A bytes), B half-words b [BN, W] (uint16: 4 nibbles), segment XE xe [BN, 1]
    (uint32) -> the exact weights 4w+i of the tile (i = 0..3) as 4 fp32 [BN, W] (bf16 widened: bits << 16).
    base: the tensor's base exponent."""
    if USE_ASM:
        lanes = tl.zeros(a.shape, tl.uint32)
        return tl.inline_asm_elementwise(
            _W12N_ASM, "=r,=r,=r,=r,r,h,r,r",
            [a, b, lanes + ((xe << 7) | (xe << 23)), lanes + ((base << 7) | (base << 23))],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        return (_w12n_weight(a, b, xe, base, 0), _w12n_weight(a, b, xe, base, 1),
                _w12n_weight(a, b, xe, base, 2), _w12n_weight(a, b, xe, base, 3))


@triton.jit
def _w12n_weight(a, b, xe, base, i: tl.constexpr):
    """Pure-tl decode of weight i of each word: sign<<31 | exponent<<23 | m6..m4<<20 | m3..m0<<16, exponent =
    base + code (code != 0) or XE."""
    a = (a >> (8 * i)) & 0xFF
    nib = (b.to(tl.uint32) >> (4 * i)) & 0xF
    exp23 = tl.where((a & 0x78) == 0, xe << 23, base.to(tl.uint32) << 23)
    bits = ((a & 0x80) << 24) | (((a & 0x7F) << 20) + exp23) | (nib << 16)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _fp8_view(a, USE_ASM: tl.constexpr):
    """A words a [BN, W] uint32 -> the E4M3fn values of bytes 0..3 as 4 fp32 [BN, W] (exact, subnormals
    included)."""
    if USE_ASM:  # hardware cvt e4m3x2 -> f16x2 (1 per 2 weights, low byte -> low half), then f16 -> f32
        return tl.inline_asm_elementwise(_FP8_ASM, "=r,=r,=r,=r,r", [a], is_pure=True, pack=1,
                                         dtype=(tl.float32, tl.float32, tl.float32, tl.float32))
    else:  # the interpreter runs no inline asm: the same bits with integer ops
        return _fp8_byte(a, 0), _fp8_byte(a, 1), _fp8_byte(a, 2), _fp8_byte(a, 3)


@triton.jit
def _fp8_byte(a, i: tl.constexpr):
    a = (a >> (8 * i)) & 0xFF
    sign = (a & 0x80) << 24
    normal = sign | (((a & 0x7F) << 20) + (120 << 23))  # 2^(code-7) * 1.m6m5m4
    sub = ((a & 7).to(tl.float32) * 0.001953125).to(tl.uint32, bitcast=True) | sign  # (m/8) * 2^-6
    return tl.where((a & 0x78) == 0, sub, normal).to(tl.float32, bitcast=True)


@triton.jit
def _store_rows(y_ptr, accs, rows, row_ok, stride_ym, scale, M: tl.constexpr, OUT_BF16: tl.constexpr):
    """y[m, rows] = scale * sum over W of accs[m] [BN, W]; OUT_BF16: y_ptr is the int16 view of a bf16 output and
    the value is rounded to nearest even with integer ops, bit-identical to torch's fp32 -> bf16 (subnormals,
    inf, NaN included). Why not `.to(tl.bfloat16)`: same result on a GPU, but the interpreter truncates instead."""
    for m in tl.static_range(M):
        y = _tree_sum(accs[m]) * scale
        if OUT_BF16:
            tl.store(y_ptr + m * stride_ym + rows, _bf16_bits(y), mask=row_ok)
        else:
            tl.store(y_ptr + m * stride_ym + rows, y, mask=row_ok)


@triton.jit
def _bf16_bits(y):
    """fp32 -> the int16 bit pattern of its bf16 rounding to nearest even (NaN -> torch's canonical quiet NaN)."""
    u = y.to(tl.uint32, bitcast=True)
    rne = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = tl.where((u & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, rne)
    return bits.to(tl.uint16).to(tl.int16, bitcast=True)


@triton.jit
def _w12n_gemv_kernel(x_ptr, a_ptr, b_ptr, xe_ptr, rvb_ptr, v_ptr, y_ptr, N, K, S, BASE,
                      stride_xm, stride_an, stride_bn, stride_xen, stride_ym,
                      M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SEGMENT: tl.constexpr,
                      EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, X_WORDS: tl.constexpr, OUT_BF16: tl.constexpr,
                      USE_ASM: tl.constexpr):
    # a_ptr / b_ptr / v_ptr: the A plane as int32 words, B as int16 words, the pool as int64 words (4 weights each)
    rows, row_ok, rows64, a_rows, b_rows, pool_row = _row_block(a_ptr, b_ptr, rvb_ptr, N, stride_an, stride_bn,
                                                                BLOCK_N, EVEN_N)
    words = tl.arange(0, BLOCK_K // 4)
    accs = (tl.zeros([BLOCK_N, BLOCK_K // 4], dtype=tl.float32),) * M
    for s in range(0, S):
        xe, is_v, any_v = _segment_xe(xe_ptr, rows64, stride_xen, s, row_ok)
        for kk in range(0, SEGMENT, BLOCK_K):
            k0 = s * SEGMENT + kk
            w = _decoded_tile(a_rows, b_rows, v_ptr, pool_row, xe, is_v, any_v, k0, kk, words, row_ok, BASE,
                              SEGMENT, EVEN_N, USE_ASM)
            accs = _accumulate(accs, w, x_ptr, stride_xm, k0 // 4 + words, K, M, EVEN_K, X_WORDS)
        pool_row += is_v.to(tl.int32)
    _store_rows(y_ptr, accs, rows, row_ok, stride_ym, 1.0, M, OUT_BF16)


@triton.jit
def _row_block(a_ptr, b_ptr, rvb_ptr, N, stride_an, stride_bn, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
    """This program's BLOCK_N rows: (rows, row_ok, rows as int64, A and B row pointers [BN, 1], pool_row: the pool
    row of each row's next verbatim segment, rvb[row], which the caller bumps after each verbatim segment)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    # EVEN_N (BLOCK_N divides N, every real projection): unmasked loads, so no register is zeroed before each
    row_ok = (rows < N) | EVEN_N
    rows64 = rows.to(tl.int64)
    pool_row = tl.load(rvb_ptr + rows, mask=row_ok, other=0)
    return (rows, row_ok, rows64, a_ptr + rows64[:, None] * stride_an, b_ptr + rows64[:, None] * stride_bn,
            pool_row)


@triton.jit
def _segment_xe(xe_ptr, rows64, stride_xen, s, row_ok):
    """Segment s's XE byte per row (uint32), whether the row's segment is verbatim, and whether any row's is."""
    xe = tl.load(xe_ptr + rows64 * stride_xen + s, mask=row_ok, other=0).to(tl.uint32)
    is_v = xe == 255
    return xe, is_v, tl.max(is_v.to(tl.int32), axis=0)


@triton.jit
def _decoded_tile(a_rows, b_rows, v_ptr, pool_row, xe, is_v, any_v, k0, kk, words, row_ok, BASE,
                  SEGMENT: tl.constexpr, EVEN_N: tl.constexpr, USE_ASM: tl.constexpr):
    """The exact weights of the tile at column k0 (offset kk in its segment) as 4 fp32 [BN, W] (weights 4w+0..3):
    the A/B decode, with the rows whose segment is verbatim (is_v) read from the pool at pool_row instead."""
    a = _row_load(a_rows + (k0 // 4 + words)[None, :], row_ok[:, None], EVEN_N)
    b = _row_load(b_rows + (k0 // 4 + words)[None, :], row_ok[:, None], EVEN_N)
    w = _w12n_decode(a.to(tl.uint32, bitcast=True), b.to(tl.uint16, bitcast=True), xe[:, None], BASE, USE_ASM)
    if any_v > 0:  # uniform, rare: the tile holds a verbatim segment of some row
        vw = tl.load(v_ptr + pool_row.to(tl.int64)[:, None] * (SEGMENT // 4) + (kk // 4 + words)[None, :],
                     mask=is_v[:, None] & row_ok[:, None], other=0)
        # the pool's bf16 bits widened by shifts: exact for subnormals too, which the interpreter's bf16 -> fp32
        # conversion mangles
        v = _bf16_words(vw)
        w = (tl.where(is_v[:, None], v[0], w[0]), tl.where(is_v[:, None], v[1], w[1]),
             tl.where(is_v[:, None], v[2], w[2]), tl.where(is_v[:, None], v[3], w[3]))
    return w


@triton.jit
def _row_load(ptrs, ok, EVEN_N: tl.constexpr):
    if EVEN_N:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=ok, other=0)


@triton.jit
def _bf16_words(v):
    """int64 [BN, W] words of 4 bf16 -> their 4 fp32 values (bits << 16), elements 4w+0..3."""
    v = v.to(tl.uint64, bitcast=True)
    lo = v.to(tl.uint32)
    hi = (v >> 32).to(tl.uint32)
    return ((lo << 16).to(tl.float32, bitcast=True), (lo & 0xFFFF0000).to(tl.float32, bitcast=True),
            (hi << 16).to(tl.float32, bitcast=True), (hi & 0xFFFF0000).to(tl.float32, bitcast=True))


@triton.jit
def _x_words(x_ptr, word, K, EVEN_K: tl.constexpr, X_WORDS: tl.constexpr):
    """x elements 4w+0..3 for word index w [BN, W] (every row reads the same addresses: the load then takes the
    tile's layout instead of a 1-D one converted through shared memory) -> 4 fp32 [BN, W]; columns >= K read 0.
    X_WORDS: x_ptr is an int64 view of bf16 x (K % 4 == 0), one load per 4 elements; else x is read per element."""
    if X_WORDS:
        if EVEN_K:
            return _bf16_words(tl.load(x_ptr + word))
        else:
            return _bf16_words(tl.load(x_ptr + word, mask=word < K // 4, other=0))
    else:  # padding columns: x reads 0 (the pad weights decode to finite values, never inf/NaN)
        return (tl.load(x_ptr + 4 * word, mask=4 * word < K, other=0.0).to(tl.float32),
                tl.load(x_ptr + 4 * word + 1, mask=4 * word + 1 < K, other=0.0).to(tl.float32),
                tl.load(x_ptr + 4 * word + 2, mask=4 * word + 2 < K, other=0.0).to(tl.float32),
                tl.load(x_ptr + 4 * word + 3, mask=4 * word + 3 < K, other=0.0).to(tl.float32))


@triton.jit
def _accumulate(accs, w, x_ptr, stride_xm, words, K, M: tl.constexpr, EVEN_K: tl.constexpr, X_WORDS: tl.constexpr):
    """accs[m] [BN, W] += x[m, 4w+i] * w[i] for i = 0..3, one fused multiply-add per weight in a fixed order:
    the same elementwise chain for every m and M, whatever the layout (batch invariance)."""
    offs = tl.broadcast_to(words[None, :], w[0].shape)
    out = ()
    for m in tl.static_range(M):
        x = _x_words(x_ptr + m * stride_xm, offs, K, EVEN_K, X_WORDS)
        acc = accs[m]
        for i in tl.static_range(4):
            acc = tl.fma(w[i], x[i], acc)
        out = out + (acc,)
    return out


@triton.jit
def _tree_sum(acc):
    """[BN, W] -> [BN]: adjacent pairs added, halving W until 1: an order fixed by the code, not by the layout."""
    for _ in tl.static_range(16):
        if acc.shape[1] > 1:
            lo, hi = tl.split(acc.reshape([acc.shape[0], acc.shape[1] // 2, 2]))
            acc = lo + hi
    return acc.reshape([acc.shape[0]])


@triton.jit
def _w12n_decode_kernel(a_ptr, b_ptr, xe_ptr, rvb_ptr, v_ptr, w_ptr, N, S, BASE,
                        stride_an, stride_bn, stride_xen, stride_wn,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SEGMENT: tl.constexpr, EVEN_N: tl.constexpr,
                        USE_ASM: tl.constexpr):
    # the GEMV's walk over a row block, storing each decoded tile instead of multiplying it; w_ptr: the bf16
    # output [N, padded K] as int64 words (4 weights each)
    rows, row_ok, rows64, a_rows, b_rows, pool_row = _row_block(a_ptr, b_ptr, rvb_ptr, N, stride_an, stride_bn,
                                                                BLOCK_N, EVEN_N)
    w_rows = w_ptr + rows64[:, None] * stride_wn
    words = tl.arange(0, BLOCK_K // 4)
    for s in range(0, S):
        xe, is_v, any_v = _segment_xe(xe_ptr, rows64, stride_xen, s, row_ok)
        for kk in range(0, SEGMENT, BLOCK_K):
            k0 = s * SEGMENT + kk
            w = _decoded_tile(a_rows, b_rows, v_ptr, pool_row, xe, is_v, any_v, k0, kk, words, row_ok, BASE,
                              SEGMENT, EVEN_N, USE_ASM)
            ptrs = w_rows + (k0 // 4 + words)[None, :]
            if EVEN_N:
                tl.store(ptrs, _bf16x4_word(w))
            else:
                tl.store(ptrs, _bf16x4_word(w), mask=row_ok[:, None])
        pool_row += is_v.to(tl.int32)


@triton.jit
def _bf16x4_word(w):
    """4 fp32 [BN, W] holding exact bf16 values (low 16 bits zero) -> int64 words of the 4 bf16, element 4w+i in
    bits 16i..16i+15 (the inverse of _bf16_words)."""
    lo = (w[0].to(tl.uint32, bitcast=True) >> 16) | (w[1].to(tl.uint32, bitcast=True) & 0xFFFF0000)
    hi = (w[2].to(tl.uint32, bitcast=True) >> 16) | (w[3].to(tl.uint32, bitcast=True) & 0xFFFF0000)
    return (lo.to(tl.uint64) | (hi.to(tl.uint64) << 32)).to(tl.int64, bitcast=True)


@triton.jit
def _fp8_gemv_kernel(x_ptr, a_ptr, y_ptr, N, K, KP, SCALE,
                     stride_xm, stride_an, stride_ym,
                     M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, X_WORDS: tl.constexpr, OUT_BF16: tl.constexpr,
                     USE_ASM: tl.constexpr, PREFETCH: tl.constexpr):
    # a_ptr: the A plane as int32 words (4 weights each)
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = (rows < N) | EVEN_N
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * stride_an
    words = tl.arange(0, BLOCK_K // 4)
    accs = (tl.zeros([BLOCK_N, BLOCK_K // 4], dtype=tl.float32),) * M
    # KP is a multiple of BLOCK_K: A loads need no column mask
    if PREFETCH:  # the next tile's load is issued before this tile's math: two tiles in flight per program
        a = _row_load(a_rows + words[None, :], row_ok[:, None], EVEN_N)
        for k0 in range(0, KP - BLOCK_K, BLOCK_K):
            nxt = _row_load(a_rows + ((k0 + BLOCK_K) // 4 + words)[None, :], row_ok[:, None], EVEN_N)
            accs = _fp8_tile(accs, a, x_ptr, stride_xm, k0 // 4 + words, K, M, EVEN_K, X_WORDS, USE_ASM)
            a = nxt
        accs = _fp8_tile(accs, a, x_ptr, stride_xm, (KP - BLOCK_K) // 4 + words, K, M, EVEN_K, X_WORDS, USE_ASM)
    else:
        for k0 in range(0, KP, BLOCK_K):
            a = _row_load(a_rows + (k0 // 4 + words)[None, :], row_ok[:, None], EVEN_N)
            accs = _fp8_tile(accs, a, x_ptr, stride_xm, k0 // 4 + words, K, M, EVEN_K, X_WORDS, USE_ASM)
    # the view's scale 2^(base-120) is a power of two: applied once at the end, the sums round exactly as if
    # every weight carried it (barring fp32 overflow/underflow of the partial sums)
    _store_rows(y_ptr, accs, rows, row_ok, stride_ym, SCALE, M, OUT_BF16)


@triton.jit
def _fp8_tile(accs, a, x_ptr, stride_xm, words, K, M: tl.constexpr, EVEN_K: tl.constexpr, X_WORDS: tl.constexpr,
              USE_ASM: tl.constexpr):
    return _accumulate(accs, _fp8_view(a.to(tl.uint32, bitcast=True), USE_ASM), x_ptr, stride_xm, words, K, M,
                       EVEN_K, X_WORDS)


def default_block_k(segment: int, cap: int = 512) -> int:
    """The largest power of two that divides the segment, at most cap (the segment itself for 128/256/512)."""
    return min(segment & -segment, cap)


def _out(y: torch.Tensor) -> torch.Tensor:
    """The buffer the kernel stores into: bf16 outputs as their int16 bit patterns (see _store_rows)."""
    return y.view(torch.int16) if y.dtype == torch.bfloat16 else y


def _x_view(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """What the kernels read x through: an int64 view (4 bf16 per load) when x is bf16 with K % 4 == 0 and
    8-byte aligned rows, else x itself (read element by element)."""
    ok = x.dtype == torch.bfloat16 and x.shape[1] % 4 == 0 and x.stride(0) % 4 == 0 and x.data_ptr() % 8 == 0
    return (x.view(torch.int64), True) if ok else (x, False)


def supports(x: torch.Tensor, t: W12NTensor) -> bool:
    """The FMA GEMV's default launch takes x fp32 / bf16 [M <= MAX_M, K] with a dense last dim, and a segment
    holding whole 4-weight words (its largest power-of-two factor >= 4: every segment encode_best searches)."""
    return (x.dim() == 2 and 1 <= x.shape[0] <= MAX_M and x.dtype in (torch.float32, torch.bfloat16)
            and x.stride(1) == 1 and decode_supports(t))


def decode_supports(t: W12NTensor) -> bool:
    """w12n_decode's default launch takes segments of whole 4-weight words (see supports)."""
    return default_block_k(t.segment) >= 4


def fp8_supports(x: torch.Tensor, t: W12NTensor) -> bool:
    """fp8_gemv's default launch takes x as supports says and a padded K of whole 4-weight words."""
    return (x.dim() == 2 and 1 <= x.shape[0] <= MAX_M and x.dtype in (torch.float32, torch.bfloat16)
            and x.stride(1) == 1 and fp8_launch(t, x.shape[0])["block_k"] >= 4)


def _check(x: torch.Tensor, t: W12NTensor, block_n: int, block_k: int, span: str = "segment") -> None:
    if x.dim() != 2 or x.shape[1] != t.k or not 1 <= x.shape[0] <= MAX_M:
        raise ValueError(f"x must be [M <= {MAX_M}, K={t.k}] for a {t.n}x{t.k} W12N weight, got {list(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16) or x.stride(1) != 1:
        raise ValueError(f"x must be fp32 or bf16 with a dense last dim, got {x.dtype} strides {x.stride()}")
    _check_tiles(t, block_n, block_k, span)
    for name in ("a", "b", "xe"):
        if getattr(t, name).stride(1) != 1:
            raise ValueError(f"W12N plane {name!r} must have dense rows")
    if t.a.device != x.device:
        raise ValueError(f"x is on {x.device} but the W12N planes are on {t.a.device}")


def _check_tiles(t: W12NTensor, block_n: int, block_k: int, span: str = "segment") -> None:
    # the kernels read 4 weights per A word / B half-word, so a tile is a whole number of words; a tile lies in one
    # segment (span "segment": one XE byte per row) or, for the FP8 view, which reads no XE, in the padded K
    width = t.segment if span == "segment" else t.padded_k
    if block_k < 4 or block_k & (block_k - 1) or width % block_k:
        raise ValueError(f"block_k must be a power of two >= 4 dividing the {span} {width}, got {block_k}")
    if block_n < 1 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two, got {block_n}")


def w12n_gemv(x: torch.Tensor, t: W12NTensor, *, block_n: int = 8, block_k: int | None = None,
              num_warps: int = 4, asm: bool | None = None) -> torch.Tensor:
    """Same contract as w12n_gemv_ref: x [M <= 16, K] fp32/bf16, t = W12N of W [N, K] -> y [M, N] in x.dtype.

    block_k (default: the segment, capped at 512) must be a power of two >= 4 dividing t.segment. asm (default:
    use_asm(x.device)) picks the PTX decode or the pure-tl one; both give the same bits.
    """
    block_k = default_block_k(t.segment) if block_k is None else block_k
    _check(x, t, block_n, block_k)
    M = x.shape[0]
    y = torch.empty(M, t.n, dtype=x.dtype, device=x.device)
    pool = t.verbatim if t.verbatim.numel() else t.verbatim.new_zeros(1, t.segment)  # never read when V = 0
    a, b, pool, (xw, x_words) = t.a.view(torch.int32), t.b.view(torch.int16), pool.view(torch.int64), _x_view(x)
    _w12n_gemv_kernel[(triton.cdiv(t.n, block_n),)](
        xw, a, b, t.xe, t.rvb, pool, _out(y), t.n, t.k, t.padded_k // t.segment, t.base,
        xw.stride(0), a.stride(0), b.stride(0), t.xe.stride(0), y.stride(0),
        M=M, BLOCK_N=block_n, BLOCK_K=block_k, SEGMENT=t.segment, EVEN_K=t.k == t.padded_k,
        EVEN_N=t.n % block_n == 0, X_WORDS=x_words,
        OUT_BF16=y.dtype == torch.bfloat16, USE_ASM=use_asm(x.device) if asm is None else asm, num_warps=num_warps)
    return y


def fp8_launch(t: W12NTensor, m: int) -> dict:
    """The FP8 view's default launch: 8 rows per program on 4 warps, a one-tile prefetch at M = 5..8, 4 rows without
    it above 8. block_k, which fixes each lane's order of sums, depends on the shape alone (the padded K's largest
    power-of-two factor, at most 1024), so row m of an M-row call equals the M = 1 call; rows per program, warps
    and the prefetch change no bit. The H200 sweeps behind it: docs/decisions/2026-11-30-w12n-fp8-view-launch.md."""
    return {"block_n": 4 if m > 8 else 8, "block_k": min(1024, t.padded_k & -t.padded_k), "num_warps": 4,
            "prefetch": 4 < m <= 8}


def fp8_gemv(x: torch.Tensor, t: W12NTensor, *, block_n: int | None = None, block_k: int | None = None,
             num_warps: int | None = None, prefetch: bool | None = None, asm: bool | None = None) -> torch.Tensor:
    """Same contract as fp8_gemv_ref: y = x @ (fp8_view(t) * scale).T, reading only the A plane.

    The view needs no XE byte, so block_k may be any power of two >= 4 that divides the padded K. Unset
    arguments come from fp8_launch. prefetch: load each tile one iteration ahead (two tiles in flight)."""
    given = {"block_n": block_n, "block_k": block_k, "num_warps": num_warps, "prefetch": prefetch}
    launch = fp8_launch(t, x.shape[0] if x.dim() == 2 else 1) | {k: v for k, v in given.items() if v is not None}
    block_n, block_k, num_warps, prefetch = (launch[k] for k in given)
    _check(x, t, block_n, block_k, span="padded K")  # a wrong x is reported here, not by fp8_launch
    M = x.shape[0]
    y = torch.empty(M, t.n, dtype=x.dtype, device=x.device)
    a, (xw, x_words) = t.a.view(torch.int32), _x_view(x)
    _fp8_gemv_kernel[(triton.cdiv(t.n, block_n),)](
        xw, a, _out(y), t.n, t.k, t.padded_k, 2.0 ** (t.base - 120),
        xw.stride(0), a.stride(0), y.stride(0),
        M=M, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=t.k == t.padded_k, EVEN_N=t.n % block_n == 0,
        X_WORDS=x_words, OUT_BF16=y.dtype == torch.bfloat16, USE_ASM=use_asm(x.device) if asm is None else asm,
        PREFETCH=prefetch, num_warps=num_warps)
    return y


def w12n_decode(t: W12NTensor, *, block_n: int = 8, block_k: int | None = None, num_warps: int = 4,
                asm: bool | None = None) -> torch.Tensor:
    """t = W12N of W [N, K] -> W as bf16 [N, K] on the planes' device, bit-identical to weights.w12n.decode(t):
    one kernel, no host sync (it can be graph-captured). The result is a column slice of a [N, padded K] buffer
    when K is not a multiple of the segment (row stride padded K: F.linear takes it as it is)."""
    block_k = default_block_k(t.segment) if block_k is None else block_k
    _check_tiles(t, block_n, block_k)
    out = torch.empty(t.n, t.padded_k, dtype=torch.bfloat16, device=t.a.device)
    pool = t.verbatim if t.verbatim.numel() else t.verbatim.new_zeros(1, t.segment)  # never read when V = 0
    a, b, pool, w = t.a.view(torch.int32), t.b.view(torch.int16), pool.view(torch.int64), out.view(torch.int64)
    _w12n_decode_kernel[(triton.cdiv(t.n, block_n),)](
        a, b, t.xe, t.rvb, pool, w, t.n, t.padded_k // t.segment, t.base,
        a.stride(0), b.stride(0), t.xe.stride(0), w.stride(0),
        BLOCK_N=block_n, BLOCK_K=block_k, SEGMENT=t.segment, EVEN_N=t.n % block_n == 0,
        USE_ASM=use_asm(t.a.device) if asm is None else asm, num_warps=num_warps)
    return out[:, :t.k]
