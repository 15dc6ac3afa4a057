"""Triton GEMV for decode and small verify blocks (M = 1..32 rows): each program streams BLOCK_N weight rows
once, fp32 accumulate.

At batch 1 the decode step is a chain of weight reads; where cuBLAS splits K for the narrower projections
(o_proj, out_proj, qkv) it streams well below the copy bandwidth and adds reduce kernels. One pass over the rows
with no split keeps the whole matrix in one kernel. M = 1 multiplies on the FMA units (`_gemv_kernel`); M = 2..32
(a verify block of a tree, or a small decode batch) runs each weight tile once through a tensor-core dot against
all rows padded to 16 or 32 (`_skinny_kernel`), so the weight bytes, not M, set the time. The H200 measurements
behind both and their launch configs (configs.py): docs/decisions/2026-11-30-gemv-launch-configs.md.
"""

import os

import torch
import triton
import triton.language as tl

from specpilot.ops.pdl import launch_kwargs, usable
from specpilot.ops.pdl_wait import wait_for_inputs


@triton.jit
def _x_tile(x_row, cols, col_ok, K, GATED: tl.constexpr, EVEN_K: tl.constexpr):
    """Columns `cols` of one activation row in fp32; GATED: the row is [gate | up] (2K wide) and the tile is
    silu(gate) * up, rounded once to the activation dtype as the compiled silu_mul helper rounds it."""
    if GATED:
        if EVEN_K:
            g = tl.load(x_row + cols).to(tl.float32)
            u = tl.load(x_row + K + cols).to(tl.float32)
        else:
            g = tl.load(x_row + cols, mask=col_ok, other=0.0).to(tl.float32)
            u = tl.load(x_row + K + cols, mask=col_ok, other=0.0).to(tl.float32)
        x = (g * tl.sigmoid(g) * u).to(x_row.dtype.element_ty)
    elif EVEN_K:
        x = tl.load(x_row + cols)
    else:
        x = tl.load(x_row + cols, mask=col_ok, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _w_tile(w_rows, cols, row_ok, K, EVEN_K: tl.constexpr):
    if EVEN_K:
        return tl.load(w_rows + cols[None, :], mask=row_ok[:, None], other=0.0)
    return tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & (cols < K)[None, :], other=0.0)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_ym,
                 M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 GATED: tl.constexpr = False, PDL: tl.constexpr = False, PRE_TILES: tl.constexpr = 1):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    cols0 = tl.arange(0, BLOCK_K)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    # the weights never depend on the previous kernel: under PDL the first PRE_TILES tiles stream in while it
    # finishes (the wrapper keeps PRE_TILES <= the number of tiles)
    if PRE_TILES >= 1:
        w0 = _w_tile(w_rows, cols0, row_ok, K, EVEN_K)
    if PRE_TILES >= 2:
        w1 = _w_tile(w_rows, BLOCK_K + cols0, row_ok, K, EVEN_K)
    if PDL:
        tl.extra.cuda.gdc_wait()
    for m in tl.static_range(M):
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        x_row = x_ptr + m * stride_xm
        # the same sums in the same order whatever PRE_TILES is: tile by tile into one accumulator
        if PRE_TILES >= 1:
            acc += w0.to(tl.float32) * _x_tile(x_row, cols0, cols0 < K, K, GATED, EVEN_K)[None, :]
        if PRE_TILES >= 2:
            cols1 = BLOCK_K + cols0
            acc += w1.to(tl.float32) * _x_tile(x_row, cols1, cols1 < K, K, GATED, EVEN_K)[None, :]
        for k0 in range(PRE_TILES * BLOCK_K, K, BLOCK_K):
            cols = k0 + cols0
            w = _w_tile(w_rows, cols, row_ok, K, EVEN_K)
            acc += w.to(tl.float32) * _x_tile(x_row, cols, cols < K, K, GATED, EVEN_K)[None, :]
        y = tl.sum(acc, axis=1)
        tl.store(y_ptr + m * stride_ym + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                   DOT_F32: tl.constexpr, PDL: tl.constexpr = False):
    wait_for_inputs(PDL)
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    m_ids = tl.arange(0, BLOCK_M)
    m_ok = m_ids < M
    x_rows = x_ptr + m_ids[:, None] * stride_xm
    cols0 = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + cols0
        if EVEN_K:
            w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None], other=0.0)
            x_ok = m_ok[:, None]
        else:
            col_ok = cols < K
            w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            x_ok = m_ok[:, None] & col_ok[None, :]
        x = tl.load(x_rows + cols[None, :], mask=x_ok, other=0.0)
        # fp32 weights must not be rounded to tf32; the interpreter mis-multiplies bf16 dots, so there too the
        # tiles are widened (exact: a bf16 product fits an fp32 FMA)
        if DOT_F32:
            acc += tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(w, tl.trans(x.to(w.dtype)))
    y_ptrs = y_ptr + m_ids[None, :] * stride_ym + rows[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & m_ok[None, :])


