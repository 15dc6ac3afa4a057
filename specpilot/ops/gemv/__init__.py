"""Decode GEMV: y = x W^T for 1..32 rows, dispatched to the Triton kernels on CUDA (M = 1: FMA GEMV; M = 2..32:
the tensor-core skinny kernel; above 16 rows only on the shapes where it beat cuBLAS), each with its per-shape
launch config."""

import torch

from specpilot.ops.dispatch import use_triton
from specpilot.ops.gemv.reference import gated_gemv_ref, gemv_ref

__all__ = ["MAX_M", "gated_gemv", "gated_gemv_ref", "gemv", "gemv_ref"]

MAX_M = 32  # = triton.MAX_M (kept here: the dispatch must import without triton)


def gemv(x: torch.Tensor, weight: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """x [M <= 32, K], weight [N, K] -> y [M, N]; pdl: the kernel launches with programmatic dependent launch
    (ops/pdl.py)."""
    if use_triton(x):
        from specpilot.ops.gemv import configs, triton

        if x.shape[0] == 1:
            block_n, block_k, num_warps, pre_tiles = configs.gemv_config(*weight.shape)
            return triton.gemv(x, weight, block_n=block_n, block_k=block_k, num_warps=num_warps, pre_tiles=pre_tiles,
                               pdl=pdl)
        config = configs.skinny_config(*weight.shape, x.shape[0])
        if config is None:
            return torch.nn.functional.linear(x, weight)
        block_n, block_k, num_warps, num_stages = config
        return triton.skinny(x, weight, block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages,
                             pdl=pdl)
    return gemv_ref(x, weight)


def gated_gemv(gate_up: torch.Tensor, weight: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """gate_up [1, 2K], weight [N, K] -> (silu(gate) * up) W^T [1, N] in one kernel."""
    assert gate_up.shape[0] == 1, "the gated GEMV takes one row (see layers/linear.py: Linear.gated)"
    if use_triton(gate_up):
        from specpilot.ops.gemv import configs, triton

        block_n, block_k, num_warps, pre_tiles = configs.gemv_config(*weight.shape)
        return triton.gemv(gate_up, weight, block_n=block_n, block_k=block_k, num_warps=num_warps,
                           pre_tiles=pre_tiles, gated=True, pdl=pdl)
    return gated_gemv_ref(gate_up, weight)
