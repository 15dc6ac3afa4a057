"""Triton GEMV for decode: each program streams BLOCK_N weight rows once, fp32 accumulate, no split-K.

At batch 1 the decode step is a chain of weight reads. cuBLAS picks split-K or small-tile kernels for the
narrower projections (o_proj, out_proj, qkv), which reach only 72-84% of the copy bandwidth on an H200 and add
split-K reduce kernels. This kernel keeps each matrix to one pass and one launch. Two optional prologues fold the
op that precedes a projection into the same launch, since each program reads the whole input vector anyway:
- ADD_RMSNORM: x = h + residual (also written out once), y = rsqrt(mean(x^2) + eps) * W (g * x). The scalar
  norm factor is applied after the dot product, so the whole thing takes one pass over K.
- SILU_MUL: x = silu(gate) * up, read from the packed [gate | up] vector.
"""

import torch
import triton
import triton.language as tl

PLAIN, ADD_RMSNORM, SILU_MUL = 0, 1, 2


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_ym,
                 res_ptr, res_out_ptr, norm_ptr, eps,
                 M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 PROLOGUE: tl.constexpr, ZERO_CENTERED: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    cols0 = tl.arange(0, BLOCK_K)
    for m in tl.static_range(M):
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        sumsq = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + cols0
            col_ok = cols < K
            if EVEN_K:
                w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None], other=0.0)
            else:
                w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            x = tl.load(x_ptr + m * stride_xm + cols, mask=col_ok, other=0.0)
            if PROLOGUE == 1:
                # the residual sum is rounded to the model dtype, as the unfused add is
                s = (x.to(tl.float32) + tl.load(res_ptr + cols, mask=col_ok, other=0.0).to(tl.float32))
                s = s.to(x.dtype)
                if pid == 0:
                    tl.store(res_out_ptr + cols, s, mask=col_ok)
                sf = s.to(tl.float32)
                sumsq += sf * sf
                g = tl.load(norm_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
                if ZERO_CENTERED:
                    g = g + 1.0
                xf = sf * g
            elif PROLOGUE == 2:
                gate = x.to(tl.float32)
                up = tl.load(x_ptr + m * stride_xm + K + cols, mask=col_ok, other=0.0).to(tl.float32)
                xf = gate / (1.0 + tl.exp(-gate)) * up
            else:
                xf = x.to(tl.float32)
            acc += w.to(tl.float32) * xf[None, :]
        y = tl.sum(acc, axis=1)
        if PROLOGUE == 1:
            y = y * tl.rsqrt(tl.sum(sumsq, axis=0) / K + eps)
        tl.store(y_ptr + m * stride_ym + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


def _launch(x, weight, k, prologue, block_n, block_k, num_warps, num_stages, residual=None, norm=None, eps=0.0,
            zero_centered=False):
    M = x.shape[0]
    N = weight.shape[0]
    assert weight.shape[1] == k and weight.stride(1) == 1, "weight must be [N, K] with dense rows"
    assert x.stride(1) == 1 and 1 <= M <= 4, "x must be [M <= 4, K] with a dense last dim"
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    res_out = torch.empty(1, k, dtype=x.dtype, device=x.device) if prologue == ADD_RMSNORM else y
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, weight, y, N, k, x.stride(0), weight.stride(0), y.stride(0),
        residual if residual is not None else x, res_out, norm if norm is not None else x, eps,
        M=M, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0, PROLOGUE=prologue,
        ZERO_CENTERED=zero_centered, num_warps=num_warps, num_stages=num_stages)
    return y, res_out


def gemv(x: torch.Tensor, weight: torch.Tensor, *, block_n: int = 8, block_k: int = 512, num_warps: int = 4,
         num_stages: int = 3) -> torch.Tensor:
    """Same contract as gemv_ref: x [M, K] (M <= 4), weight [N, K] row-major -> y [M, N] in x.dtype."""
    return _launch(x, weight, x.shape[1], PLAIN, block_n, block_k, num_warps, num_stages)[0]


def add_rmsnorm_gemv(x, residual, norm_weight, eps: float, zero_centered: bool, weight, *, block_n: int = 8,
                     block_k: int = 512, num_warps: int = 4, num_stages: int = 3):
    """Same contract as add_rmsnorm_gemv_ref: x, residual [1, K] -> (y [1, N], x + residual [1, K])."""
    assert x.shape[0] == 1 and residual.shape == x.shape and residual.stride(1) == 1 and norm_weight.is_contiguous()
    return _launch(x, weight, x.shape[1], ADD_RMSNORM, block_n, block_k, num_warps, num_stages, residual,
                   norm_weight, eps, zero_centered)


def silu_mul_gemv(gate_up: torch.Tensor, weight: torch.Tensor, *, block_n: int = 8, block_k: int = 512,
                  num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """Same contract as silu_mul_gemv_ref: gate_up [1, 2K] -> y [1, N]."""
    assert gate_up.shape[0] == 1
    return _launch(gate_up, weight, gate_up.shape[1] // 2, SILU_MUL, block_n, block_k, num_warps, num_stages)[0]
