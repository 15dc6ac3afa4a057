"""Reference RMSNorm with an optional residual add, in the rounding of the pointwise helpers (layers/pointwise.py)."""

import torch


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                     zero_centered: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(s), s) with s = x + residual (x if residual is None), rows of the last dim.

    Plain (Llama, Qwen3): weight * normalise(s).to(dtype). Zero-centred (Qwen3.5): (normalise(s) * (1 + w)) in
    fp32, then cast."""
    s = x if residual is None else x + residual
    sf = s.float()
    n = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)
    out = (n * (1.0 + weight.float())).to(s.dtype) if zero_centered else weight * n.to(s.dtype)
    return out, s
