"""Decode GEMV: y = x W^T for a few rows, dispatched to the Triton kernel on CUDA."""

import torch

from specpilot.ops.dispatch import use_triton
from specpilot.ops.gemv.reference import gemv_ref

__all__ = ["gemv", "gemv_ref"]


def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K], weight [N, K] -> y [M, N]."""
    if use_triton(x):
        from specpilot.ops.gemv.triton import gemv as gemv_triton

        return gemv_triton(x, weight)
    return gemv_ref(x, weight)
