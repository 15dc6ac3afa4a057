"""Decode GEMV: y = x W^T for a few rows, dispatched to the Triton kernel on CUDA."""

import torch

from specpilot.ops.dispatch import use_triton
from specpilot.ops.gemv.reference import gemv_ref

__all__ = ["gemv", "gemv_ref"]


def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K], weight [N, K] -> y [M, N]."""
    if use_triton(x):
        from specpilot.ops.gemv.configs import gemv_config
        from specpilot.ops.gemv.triton import gemv as gemv_triton

        block_n, block_k, num_warps = gemv_config(*weight.shape)
        return gemv_triton(x, weight, block_n=block_n, block_k=block_k, num_warps=num_warps)
    return gemv_ref(x, weight)
