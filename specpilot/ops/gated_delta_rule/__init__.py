"""Qwen3.5 Gated DeltaNet core: gating, the chunked prefill form (torch, or one Triton kernel on CUDA when asked),
and the fused recurrent decode op (Triton on CUDA, torch reference elsewhere)."""

import torch

from ..dispatch import takes, use_triton
from . import chunk as _chunk
from .reference import fused_recurrent_gated_delta_rule_ref, gdn_gating, recurrent_gated_delta_rule

__all__ = [
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_ref",
    "gdn_gating",
    "recurrent_gated_delta_rule",
]


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
    *,
    kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule -> (o [B,T,HV,V] in v.dtype, final state [B,HV,K,V] fp32); see chunk.py for shapes.

    kernel: on CUDA, one Triton launch over all chunks (triton.py; EngineConfig.ablations.triton_gdn_prefill) instead
    of the torch form's dozens of small ops per chunk.
    """
    if kernel and use_triton(v):
        from . import triton  # only here: CPU-only installs have no triton and never take this branch

        if takes("chunk_gated_delta_rule", triton.supports(q)):
            return triton.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, scale, chunk_size)
    return _chunk.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, scale, chunk_size)


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_pool: torch.Tensor,
    state_idx: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Gating + recurrence from state_pool[state_idx], final state written back in place; o [B,T,HV,V].

    See reference.fused_recurrent_gated_delta_rule_ref for shapes.
    """
    if use_triton(q):
        from . import triton

        if takes("fused_recurrent_gated_delta_rule", triton.supports(q)):
            return triton.fused_recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, state_pool, state_idx, scale)
    return fused_recurrent_gated_delta_rule_ref(q, k, v, a, b, A_log, dt_bias, state_pool, state_idx, scale)
