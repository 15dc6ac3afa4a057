"""SwiGLU MLP with gate and up projections packed into one matrix (one GEMV at decode)."""

from __future__ import annotations

import torch
from torch import nn

from specpilot.layers.linear import Linear
from specpilot.layers.packed import PackedLinear


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_up_proj = PackedLinear(hidden, {"gate_proj": intermediate, "up_proj": intermediate}, bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.gated(self.gate_up_proj(x))
