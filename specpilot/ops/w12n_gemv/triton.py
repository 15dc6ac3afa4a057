"""Fused W12N decode + GEMV for decode steps (M = 1..16), and the FP8-view GEMV (A plane only).

Each program owns BLOCK_N output rows and walks K segment by segment, BLOCK_K weights at a time (BLOCK_K
divides the segment, so a tile never straddles two segments and needs one XE byte per row). Per tile it loads
the A bytes and the B nibble bytes, rebuilds every weight's fp32 bit pattern in registers with integer ops
(the exact bf16 value, widened), and then, for each activation row m, reduces x[m] * w over the tile into an
fp32 [BLOCK_M, BLOCK_N] accumulator. Decoded weights never go back to memory. Verbatim segments
(XE == 255) are rare: a uniform branch loads that tile's bf16 words from the pool at
rvb[row] + (number of verbatim segments already passed in this row), a per-row counter kept in registers.

Determinism and batch invariance: no atomics, no split-K; the [BLOCK_N, BLOCK_K] product of row m and its
sum over K have the same shape (hence layout and reduction tree) for every M, and partial sums are added
tile by tile in K order, so row m of an M-row call equals the M = 1 call on that row bitwise. (On a GPU this
rests on the compiler picking the same layout for that tile at every M; CI on the GPU must check it per
config, see README.md.)
"""

import torch
import triton
import triton.language as tl

from specpilot.weights.w12n import VERBATIM, W12NTensor

