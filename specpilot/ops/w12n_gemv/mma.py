"""Tensor-core W12N GEMV for M = 1..16 (Gluon): the planes decode in registers straight into mma fragments.

Each program owns 16 output rows (one m16n8k16 tile of W) and KS warps; warp w takes the 64-column chunks
w, w + KS, w + 2 KS, ... of K. Lane (g, t) = (lane // 4, lane % 4) reads rows g and g + 8 at columns
64 c + 16 t .. + 16 of chunk c: one 16-byte A load and one 8-byte B load per row, and the 16 x values of
activation row n = g (8 + g for the second n tile when M > 8) as 4 words of 4 bf16. Word j (4 weights) decodes
to two bf16 pairs, (w0, w2) and (w1, w3), with the fp32 path's PTX byte ops minus its last widening step; those
pairs ARE the A fragment of one mma (a0/a1: rows g/g + 8 at fragment columns 2t, 2t + 1; a2/a3 at 2t + 8, 2t + 9)
once the x word is permuted the same way ((x0, x2), (x1, x3) by two prmt). The dot product's columns are thus a
fixed permutation of K, the same for W and x, so nothing moves between lanes: no shared memory, no layout
conversion, one mma per 256 weights of a warp. Weights never go back to memory as bf16.

Lanes hold the fragment in a plain blocked layout [KS, 32, 4] (warp, lane, word j); one inline-asm instance per
thread (pack = 4 over j) runs the four warp-collective mmas of a chunk. After the K loop the KS partial tiles
are summed by one fixed-order reduction across warps.

Determinism and batch invariance: no atomics; the split of K is fixed by (K, KS), never by M. Activation rows
are mma columns, each computed on its own by the tensor cores, so row m of an M-row call equals the M = 1 call
bitwise (tests/gpu/test_kernels.py checks it on the GPU). The sums round differently from the FMA kernel's
(triton.py), which stays the reference formulation that runs under the interpreter.

Verbatim segments (XE == 255) are added after the K loop, so that loop is the same code with or without them
(docs/decisions/2026-11-30-w12n-verbatim-pass.md). A tensor that has any gets derived tables
(`verbatim_tables`, once per tensor on its device): its tile-major planes hold zeros in verbatim segments and the
loop reads an XE table with 0 there, so those weights decode to +0 and add nothing; then each program walks the
list of its block's segments that have a verbatim row, and the warps run the pool's bf16 words (zeros for the
rows whose segment is inline) through the same mmas. The sums round in a fixed order that M never changes.

SwiGLU (`w12n_swiglu_gemv`): for an MLP's packed [gate; up] matrix the kernel forms silu(gate) * up in its
epilogue, so no separate silu_mul kernel runs between the two projections of a decode step (a kernel that also
broke the chain of PDL launches). Its tile-major planes take the rows in another order (`glu_rows`): block b's
rows 0..7 are gate rows 8b..8b+7 and rows 8..15 the matching up rows, so lane (g, t) holds the gate (c0, c1) and
the up (c2, c3) of the same two outputs. Each is rounded to bf16 as the plain product would be, then
bf16(gate * sigmoid(gate) * up) in fp32, as the gated GEMVs form it (ops/gemv); M never changes a bit. Under
PDL this launch lets its dependents (the down GEMV) start after its K loop, the plain one at its start
(docs/decisions/2026-12-01-w12n-pdl-trigger.md).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from specpilot.ops.pdl import launch_kwargs, usable
from specpilot.weights.w12n import VERBATIM, W12NTensor

CHUNK = gl.constexpr(64)  # columns of K per warp and chunk: 4 lanes x 16
assert VERBATIM == 255  # the kernel compares XE against the literal 255


def _decode_chunk_asm() -> str:
    """pack = 4 over the lane's 4 words of one row: $8-$11 A words, $12-$13 the two B words (word j's nibbles in
    half j % 2 of B word j // 2), $14 = XE<<7 | XE<<23, $18 = base<<7 | base<<23 (16-bit-lane exponent offsets)
    -> $j = bf16 pair (w0, w2) of word j, $(4 + j) = (w1, w3) (low half first). triton.py's fp32 decode without
    its widening step:
      u  = prmt: lane = A byte << 8 | a B byte holding the lane's nibble in its high half (s c m at 15..8)
      z  = (a & 0x78787878) + 0x78787878: bit 7 of byte r is set iff code_r != 0 (no carry between bytes)
      k  = prmt sign-replicate of z's bytes: 0xFFFF lanes where code != 0; e = k ? base : XE (lop3 select)
      q  = ((u >> 4) & 0x07FF07FF) + e: code+base (or XE) at 14..7, m6..m0 at 6..0 (lanes never carry)
      out = q with u's sign bits 15 / 31 (lop3)"""
    lines = ["{", ".reg .b32 b4lo, b4hi, u02, u13, z, k02, k13, e02, e13, q02, q13;",
             "shl.b32 b4lo, $12, 4;", "shl.b32 b4hi, $13, 4;"]
    for j in range(4):
        a, b, b4 = f"${8 + j}", ("$12", "$13")[j // 2], ("b4lo", "b4hi")[j // 2]
        sel02, sel13 = ("0x2504", "0x3514") if j % 2 == 0 else ("0x2706", "0x3716")  # B bytes 0/1 or 2/3
        lines += [
            f"prmt.b32 u02, {a}, {b4}, {sel02};",
            f"prmt.b32 u13, {a}, {b}, {sel13};",
            f"and.b32 z, {a}, 0x78787878;",
            "add.u32 z, z, 0x78787878;",
            "prmt.b32 k02, z, 0, 0xAA88;",
            "prmt.b32 k13, z, 0, 0xBB99;",
            "lop3.b32 e02, k02, $18, $14, 0xCA;",
            "lop3.b32 e13, k13, $18, $14, 0xCA;",
            "shr.u32 q02, u02, 4;",
            "shr.u32 q13, u13, 4;",
            "and.b32 q02, q02, 0x07FF07FF;",
            "and.b32 q13, q13, 0x07FF07FF;",
            "add.u32 q02, q02, e02;",
            "add.u32 q13, q13, e13;",
            f"lop3.b32 ${j}, q02, u02, 0x80008000, 0xD8;",
            f"lop3.b32 ${4 + j}, q13, u13, 0x80008000, 0xD8;",
        ]
    return "\n".join(lines + ["}"])


_DECODE_CHUNK = gl.constexpr(_decode_chunk_asm())
_DECODE_CONSTRAINTS = gl.constexpr(",".join(["=r"] * 8 + ["r"] * 14))


def _mma_chunk_asm() -> str:
    """pack = 4 over j: $4-$7 (w0, w2) of row g, $8-$11 (w1, w3) of row g, $12-$15 / $16-$19 the same for row
    g + 8, $20-$23 x words (4 bf16 of activation row n), $24-$27 the accumulator c0..c3 -> $0-$3. Word j is the
    mma's k-step j; fragment column pairs (2t, 2t+1) and (2t+8, 2t+9) are weights (0, 2) and (1, 3) of it."""
    lines = ["{", ".reg .b32 xl, xh, b0, b1;", ".reg .f32 d0, d1, d2, d3;"]
    for j in range(4):
        src = ", ".join(f"${24 + i}" for i in range(4)) if j == 0 else "d0, d1, d2, d3"
        dst = "$0, $1, $2, $3" if j == 3 else "d0, d1, d2, d3"
        lines += [f"mov.b64 {{xl, xh}}, ${20 + j};", "prmt.b32 b0, xl, xh, 0x5410;", "prmt.b32 b1, xl, xh, 0x7632;"]
        frags = f"{{${4 + j}, ${12 + j}, ${8 + j}, ${16 + j}}}, {{b0, b1}}"
        lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{dst}}}, {frags}, {{{src}}};")
    return "\n".join(lines + ["}"])


