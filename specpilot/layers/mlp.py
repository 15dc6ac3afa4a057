"""SwiGLU MLP with gate and up projections packed into one matrix (one GEMV at decode)."""

from __future__ import annotations

import torch
from torch import nn

from specpilot.layers.linear import Linear
from specpilot.layers.packed import PackedLinear
from specpilot.layers.paths import PLAIN, KernelPaths


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_up_proj = PackedLinear(hidden, {"gate_proj": intermediate, "up_proj": intermediate}, bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)
        self.gate_up_proj.glu = True

    def forward(self, x: torch.Tensor, paths: KernelPaths = PLAIN) -> torch.Tensor:
        h = self.gate_up_proj.swiglu(x, paths)  # W12N: silu(gate) * up in the GEMV's epilogue
        if h is None:
            return self.down_proj.gated(self.gate_up_proj(x, paths), paths)
        return self.down_proj(h, paths)
