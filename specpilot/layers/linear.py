"""Linear: nn.Linear whose single-row products (batch-1 decode) can run the Triton GEMV instead of cuBLAS.

The switch is a region the runner opens around decode steps (EngineConfig.decode_gemv); everywhere else,
and for any product of more than one row, it is a plain F.linear. In the region, the add + RMSNorm before a
projection and the SiLU-and-mul before down_proj fold into the GEMV's launch (forward_norm,
forward_silu_mul). The weight format dispatch (W12N) lands here too.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from specpilot.layers import pointwise as pw
from specpilot.ops.gemv import add_rmsnorm_gemv, gemv, silu_mul_gemv

_gemv_enabled = False


@contextlib.contextmanager
def decode_gemv(enabled: bool = True):
    global _gemv_enabled
    previous, _gemv_enabled = _gemv_enabled, enabled
    try:
        yield
    finally:
        _gemv_enabled = previous


class Linear(nn.Linear):
    def _single_row(self, x: torch.Tensor) -> bool:
        return _gemv_enabled and self.bias is None and x.numel() == x.shape[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._single_row(x):
            return gemv(x.reshape(1, -1), self.weight).view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)

    def forward_norm(self, x: torch.Tensor, residual: torch.Tensor | None, norm) -> tuple[torch.Tensor, torch.Tensor]:
        """This projection of norm(x + residual); returns it and x + residual (the first layer has no residual)."""
        if residual is None:
            return self(norm(x)), x
        if self._single_row(x):
            y, s = add_rmsnorm_gemv(x.reshape(1, -1), residual.reshape(1, -1), norm.weight, norm.eps,
                                    norm.zero_centered, self.weight)
            return y.view(*x.shape[:-1], self.out_features), s.view_as(x)
        h, residual = norm.add_forward(x, residual)
        return self(h), residual

    def forward_silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """This projection of silu(gate) * up, gate_up = [gate | up] on the last dim."""
        if self._single_row(gate_up):
            return silu_mul_gemv(gate_up.reshape(1, -1), self.weight).view(*gate_up.shape[:-1], self.out_features)
        return self(pw.silu_mul(gate_up))
