"""Attention of a block of T tokens per request (a draft tree, a chain, a prefill chunk) over the request's
committed KV prefix plus the block itself under a per-request block mask; slotted KV cache, GQA."""

import torch

from specpilot.ops.dispatch import takes, use_triton
from specpilot.ops.tree_attention.reference import tree_attention_ref

__all__ = ["tree_attention", "tree_attention_ref"]


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    prefix_len: torch.Tensor,
    cache_loc: torch.Tensor,
    block_mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """q [B, T, H, D]; k_cache, v_cache [N, KVH, S, D]; slots, prefix_len [B] int; cache_loc [B, T] int;
    block_mask [B, T, T] bool or None (causal) -> o [B, T, H, D]. The block's K/V must already be in the cache."""
    if use_triton(q):
        # Imported lazily so CPU-only installs without triton can still use the reference.
        from specpilot.ops.tree_attention.triton import supports
        from specpilot.ops.tree_attention.triton import tree_attention as tree_attention_triton

        if takes("tree_attention", supports(q)):
            return tree_attention_triton(q, k_cache, v_cache, slots, prefix_len, cache_loc, block_mask, scale)
    return tree_attention_ref(q, k_cache, v_cache, slots, prefix_len, cache_loc, block_mask, scale)
