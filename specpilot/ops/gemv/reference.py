"""Reference decode GEMVs: y = x W^T with fp32 accumulation, and the two fused-prologue forms.

The fused forms define their own rounding: the normalised (or gated) input vector is kept in fp32 and the
RMSNorm factor is applied after the dot product, which is the same math as norm-then-linear without the
intermediate rounding to the model dtype.
"""

import torch
import torch.nn.functional as F


def gemv_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K], weight [N, K] -> y [M, N] in x.dtype (accumulated in fp32)."""
    return (x.float() @ weight.float().t()).to(x.dtype)


def add_rmsnorm_gemv_ref(x, residual, norm_weight, eps: float, zero_centered: bool, weight):
    """x, residual [1, K]; norm_weight [K]; weight [N, K] -> (y [1, N], s = x + residual [1, K]).

    y = W (g * s) * rsqrt(mean(s^2) + eps), g = norm_weight (+ 1 when zero-centred), s rounded to x.dtype.
    """
    s = (x.float() + residual.float()).to(x.dtype)
    sf = s.float()
    g = norm_weight.float() + (1.0 if zero_centered else 0.0)
    scale = torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)
    return ((sf * g) @ weight.float().t() * scale).to(x.dtype), s


def silu_mul_gemv_ref(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """gate_up [1, 2K] ([gate | up]); weight [N, K] -> y [1, N] = W (silu(gate) * up), fp32 inside."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return ((F.silu(gate) * up) @ weight.float().t()).to(gate_up.dtype)
