"""Triton SwiGLU activation: program (row block, column block) reads its gate and up tiles and writes the product."""

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, R, N, stride_x, stride_y, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = (rows < R)[:, None] & (cols < N)[None, :]
    base = x_ptr + rows.to(tl.int64)[:, None] * stride_x + cols[None, :]
    g = tl.load(base, mask=m, other=0.0).to(tl.float32)
    u = tl.load(base + N, mask=m, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u  # as the gated GEMVs form it (ops/gemv)
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=m)


def supports(gate_up: torch.Tensor) -> bool:
    """Rows with a dense last dimension of even width."""
    return gate_up.shape[-1] % 2 == 0 and gate_up.stride(-1) == 1 and gate_up.numel() > 0


def silu_mul(gate_up: torch.Tensor, *, block_r: int = 16, block_n: int = 256, num_warps: int = 4) -> torch.Tensor:
    """Same contract as reference.silu_mul_ref (gate_up [..., 2N] with a dense last dimension)."""
    two_n = gate_up.shape[-1]
    x = gate_up.reshape(-1, two_n)  # a view: the last dimension is dense
    R, N = x.shape[0], two_n // 2
    y = torch.empty(R, N, dtype=gate_up.dtype, device=gate_up.device)
    grid = (triton.cdiv(R, block_r), triton.cdiv(N, block_n))
    _silu_mul_kernel[grid](x, y, R, N, x.stride(0), y.stride(0), BLOCK_R=block_r, BLOCK_N=block_n,
                           num_warps=num_warps)
    return y.view(*gate_up.shape[:-1], N)
