"""Reference matrix-vector product for decode: y = x W^T with fp32 accumulation."""

import torch


def gemv_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K], weight [N, K] -> y [M, N] in x.dtype (accumulated in fp32)."""
    return (x.float() @ weight.float().t()).to(x.dtype)
