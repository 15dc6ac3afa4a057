"""RMSNorm with an optional residual add (decode rows under PDL, prefill chunks): the Triton kernel on CUDA, else the
reference."""

import torch

from specpilot.ops.dispatch import use_triton
from specpilot.ops.rms_norm.reference import add_rms_norm_ref

__all__ = ["add_rms_norm", "add_rms_norm_ref"]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 zero_centered: bool, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """pdl: the kernel launches with programmatic dependent launch (ops/pdl.py)."""
    if use_triton(x):
        from specpilot.ops.rms_norm.triton import add_rms_norm as add_rms_norm_triton

        return add_rms_norm_triton(x, residual, weight, eps, zero_centered, pdl=pdl)
    return add_rms_norm_ref(x, residual, weight, eps, zero_centered)