MAX_M = 16
assert VERBATIM == 255  # the kernel compares XE against the literal 255


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
def _w12n_gemv_kernel(x_ptr, a_ptr, b_ptr, xe_ptr, rvb_ptr, v_ptr, y_ptr, N, K, S, BASE23,
                      stride_xm, stride_an, stride_bn, stride_xen, stride_ym,
                      M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SEGMENT: tl.constexpr, EVEN_K: tl.constexpr, OUT_BF16: tl.constexpr):
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
        xe23 = (xe << 23)[:, None]  # exponent of the segment's escapes, in place
        for kk in range(0, SEGMENT, BLOCK_K):
            k0 = s * SEGMENT + kk
            # a: s c3 c2 c1 c0 m6 m5 m4 ; b byte j: nibble of element 2j (low), 2j+1 (high)
            a = tl.load(a_rows + (k0 + cols0)[None, :], mask=row_ok[:, None], other=0).to(tl.uint32)
            bb = tl.load(b_rows + (k0 // 2 + half0)[None, :], mask=row_ok[:, None], other=0).to(tl.uint32)
            nib = tl.join(bb & 0xF, bb >> 4).reshape(BLOCK_N, BLOCK_K)
            # fp32 bits of the bf16 weight: sign<<31 | exponent<<23 | m6..m4<<20 | m3..m0<<16, where
            # exponent = base + code (code != 0) or the segment's XE (code == 0: escape)
            exp23 = tl.where((a & 0x78) == 0, xe23, BASE23)
            bits = ((a & 0x80) << 24) | (((a & 0x7F) << 20) + exp23) | (nib << 16)
            w = bits.to(tl.float32, bitcast=True)
            if any_v > 0:  # uniform, rare: the tile holds a verbatim segment of some row
                vw = tl.load(v_ptr + pool_row.to(tl.int64)[:, None] * SEGMENT + (kk + cols0)[None, :],
                             mask=is_v[:, None] & row_ok[:, None], other=0.0)
                w = tl.where(is_v[:, None], vw.to(tl.float32), w)
            for m in tl.static_range(M):
                if EVEN_K:
                    x = tl.load(x_ptr + m * stride_xm + k0 + cols0).to(tl.float32)
                else:  # padding columns: x reads 0 (the pad weights decode to finite values, never inf/NaN)
                    x = tl.load(x_ptr + m * stride_xm + k0 + cols0, mask=k0 + cols0 < K, other=0.0).to(tl.float32)
                part = tl.sum(w * x[None, :], axis=1)
                acc = tl.where(m_ids[:, None] == m, acc + part[None, :], acc)
        pool_row += is_v.to(tl.int32)
    _store_rows(y_ptr, acc, m_ids, rows, (m_ids[:, None] < M) & row_ok[None, :], stride_ym, OUT_BF16)


@triton.jit
def _fp8_gemv_kernel(x_ptr, a_ptr, y_ptr, N, K, KP, BASE23, SCALE,
                     stride_xm, stride_an, stride_ym,
                     M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     EVEN_K: tl.constexpr, OUT_BF16: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * stride_an
    cols0 = tl.arange(0, BLOCK_K)
    m_ids = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, KP, BLOCK_K):
        # KP is a multiple of BLOCK_K (it divides the segment): A loads need no column mask
        a = tl.load(a_rows + (k0 + cols0)[None, :], mask=row_ok[:, None], other=0).to(tl.uint32)
        sign = (a & 0x80) << 24
        # normal E4M3 (exponent field = code != 0): value * 2^(base-120) = 2^(base+code-127) * 1.m6m5m4
        normal = sign | (((a & 0x7F) << 20) + BASE23)
        # subnormal (code 0, the escapes): (m6m5m4 / 8) * 2^-6 * 2^(base-120); SCALE = 2^(base-120) is a normal
        # fp32 for every base, and the product is exact unless it is itself subnormal (base < 3 only)
        sub = (((a & 7).to(tl.float32) * 0.001953125) * SCALE).to(tl.uint32, bitcast=True) | sign
        w = tl.where((a & 0x78) == 0, sub, normal).to(tl.float32, bitcast=True)
        for m in tl.static_range(M):
            if EVEN_K:
                x = tl.load(x_ptr + m * stride_xm + k0 + cols0).to(tl.float32)
            else:
                x = tl.load(x_ptr + m * stride_xm + k0 + cols0, mask=k0 + cols0 < K, other=0.0).to(tl.float32)
            part = tl.sum(w * x[None, :], axis=1)
            acc = tl.where(m_ids[:, None] == m, acc + part[None, :], acc)
    _store_rows(y_ptr, acc, m_ids, rows, (m_ids[:, None] < M) & row_ok[None, :], stride_ym, OUT_BF16)


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
              num_warps: int = 4) -> torch.Tensor:
    """Same contract as w12n_gemv_ref: x [M <= 16, K] fp32/bf16, t = W12N of W [N, K] -> y [M, N] in x.dtype.

    block_k (default: the segment, capped at 512) must be a power of two dividing t.segment.
    """
    block_k = default_block_k(t.segment) if block_k is None else block_k
    _check(x, t, block_n, block_k)
    M = x.shape[0]
    y = torch.empty(M, t.n, dtype=x.dtype, device=x.device)
    pool = t.verbatim if t.verbatim.numel() else t.verbatim.new_zeros(1, t.segment)  # never read when V = 0
    _w12n_gemv_kernel[(triton.cdiv(t.n, block_n),)](
        x, t.a, t.b, t.xe, t.rvb, pool, _out(y), t.n, t.k, t.padded_k // t.segment, t.base << 23,
        x.stride(0), t.a.stride(0), t.b.stride(0), t.xe.stride(0), y.stride(0),
        M=M, BLOCK_M=triton.next_power_of_2(M), BLOCK_N=block_n, BLOCK_K=block_k, SEGMENT=t.segment,
        EVEN_K=t.k == t.padded_k, OUT_BF16=y.dtype == torch.bfloat16, num_warps=num_warps)
    return y


def fp8_gemv(x: torch.Tensor, t: W12NTensor, *, block_n: int = 8, block_k: int | None = None,
             num_warps: int = 4) -> torch.Tensor:
    """Same contract as fp8_gemv_ref: y = x @ (fp8_view(t) * scale).T, reading only the A plane."""
    block_k = default_block_k(t.segment) if block_k is None else block_k
    _check(x, t, block_n, block_k)
    M = x.shape[0]
    y = torch.empty(M, t.n, dtype=x.dtype, device=x.device)
    _fp8_gemv_kernel[(triton.cdiv(t.n, block_n),)](
        x, t.a, _out(y), t.n, t.k, t.padded_k, t.base << 23, 2.0 ** (t.base - 120),
        x.stride(0), t.a.stride(0), y.stride(0),
        M=M, BLOCK_M=triton.next_power_of_2(M), BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=t.k == t.padded_k, OUT_BF16=y.dtype == torch.bfloat16, num_warps=num_warps)
    return y

