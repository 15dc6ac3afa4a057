"""Reference matrix-vector product for decode: y = x W^T with fp32 accumulation."""

import torch


def gemv_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K], weight [N, K] -> y [M, N] in x.dtype (accumulated in fp32)."""
    return (x.float() @ weight.float().t()).to(x.dtype)


def gated_gemv_ref(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """gate_up [M, 2K] = [gate | up], weight [N, K] -> (silu(gate) * up) W^T [M, N]: the SwiGLU product is formed
    in fp32 and rounded once to gate_up.dtype (as the compiled silu_mul helper does), then gemv_ref."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return gemv_ref((torch.nn.functional.silu(gate) * up).to(gate_up.dtype), weight)
