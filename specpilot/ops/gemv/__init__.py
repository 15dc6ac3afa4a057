"""Decode GEMVs (y = x W^T for one row), optionally fused with the preceding add+RMSNorm or SiLU-and-mul.

On CUDA they run the Triton kernel with the per-shape launch config of configs.py; elsewhere the reference.
"""

import torch

from specpilot.ops.dispatch import use_triton
from specpilot.ops.gemv.configs import gemv_config
from specpilot.ops.gemv.reference import add_rmsnorm_gemv_ref, gemv_ref, silu_mul_gemv_ref

__all__ = ["gemv", "add_rmsnorm_gemv", "silu_mul_gemv", "gemv_ref", "add_rmsnorm_gemv_ref", "silu_mul_gemv_ref"]


def _config(weight: torch.Tensor) -> dict:
    block_n, block_k, num_warps = gemv_config(*weight.shape)
    return dict(block_n=block_n, block_k=block_k, num_warps=num_warps)


def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K], weight [N, K] -> y [M, N]."""
    if use_triton(x):
        from specpilot.ops.gemv import triton as kernels

        return kernels.gemv(x, weight, **_config(weight))
    return gemv_ref(x, weight)


def add_rmsnorm_gemv(x, residual, norm_weight, eps: float, zero_centered: bool, weight):
    """x, residual [1, K] -> (W rmsnorm(x + residual) [1, N], x + residual [1, K])."""
    if use_triton(x):
        from specpilot.ops.gemv import triton as kernels

        return kernels.add_rmsnorm_gemv(x, residual, norm_weight, eps, zero_centered, weight, **_config(weight))
    return add_rmsnorm_gemv_ref(x, residual, norm_weight, eps, zero_centered, weight)


def silu_mul_gemv(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """gate_up [1, 2K] -> W (silu(gate) * up) [1, N]."""
    if use_triton(gate_up):
        from specpilot.ops.gemv import triton as kernels

        return kernels.silu_mul_gemv(gate_up, weight, **_config(weight))
    return silu_mul_gemv_ref(gate_up, weight)
