"""Short depthwise causal conv (+ SiLU) of Gated DeltaNet layers: torch prefill, and the pooled-state update
(Triton on CUDA, torch reference elsewhere)."""

import torch

from ..dispatch import takes, use_triton
from .reference import causal_conv1d_prefill, causal_conv1d_update_ref

__all__ = ["causal_conv1d_prefill", "causal_conv1d_update", "causal_conv1d_update_ref"]


def causal_conv1d_update(
    x: torch.Tensor, conv_state_pool: torch.Tensor, state_idx: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """silu(causal conv) of x [B,T,C] continuing from conv_state_pool[state_idx], state updated in place.

    See reference.causal_conv1d_update_ref for shapes.
    """
    if use_triton(x):
        from . import triton  # only here: CPU-only installs have no triton and never take this branch

        if takes("causal_conv1d_update", triton.supports(weight)):
            return triton.causal_conv1d_update(x, conv_state_pool, state_idx, weight)
    return causal_conv1d_update_ref(x, conv_state_pool, state_idx, weight)
