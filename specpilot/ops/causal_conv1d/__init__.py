"""Short depthwise causal conv (+ SiLU) of Gated DeltaNet layers: the prefill of a block from a state, and the
pooled-state update (each Triton on CUDA, its torch reference elsewhere)."""

import torch

from ..dispatch import takes, use_triton
from .reference import causal_conv1d_prefill_ref, causal_conv1d_update_ref

__all__ = ["causal_conv1d_prefill", "causal_conv1d_prefill_ref", "causal_conv1d_update", "causal_conv1d_update_ref"]


def causal_conv1d_prefill(
    x: torch.Tensor, weight: torch.Tensor, initial_state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu(causal conv) of x [B,T,C] after initial_state [B,C,W-1] or zeros, the last W-1 inputs), in x.dtype.

    See reference.causal_conv1d_prefill_ref for shapes.
    """
    if use_triton(x):
        from . import triton

        if takes("causal_conv1d_prefill", triton.supports(weight)):
            return triton.causal_conv1d_prefill(x, weight, initial_state)
    return causal_conv1d_prefill_ref(x, weight, initial_state)


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