MAX_M = 32
# shared memory a skinny launch may ask for (an H200 SM has 227 KB): 32-row tiles take fewer stages
_SKINNY_SMEM = 160 * 1024


def gemv(x: torch.Tensor, weight: torch.Tensor, *, block_n: int = 8, block_k: int = 512, num_warps: int = 4,
         num_stages: int = 3, pre_tiles: int = 1, gated: bool = False, pdl: bool = False) -> torch.Tensor:
    """Same contract as gemv_ref: x [M, K] (M <= 4; meant for M = 1, each extra row re-streams the weights),
    weight [N, K] row-major -> y [M, N] in x.dtype. gated: x is [M, 2K] = [gate | up] and the product is
    gemv_ref(silu(gate) * up, weight) (the MLP's down projection without a separate silu_mul kernel).
    pre_tiles (0..2): weight tiles loaded before the PDL wait; the result is the same bitwise. pdl: launch with
    programmatic dependent launch (ops/pdl.py; single rows only)."""
    M, K = x.shape[0], weight.shape[1]
    N = weight.shape[0]
    assert weight.stride(1) == 1, "weight must be [N, K] with dense rows"
    assert x.shape[1] == (2 * K if gated else K), f"x {list(x.shape)} does not fit weight {list(weight.shape)}"
    assert x.stride(1) == 1 and 1 <= M <= 4, "x must be [M <= 4, K] with a dense last dim"
    assert 0 <= pre_tiles <= 2, f"pre_tiles must be 0, 1 or 2, not {pre_tiles}"
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    on = usable(x, pdl) and M == 1
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, weight, y, N, K, x.stride(0), weight.stride(0), y.stride(0),
        M=M, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=K % block_k == 0, GATED=gated, PDL=on,
        PRE_TILES=min(pre_tiles, triton.cdiv(K, block_k)), num_warps=num_warps, num_stages=num_stages,
        **launch_kwargs(on))
    return y


def skinny(x: torch.Tensor, weight: torch.Tensor, *, block_n: int = 32, block_k: int = 256, num_warps: int = 4,
           num_stages: int = 4, pdl: bool = False) -> torch.Tensor:
    """gemv for M = 1..32 rows on the tensor cores: x [M, K], weight [N, K] -> y [M, N] in x.dtype; pdl: launch
    with programmatic dependent launch (ops/pdl.py)."""
    M = x.shape[0]
    N, K = weight.shape
    assert x.shape[1] == K, f"x {list(x.shape)} does not fit weight {list(weight.shape)}"
    assert weight.stride(1) == 1, "weight must be [N, K] with dense rows"
    assert x.stride(1) == 1 and 1 <= M <= MAX_M, f"x must be [M <= {MAX_M}, K] with a dense last dim"
    assert block_n >= 16 and block_k >= 16, "tensor-core tiles need block_n and block_k >= 16"
    block_m = 16 if M <= 16 else 32
    num_stages = max(1, min(num_stages, _SKINNY_SMEM // ((block_n + block_m) * block_k * weight.element_size())))
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    on = usable(x, pdl)
    _skinny_kernel[(triton.cdiv(N, block_n),)](
        x, weight, y, M, N, K, x.stride(0), weight.stride(0), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=K % block_k == 0,
        DOT_F32=weight.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1", num_warps=num_warps,
        num_stages=num_stages, PDL=on, **launch_kwargs(on))
    return y
