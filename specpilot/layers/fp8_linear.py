"""Fp8Linear: a bias-free linear layer whose weight is held as FP8 E4M3 with one scale (ops/fp8_linear).

Approximate by design: it serves products whose error cannot reach the output, such as a drafter's LM head.
"""

from __future__ import annotations

import torch
from torch import nn

from specpilot.layers.paths import PLAIN, KernelPaths
from specpilot.ops.fp8_linear import fp8_linear, quantize_weight


class Fp8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, scale: torch.Tensor):
        """weight [N, K] float8_e4m3fn, scale: the fp32 scalar tensor with W ~= weight * scale."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)

    @classmethod
    def quantized(cls, weight: torch.Tensor) -> Fp8Linear:
        """The FP8 copy of a [N, K] weight (bf16 / fp32)."""
        return cls(*quantize_weight(weight.detach()))

    def forward(self, x: torch.Tensor, paths: KernelPaths = PLAIN) -> torch.Tensor:
        y = fp8_linear(x.reshape(-1, x.shape[-1]), self.weight, self.scale)
        return y.view(*x.shape[:-1], self.out_features)