_MMA_CHUNK = gl.constexpr(_mma_chunk_asm())
_MMA_CONSTRAINTS = gl.constexpr(",".join(["=f"] * 4 + ["r"] * 16 + ["l"] * 4 + ["f"] * 4))


@gluon.jit
def _mma(p02_g, p13_g, p02_h, p13_h, x, acc):
    return gl.inline_asm_elementwise(_MMA_CHUNK, _MMA_CONSTRAINTS, [p02_g, p13_g, p02_h, p13_h, x, acc],
                                     dtype=gl.float32, is_pure=True, pack=4)


@gluon.jit
def _pairs(a, b, xe, base_lanes):
    """A words [KS, 32, 4] uint32, B half-words (uint16, same shape), segment XE -> the bf16 pairs (w0, w2),
    (w1, w3) of each word as uint32."""
    xe_lanes = (xe << 7) | (xe << 23)
    return gl.inline_asm_elementwise(_DECODE_CHUNK, _DECODE_CONSTRAINTS,
                                     [a, b, xe_lanes, base_lanes], dtype=(gl.uint32, gl.uint32), is_pure=True,
                                     pack=4)


@gluon.jit
def _pool_pairs(v_ptr, vr, off, ok, SEGMENT: gl.constexpr):
    """The pool's bf16 pairs (w0, w2), (w1, w3) of word `off` of pool row vr (zeros where vr < 0 or not ok)."""
    use = (vr >= 0) & ok
    v = gl.load(v_ptr + gl.maximum(vr, 0).to(gl.int64) * (SEGMENT // 4) + off, mask=use, other=0)
    v = v.to(gl.uint64, bitcast=True)
    lo = v.to(gl.uint32)
    hi = (v >> 32).to(gl.uint32)
    return (lo & 0xFFFF) | (hi << 16), (lo >> 16) | (hi & 0xFFFF0000)


@gluon.jit
def _verbatim_segment(acc_lo, acc_hi, s, vr_g, vr_h, v_ptr, x_lo, x_hi, K, w, lane, j, KS: gl.constexpr,
                      SEGMENT: gl.constexpr, EVEN_K: gl.constexpr, TWO_N: gl.constexpr):
    """Adds segment s of this 16-row block from the pool: warp w takes the segment's chunks w, w + KS, ... and
    runs the pool words of rows g / g + 8 (pool rows vr_g / vr_h; zeros where -1) with x through the chunk's
    mmas. x_lo / x_hi: pointers to the lanes' x rows (word 0)."""
    CPS: gl.constexpr = SEGMENT // CHUNK
    for u in gl.static_range((CPS + KS - 1) // KS):
        r = w + KS * u  # chunk of the segment (past the segment's end when KS > CPS: masked)
        ok = r < CPS
        off = 16 * r + 4 * (lane % 4) + j  # the lane's x / pool word
        word = s * (SEGMENT // 4) + off
        live = ok if EVEN_K else ok & (word < K // 4)
        xl = gl.load(x_lo + word, mask=live, other=0)
        p02_g, p13_g = _pool_pairs(v_ptr, vr_g, off, ok, SEGMENT)
        p02_h, p13_h = _pool_pairs(v_ptr, vr_h, off, ok, SEGMENT)
        acc_lo = _mma(p02_g, p13_g, p02_h, p13_h, xl, acc_lo)
        if TWO_N:
            xh = gl.load(x_hi + word, mask=live, other=0)
            acc_hi = _mma(p02_g, p13_g, p02_h, p13_h, xh, acc_hi)
    return acc_lo, acc_hi


@gluon.jit
def _verbatim_pass(acc_lo, acc_hi, n_v, s0, vr0_g, vr0_h, vq_g, vq_h, vseg, v_ptr, x_lo, x_hi, K, w, lane, j,
                   KS: gl.constexpr, SEGMENT: gl.constexpr, EVEN_K: gl.constexpr, TWO_N: gl.constexpr):
    """Adds the block's n_v listed verbatim segments (vseg: the block's list; s0 / vr0_*: its first entry and pool
    rows, loaded before the K loop) in list order."""
    if n_v > 0:
        acc_lo, acc_hi = _verbatim_segment(acc_lo, acc_hi, s0, vr0_g, vr0_h, v_ptr, x_lo, x_hi, K, w, lane, j, KS,
                                           SEGMENT, EVEN_K, TWO_N)
    for q in range(1, n_v):
        acc_lo, acc_hi = _verbatim_segment(acc_lo, acc_hi, gl.load(vseg + q), gl.load(vq_g + q), gl.load(vq_h + q),
                                           v_ptr, x_lo, x_hi, K, w, lane, j, KS, SEGMENT, EVEN_K, TWO_N)
    return acc_lo, acc_hi


@gluon.jit
def _bf16_bits(y):
    """fp32 -> int16 bits of its bf16 rounding to nearest even (torch's fp32 -> bf16, NaN -> 0x7FC0). The same
    integer rounding as triton.py's `_bf16_bits` (a Gluon kernel cannot call a @triton.jit helper), so both
    kernels round their outputs alike."""
    u = y.to(gl.uint32, bitcast=True)
    rne = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = gl.where((u & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, rne)
    return bits.to(gl.uint16).to(gl.int16, bitcast=True)


@gluon.jit
def _store_tile(y_ptr, acc, row0, n0, M, N, stride_ym, KS: gl.constexpr):
    """Sum the KS warps' accumulators (fixed order) and store lane (g, t)'s c0..c3 as bf16 bits at y[n, row]:
    rows g / g + 8, n = n0 + 2t / 2t + 1."""
    tot = gl.sum(acc, axis=0)
    lo: gl.constexpr = gl.SliceLayout(0, gl.BlockedLayout([1, 1, 4], [1, 32, 1], [KS, 1, 1], [2, 1, 0]))
    lane = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(1, lo)), 1)
    j = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, lo)), 0)
    rows = row0 + lane // 4 + 8 * (j // 2)
    n = n0 + 2 * (lane % 4) + j % 2
    ok = (n < M) & (rows < N)
    gl.store(y_ptr + n * stride_ym + rows, _bf16_bits(tot), mask=ok)


@gluon.jit
def _store_swiglu(y_ptr, acc, blk, n0, M, stride_ym, KS: gl.constexpr):
    """SWIGLU blocks (glu_rows): sum the KS warps' accumulators (fixed order); lane (g, t) holds gate (c0, c1) and
    up (c2, c3) of output column 8 blk + g at n = n0 + 2t / 2t + 1: store bf16(silu(gate) * up) there, each
    factor first rounded to bf16 as the plain product's output is."""
    tot = gl.sum(acc, axis=0)
    lo: gl.constexpr = gl.SliceLayout(0, gl.BlockedLayout([1, 1, 4], [1, 32, 1], [KS, 1, 1], [2, 1, 0]))
    up = gl.inline_asm_elementwise("mov.b32 $0, $6; mov.b32 $1, $7; mov.b32 $2, $4; mov.b32 $3, $5;",
                                   "=r,=r,=r,=r,r,r,r,r", [tot.to(gl.uint32, bitcast=True)], dtype=gl.uint32,
                                   is_pure=True, pack=4).to(gl.float32, bitcast=True)
    gate = _bf16_float(tot)
    y = gate * (1.0 / (1.0 + gl.exp(-gate))) * _bf16_float(up)
    lane = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(1, lo)), 1)
    j = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, lo)), 0)
    n = n0 + 2 * (lane % 4) + j % 2
    gl.store(y_ptr + n * stride_ym + 8 * blk + lane // 4, _bf16_bits(y), mask=(n < M) & (j < 2))


@gluon.jit
def _bf16_float(y):
    """y rounded to bf16 (as _bf16_bits), as fp32."""
    bits = _bf16_bits(y).to(gl.uint16, bitcast=True).to(gl.uint32)
    return (bits << 16).to(gl.float32, bitcast=True)


@gluon.jit
def _w12n_mma_gemv_kernel(x_ptr, a_ptr, b_ptr, xe_ptr, v_ptr, vq_ptr, vseg_ptr, vcount_ptr, y_ptr, M, N, K, S,
                          n_iter, BASE, stride_xm, stride_xen, stride_ym,
                          KS: gl.constexpr, SEGMENT: gl.constexpr, EVEN_K: gl.constexpr, TWO_N: gl.constexpr,
                          HAS_VERBATIM: gl.constexpr, PDL: gl.constexpr, SWIGLU: gl.constexpr = False):
    # x_ptr: bf16 x as int64 words; y_ptr: the bf16 output as int16 bits; a_ptr / b_ptr: the tile-major A (int32
    # words) and B (int16 words) planes; v_ptr: the pool as int64 words; xe_ptr: XE with 0 in verbatim segments
    L: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32, 1], [KS, 1, 1], [2, 1, 0])
    pid = gl.program_id(0)
    w = gl.expand_dims(gl.expand_dims(gl.arange(0, KS, layout=gl.SliceLayout(1, gl.SliceLayout(2, L))), 1), 2)
    lane = gl.expand_dims(gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, L))), 0), 2)
    j = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L))), 0), 1)
    g = lane // 4
    n_chunks = S * (SEGMENT // CHUNK)
    # chunk c of this row block: [2][32 lanes][4 words] of A and of B, contiguous; warp w starts at chunk w
    row0 = pid * 16
    a_g = a_ptr + ((pid * n_chunks + w).to(gl.int64) * 2) * 128 + lane * 4 + j
    b_g = b_ptr + ((pid * n_chunks + w).to(gl.int64) * 2) * 128 + lane * 4 + j
    # rows past N (the last block of a ragged N) read row N - 1's tables: their results are never stored
    row_g = gl.minimum(row0 + g, N - 1).to(gl.int64)
    row_h = gl.minimum(row0 + g + 8, N - 1).to(gl.int64)
    xe_g = xe_ptr + row_g * stride_xen
    xe_h = xe_ptr + row_h * stride_xen
    # activation row n = g (8 + g) feeds mma column n; lanes past M read row M - 1 instead of a masked load:
    # a column only ever meets its own x, and columns >= M are never stored
    word0 = 16 * w + 4 * (lane % 4) + j  # x word of this lane in chunk w; chunk c adds 16 c
    x_row_lo = x_ptr + gl.minimum(g, M - 1) * stride_xm
    x_row_hi = x_ptr + gl.minimum(g + 8, M - 1) * stride_xm
    x_lo = x_row_lo + word0
    x_hi = x_row_hi + word0
    base_lanes = gl.zeros([KS, 32, 4], gl.uint32, L) + ((BASE << 7) | (BASE << 23)).to(gl.uint32)
    acc_lo = gl.zeros([KS, 32, 4], gl.float32, L)
    acc_hi = gl.zeros([KS, 32, 4], gl.float32, L)
    # iterations: where an iteration spans several segments (KS > SEGMENT / 64: 8 warps at segment 256) the
    # host's count, since n_chunks // KS there leaves an unsigned division (the wrap below) in every iteration;
    # elsewhere the compiler removes it from its own count (docs/decisions/2026-12-01-w12n-mma-iteration-count.md)
    n_iter = n_chunks // KS if KS <= SEGMENT // CHUNK else n_iter
    ptrs = (a_g, b_g, xe_g, xe_h, x_lo, x_hi, word0, w, K)
    # under PDL the SwiGLU launch lets its dependents start only after its K loop (below), the plain one at once
    # (docs/decisions/2026-12-01-w12n-pdl-trigger.md)
    if PDL and not SWIGLU:
        _gdc("griddepcontrol.launch_dependents; // $0")
    # register pipeline: iteration i issues the loads of chunk i + 1 before it decodes chunk i. The last loads wrap
    # to the warp's first chunk (a valid address, words unused) rather than being peeled or masked off
    # (docs/decisions/2026-11-30-w12n-mma-loads-ahead.md). The weights never depend on the previous kernel: under
    # PDL the first chunk streams in while it finishes.
    cur = _weights(ptrs, 0, KS, SEGMENT)
    if HAS_VERBATIM:  # the first listed segment's lookups (no load's address depends on another's value: a warp
        # stalls at the first use only, after the loop)
        vq_g = vq_ptr + row_g * S
        vq_h = vq_ptr + row_h * S
        n_v = gl.load(vcount_ptr + pid)
        s0 = gl.load(vseg_ptr + pid * S)  # 0 when the block has none (the row is zero-padded)
        vr0_g = gl.load(vq_g)
        vr0_h = gl.load(vq_h)
    if PDL:
        _gdc("griddepcontrol.wait; // $0")
    cur = cur + _xs(ptrs, 0, KS, EVEN_K, TWO_N)
    for i in range(0, n_iter):
        nxt = _chunk(ptrs, (i + 1) % n_iter, KS, SEGMENT, EVEN_K, TWO_N)
        acc_lo, acc_hi = _step(cur, acc_lo, acc_hi, base_lanes, TWO_N)
        cur = nxt
    if HAS_VERBATIM:  # the block's listed segments (usually none or a few), after the K loop
        acc_lo, acc_hi = _verbatim_pass(acc_lo, acc_hi, n_v, s0, vr0_g, vr0_h, vq_g, vq_h, vseg_ptr + pid * S, v_ptr,
                                        x_row_lo, x_row_hi, K, w, lane, j, KS, SEGMENT, EVEN_K, TWO_N)
    if PDL and SWIGLU:  # the down GEMV's programs take SM slots only as this grid's sums are done
        _gdc("griddepcontrol.launch_dependents; // $0")
    if SWIGLU:
        _store_swiglu(y_ptr, acc_lo, pid, 0, M, stride_ym, KS)
        if TWO_N:
            _store_swiglu(y_ptr, acc_hi, pid, 8, M, stride_ym, KS)
    else:
        _store_tile(y_ptr, acc_lo, row0, 0, M, N, stride_ym, KS)
        if TWO_N:
            _store_tile(y_ptr, acc_hi, row0, 8, M, N, stride_ym, KS)


@gluon.jit
def _chunk(ptrs, i, KS: gl.constexpr, SEGMENT: gl.constexpr, EVEN_K: gl.constexpr, TWO_N: gl.constexpr):
    return _weights(ptrs, i, KS, SEGMENT) + _xs(ptrs, i, KS, EVEN_K, TWO_N)


@gluon.jit
def _step(cur, acc_lo, acc_hi, base_lanes, TWO_N: gl.constexpr):
    """Decode one chunk (its raw words in cur) and run its mmas into the accumulators."""
    ag, ah, bg, bh, eg, eh, xl, xh = cur
    p02_g, p13_g = _pairs(ag.to(gl.uint32, bitcast=True), bg.to(gl.uint16, bitcast=True), eg, base_lanes)
    p02_h, p13_h = _pairs(ah.to(gl.uint32, bitcast=True), bh.to(gl.uint16, bitcast=True), eh, base_lanes)
    acc_lo = _mma(p02_g, p13_g, p02_h, p13_h, xl, acc_lo)
    if TWO_N:
        acc_hi = _mma(p02_g, p13_g, p02_h, p13_h, xh, acc_hi)
    return acc_lo, acc_hi


@gluon.jit
def _weights(ptrs, i, KS: gl.constexpr, SEGMENT: gl.constexpr):
    """Iteration i's A (int32) and B (int16) words of rows g and g + 8 and the chunk segment's XE."""
    a_g, b_g, xe_g, xe_h, x_lo, x_hi, word0, w, K = ptrs
    step = i * (256 * KS)
    s = (i * KS + w) // (SEGMENT // CHUNK)
    # weights are read once: evict first, so x and the small tables stay in cache
    return (_stream(a_g + step), _stream(a_g + step + 128), _stream(b_g + step), _stream(b_g + step + 128),
            gl.load(xe_g + s).to(gl.uint32), gl.load(xe_h + s).to(gl.uint32))


@gluon.jit
def _xs(ptrs, i, KS: gl.constexpr, EVEN_K: gl.constexpr, TWO_N: gl.constexpr):
    """Iteration i's x words of activation rows g and g + 8 (the same tensor twice when M <= 8)."""
    a_g, b_g, xe_g, xe_h, x_lo, x_hi, word0, w, K = ptrs
    word = i * (16 * KS)
    xl = _x_load(x_lo + word, word0 + word, K, EVEN_K)
    xh = _x_load(x_hi + word, word0 + word, K, EVEN_K) if TWO_N else xl
    return (xl, xh)


@gluon.jit
def _gdc(instruction: gl.constexpr):
    """A griddepcontrol instruction (programmatic dependent launch, ops/pdl.py)."""
    gl.inline_asm_elementwise(instruction, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _stream(ptrs):
    return gl.load(ptrs, eviction_policy="evict_first")


@gluon.jit
def _x_load(ptrs, word, K, EVEN_K: gl.constexpr):
    """x words at ptrs (word: their index in the row); columns past K (the padding, whose weights decode to
    finite values) read 0."""
    if EVEN_K:
        return gl.load(ptrs)
    else:
        return gl.load(ptrs, mask=word < K // 4, other=0)


@dataclass(frozen=True)
class Launch:
    """One launch of the kernel: warps (K slices) per 16-row program and the ptxas register cap."""
    warps: int
    maxnreg: int | None = None


def default_warps(t: W12NTensor, sms: int = 132) -> int:
    """K-slices (warps) per 16-row program outside the few-warp launches: the fewest of 4, 8, 16 that put 8 warps
    per SM in flight, among those dividing the chunk count (4 on every large projection shape)."""
    chunks, blocks = t.padded_k // CHUNK.value, -(-t.n // 16)
    fits = [ks for ks in (4, 8, 16) if chunks % ks == 0] or [ks for ks in (2, 1) if chunks % ks == 0]
    return next((ks for ks in fits if blocks * ks >= 8 * sms), fits[-1])


def _small_n(t: W12NTensor, sms: int) -> bool:
    """Fewer than 16 warps per SM at 4 warps per 16-row program: each warp's chain of loads is the limit, not
    the decode."""
    return -(-t.n // 16) * 4 < 16 * sms


def default_launch(t: W12NTensor, m: int, sms: int = 132) -> Launch:
    """Small N: 8 warps, and at M <= 8 at most 80 registers, so that 3 programs (24 warps) fit an SM. Elsewhere
    default_warps and the compiler's registers, except at M <= 8: an 80-register cap at >= 10 blocks per SM, and
    with verbatim segments a cap of 64 where it saves a wave. The K split depends on the shape alone, never on M:
    it fixes the order of the sums, and row m of an M-row call must equal the M = 1 call bitwise. The H200
    measurements behind each rule: docs/decisions/2026-11-30-w12n-mma-launch-rule.md."""
    if _small_n(t, sms) and (t.padded_k // CHUNK.value) % 8 == 0:
        return Launch(warps=8, maxnreg=80 if m <= 8 else None)
    blocks, warps = -(-t.n // 16), default_warps(t, sms)
    if blocks >= 10 * sms and m <= 8:  # many blocks per SM: registers for loads in flight beat occupancy
        return Launch(warps=warps, maxnreg=80)
    if m <= 8 and warps == 4 and _waves(blocks, 7, sms) > _waves(blocks, 8, sms) and t.verbatim.shape[0] > 0:
        # the verbatim pass takes the 4-warp build from 64 to 71-72 registers (Triton 3.6, sm_90), 8 -> 7 programs
        # per SM; where that costs a wave, a cap of 64 restores 8 (its spills stay outside the loop at M <= 8)
        return Launch(warps=4, maxnreg=64)
    return Launch(warps=warps)


def _waves(blocks: int, per_sm: int, sms: int) -> int:
    return -(-blocks // (per_sm * sms))


def supports(x: torch.Tensor, t: W12NTensor) -> bool:
    """bf16 x read as 8-byte words (K % 4 == 0, aligned rows) and segments that are whole chunks."""
    return (x.dtype == torch.bfloat16 and x.dim() == 2 and 1 <= x.shape[0] <= 16 and x.shape[1] % 4 == 0
            and x.stride(1) == 1 and x.stride(0) % 4 == 0 and x.data_ptr() % 8 == 0 and t.segment % CHUNK.value == 0)


_SMS: dict = {}


def _sm_count(device: torch.device) -> int:
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


@dataclass(frozen=True)
class VerbatimTables:
    """What the kernel reads for a tensor with verbatim segments, beside its tile-major planes:
    xe     uint8 [N, S]: XE with 0 in verbatim segments (their zeroed planes then decode to +0)
    vseg   int32 [ceil(N / 16), S]: per 16-row block, the segments where any of its rows is verbatim, ascending,
           then zeros
    vcount int32 [ceil(N / 16)]: how many of vseg's entries are real
    vq     int32 [N, S]: vq[row, q] = pool row of (row, vseg[row // 16, q]), -1 where that segment is inline (or
           q >= vcount): indexed by list position, so no lookup waits for another"""
    xe: torch.Tensor
    vseg: torch.Tensor
    vcount: torch.Tensor
    vq: torch.Tensor


def glu_rows(n: int, device=None) -> torch.Tensor:
    """The SWIGLU planes' row order for a packed [gate; up] matrix of n = 2 I rows (I % 8 == 0): kernel row
    16 b + 8 h + g holds weight row 8 b + g + h I (h = 0: gate, 1: up)."""
    r = torch.arange(n, device=device)
    return 8 * (r // 16) + r % 8 + (r % 16 >= 8) * (n // 2)


def _rows(t: W12NTensor, swiglu: bool) -> torch.Tensor | None:
    return glu_rows(t.n, t.xe.device) if swiglu else None


_VERBATIM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def verbatim_tables(t: W12NTensor, swiglu: bool = False) -> VerbatimTables:
    """The tensor's VerbatimTables (cached per tensor), by kernel row: weight rows in glu_rows order if swiglu."""
    cache = _VERBATIM.setdefault(t, {})
    if swiglu not in cache:
        rows = _rows(t, swiglu)
        xe, rvb = (t.xe, t.rvb) if rows is None else (t.xe[rows], t.rvb[rows])
        is_v = xe == VERBATIM
        pool_row = rvb[:, None] + torch.cumsum(is_v.to(torch.int32), dim=1, dtype=torch.int32) - 1
        vrow = torch.where(is_v, pool_row, torch.full_like(pool_row, -1))  # by segment
        blocks, segs = -(-t.n // 16), is_v.shape[1]
        padded = torch.zeros(blocks * 16, segs, dtype=torch.bool, device=is_v.device)
        padded[:t.n] = is_v
        flagged = padded.view(blocks, 16, segs).any(dim=1)
        # stable sort on "not flagged" puts each block's flagged segments first, in ascending order
        order = torch.sort((~flagged).to(torch.int8), dim=1, stable=True).indices
        vcount = flagged.sum(dim=1, dtype=torch.int32)
        listed = torch.arange(segs, device=is_v.device) < vcount[:, None]
        vseg = torch.where(listed, order, 0).to(torch.int32).contiguous()
        row_block = torch.arange(t.n, device=is_v.device) // 16
        vq = torch.gather(vrow, 1, order[row_block])
        vq = torch.where(listed[row_block], vq, -1).to(torch.int32).contiguous()
        xe = torch.where(is_v, 0, xe).to(torch.uint8).contiguous()
        cache[swiglu] = VerbatimTables(xe=xe, vseg=vseg, vcount=vcount.contiguous(), vq=vq)
    return cache[swiglu]


_TILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tiled_planes(t: W12NTensor, swiglu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The A and B planes in the kernel's tile-major order (cached per tensor): for each 16-row block and
    64-column chunk, [h][lane][16 bytes of A] (and [h][lane][8 bytes of B]) where lane (g, t) = 4 g + t holds
    row g + 8 h, columns 16 t .. 16 t + 15 of the chunk, so every warp load is one contiguous 512 (256) bytes
    and a warp's chunks follow each other in memory. Rows are padded to whole blocks with zeros, and verbatim
    segments hold zeros (the kernel adds them from the pool after its K loop). swiglu: rows in glu_rows order."""
    cache = _TILED.setdefault(t, {})
    if swiglu not in cache:
        blocks, chunks, segs = -(-t.n // 16), t.padded_k // CHUNK.value, t.padded_k // t.segment
        rows = _rows(t, swiglu)
        is_v = (t.xe if rows is None else t.xe[rows]) == VERBATIM
        out = []
        for plane, width in ((t.a, 16), (t.b, 8)):
            padded = plane.new_zeros(blocks * 16, plane.shape[1])
            padded[:t.n] = plane if rows is None else plane[rows]
            padded[:t.n].view(t.n, segs, -1)[is_v] = 0
            tiled = padded.view(blocks, 2, 8, chunks, 4, width).permute(0, 3, 1, 2, 4, 5).contiguous()
            out.append(tiled.view(blocks * 16, -1))
        cache[swiglu] = (out[0], out[1])
    return cache[swiglu]


def prepare(t: W12NTensor, swiglu: bool = False) -> None:
    """Builds the tensor's derived tables (tile-major planes, verbatim tables) now, outside any CUDA graph
    capture: a layer calls this when it attaches W12N planes on a GPU. swiglu: those of w12n_swiglu_gemv
    instead (an MLP's [gate; up] matrix), where its shape allows."""
    swiglu = swiglu and glu_supported(t)
    tiled_planes(t, swiglu)
    if t.verbatim.shape[0] > 0:
        verbatim_tables(t, swiglu)


def glu_supported(t: W12NTensor) -> bool:
    """w12n_swiglu_gemv takes [gate; up] matrices of whole 16-row blocks (I % 8 == 0)."""
    return t.n % 16 == 0


def resolve_launch(t: W12NTensor, m: int, sms: int, warps: int | None = None,
                   maxnreg: int | None = None) -> Launch:
    """The launch for explicit overrides: default_launch where warps is None or the default's and no cap is given;
    the default's warps with a given cap; another warps count with no cap unless one is given."""
    d = default_launch(t, m, sms)
    if warps is None or warps == d.warps:
        return d if maxnreg is None else Launch(d.warps, maxnreg)
    return Launch(warps, maxnreg)


def w12n_mma_gemv(x: torch.Tensor, t: W12NTensor, *, pdl: bool = False, warps: int | None = None,
                  maxnreg: int | None = None) -> torch.Tensor:
    """y = x @ decode(t).T for bf16 x [M <= 16, K] on CUDA -> bf16 [M, N]; warps: K-slices per program (must
    divide padded_k / 64); maxnreg: a register cap per thread for ptxas. Unset: default_launch (resolve_launch
    says how overrides combine with it)."""
    cfg = resolve_launch(t, x.shape[0], _sm_count(x.device), warps, maxnreg)
    return _launch(x, t, cfg, swiglu=False, pdl=pdl)


def w12n_swiglu_gemv(x: torch.Tensor, t: W12NTensor, pdl: bool = False) -> torch.Tensor:
    """h = silu(x @ Wg.T) * (x @ Wu.T) for t = W12N of an MLP's packed [gate; up] matrix (2 I rows, I % 8 == 0)
    and bf16 x [M <= 16, K] on CUDA -> bf16 [M, I], in one kernel: each factor is rounded to bf16 as
    w12n_mma_gemv's output is, the product formed in fp32 and rounded once (as ops/gemv's gated GEMVs form it)."""
    if not glu_supported(t):
        raise ValueError(f"w12n_swiglu_gemv needs a [gate; up] matrix of 2 I rows with I % 8 == 0, got {t.n} rows")
    return _launch(x, t, default_launch(t, x.shape[0], _sm_count(x.device)), swiglu=True, pdl=pdl)


def _launch(x: torch.Tensor, t: W12NTensor, cfg: Launch, swiglu: bool, pdl: bool) -> torch.Tensor:
    if not supports(x, t):
        raise ValueError(f"the tensor-core W12N GEMV needs bf16 x [M <= 16, K % 4 == 0] with dense, 8-byte aligned "
                         f"rows and a segment that is a multiple of {CHUNK.value}; got {x.dtype} {list(x.shape)}, "
                         f"segment {t.segment}")
    if cfg.warps < 1 or (t.padded_k // CHUNK.value) % cfg.warps:
        raise ValueError(f"warps must divide padded_k / {CHUNK.value} = {t.padded_k // CHUNK.value}, got {cfg.warps}")
    if t.a.device != x.device:
        raise ValueError(f"x is on {x.device} but the W12N planes are on {t.a.device}")
    if torch.cuda.is_current_stream_capturing() and swiglu not in _TILED.get(t, {}):
        raise RuntimeError("the W12N tensor's tile-major planes are built on first use, which cannot happen inside "
                           "a CUDA graph capture: call specpilot.ops.w12n_gemv.mma.prepare(t) before capturing")
    M = x.shape[0]
    y = torch.empty(M, t.n // 2 if swiglu else t.n, dtype=torch.bfloat16, device=x.device)
    on = usable(x, pdl)  # programmatic dependent launch (ops/pdl.py)
    a, b = tiled_planes(t, swiglu)
    xw, a, b = x.view(torch.int64), a.view(torch.int32), b.view(torch.int16)
    has_verbatim = t.verbatim.shape[0] > 0
    if has_verbatim:
        vt = verbatim_tables(t, swiglu)
        xe, pool, vq, vseg, vcount = vt.xe, t.verbatim.view(torch.int64), vt.vq, vt.vseg, vt.vcount
    else:  # never read: any tensors of the right types
        xe, pool, vq, vseg, vcount = t.xe, a.view(torch.int64), t.rvb, t.rvb, t.rvb
    _w12n_mma_gemv_kernel[(-(-t.n // 16),)](
        xw, a, b, xe, pool, vq, vseg, vcount, y.view(torch.int16), M, t.n, t.k, t.padded_k // t.segment,
        t.padded_k // CHUNK.value // cfg.warps, t.base,
        xw.stride(0), xe.stride(0), y.stride(0),
        KS=cfg.warps, SEGMENT=t.segment, EVEN_K=t.k == t.padded_k, TWO_N=M > 8, HAS_VERBATIM=has_verbatim,
        PDL=on, SWIGLU=swiglu,
        num_warps=cfg.warps,
        **launch_kwargs(on), **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}))
    return y
