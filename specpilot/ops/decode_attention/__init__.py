"""Batch decode attention (one query token per request) over a slotted, preallocated KV cache with GQA."""

import torch

from specpilot.ops.decode_attention.reference import decode_attention_ref
from specpilot.ops.dispatch import takes, use_triton

__all__ = ["decode_attention", "decode_attention_ref"]


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot: torch.Tensor,
    kv_len: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """q [B, H, D]; k_cache, v_cache [N, KVH, S, D]; slot, kv_len [B] int (kv_len >= 1) -> o [B, H, D].
    num_splits: sequence chunks per (request, kv head) on the GPU (default: from the shapes); pdl: the kernels
    launch with programmatic dependent launch (ops/pdl.py)."""
    if use_triton(q):
        # Imported lazily so CPU-only installs without triton can still use the reference.
        from specpilot.ops.decode_attention.triton import decode_attention as decode_attention_triton
        from specpilot.ops.decode_attention.triton import supports

        if takes("decode_attention", supports(q)):
            return decode_attention_triton(q, k_cache, v_cache, slot, kv_len, scale, num_splits=num_splits,
                                           pdl=pdl)
    return decode_attention_ref(q, k_cache, v_cache, slot, kv_len, scale)
