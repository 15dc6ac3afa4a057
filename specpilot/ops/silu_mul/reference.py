"""The torch truth of the SwiGLU activation: silu(gate) * up in fp32, rounded once to the input dtype."""

import torch
import torch.nn.functional as F


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gate_up.dtype)
