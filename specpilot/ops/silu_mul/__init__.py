"""SwiGLU activation silu(gate) * up of an MLP's packed [gate | up] rows: the Triton kernel on CUDA (one read of the
rows, one write of the product), the torch reference elsewhere."""

import torch

from specpilot.ops.dispatch import takes, use_triton
from specpilot.ops.silu_mul.reference import silu_mul_ref

__all__ = ["silu_mul", "silu_mul_ref"]


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2N] -> silu(gate) * up [..., N] in gate_up's dtype, formed in fp32 and rounded once."""
    if use_triton(gate_up):
        from specpilot.ops.silu_mul import triton

        if takes("silu_mul", triton.supports(gate_up)):
            return triton.silu_mul(gate_up)
    return silu_mul_ref(gate_up)
