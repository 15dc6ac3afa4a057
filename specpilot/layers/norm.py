"""RMSNorm modules: plain (Llama, Qwen3) and zero-centred (Qwen3.5, weight stored as w with scale 1 + w)."""

from __future__ import annotations

import torch
from torch import nn

from specpilot.layers import pointwise as pw
from specpilot.layers.paths import PLAIN, KernelPaths
from specpilot.ops import pdl
from specpilot.ops.rms_norm import add_rms_norm


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, zero_centered: bool = False):
        super().__init__()
        self.eps, self.zero_centered = eps, zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def _kernel(self, x: torch.Tensor, paths: KernelPaths) -> bool:
        """Whether ops/rms_norm's kernel takes x: under PDL (decode) or for many-row blocks (row_kernels), on CUDA,
        rows with a dense last dimension."""
        return (pdl.usable(x, paths.pdl) or (paths.row_kernels and x.is_cuda)) and x.stride(-1) == 1

    def forward(self, x: torch.Tensor, paths: KernelPaths = PLAIN) -> torch.Tensor:
        if self._kernel(x, paths):  # under PDL the norm kernel lets the next projection launch early
            return add_rms_norm(x, None, self.weight, self.eps, self.zero_centered, pdl=paths.pdl)[0]
        fn = pw.rms_norm_zero_centered if self.zero_centered else pw.rms_norm
        return fn(x, self.weight, self.eps, compiled=paths.compiled)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor,
                    paths: KernelPaths = PLAIN) -> tuple[torch.Tensor, torch.Tensor]:
        """norm(x + residual), x + residual in one fused pass."""
        if self._kernel(x, paths) and residual.stride(-1) == 1:
            return add_rms_norm(x, residual, self.weight, self.eps, self.zero_centered, pdl=paths.pdl)
        fn = pw.add_rms_norm_zero_centered if self.zero_centered else pw.add_rms_norm
        return fn(x, residual, self.weight, self.eps, compiled=paths.compiled)
