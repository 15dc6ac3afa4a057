"""Triton GEMV for decode (M = 1..4 rows): each program streams BLOCK_N weight rows once, fp32 accumulate.

At batch 1 the decode step is a chain of weight reads; cuBLAS picks split-K or small-tile kernels for the
narrower projections (o_proj, out_proj, qkv) that reach only 72-84% of the copy bandwidth on an H200, plus
split-K reduce kernels. One pass over the rows with no split keeps the whole matrix in one kernel.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_ym,
                 M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    cols0 = tl.arange(0, BLOCK_K)
    for m in tl.static_range(M):
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + cols0
            if EVEN_K:
                w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None], other=0.0)
                x = tl.load(x_ptr + m * stride_xm + cols)
            else:
                col_ok = cols < K
                w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
                x = tl.load(x_ptr + m * stride_xm + cols, mask=col_ok, other=0.0)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        y = tl.sum(acc, axis=1)
        tl.store(y_ptr + m * stride_ym + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


def gemv(x: torch.Tensor, weight: torch.Tensor, *, block_n: int = 8, block_k: int = 512, num_warps: int = 4,
         num_stages: int = 3) -> torch.Tensor:
    """Same contract as gemv_ref: x [M, K] (M <= 4), weight [N, K] row-major -> y [M, N] in x.dtype."""
    M, K = x.shape
    N = weight.shape[0]
    assert weight.shape[1] == K and weight.stride(1) == 1, "weight must be [N, K] with dense rows"
    assert x.stride(1) == 1 and 1 <= M <= 4, "x must be [M <= 4, K] with a dense last dim"
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, weight, y, N, K, x.stride(0), weight.stride(0), y.stride(0),
        M=M, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=K % block_k == 0, num_warps=num_warps, num_stages=num_stages)
    return y
