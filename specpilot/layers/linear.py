"""Linear: nn.Linear whose single-row products (batch-1 decode) can run the Triton GEMV instead of cuBLAS.

The switch is a region the runner opens around decode steps (EngineConfig.decode_gemv); everywhere else,
and for any product of more than one row, it is a plain F.linear. The weight format dispatch (W12N) lands
here too.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from specpilot.ops.gemv import gemv

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
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _gemv_enabled and self.bias is None and x.numel() == x.shape[-1]:
            return gemv(x.reshape(1, -1), self.weight).view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)
