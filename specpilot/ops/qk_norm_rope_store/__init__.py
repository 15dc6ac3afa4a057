"""Decode prologue of an attention layer in one kernel: q/k per-head RMSNorm, RoPE, and the K/V cache store."""

import torch

from specpilot.ops.dispatch import takes, use_triton
from specpilot.ops.qk_norm_rope_store.reference import qk_norm_rope_store_ref

__all__ = ["qk_norm_rope_store", "qk_norm_rope_store_ref"]


def qk_norm_rope_store(q, k, v, q_weight, k_weight, cos, sin, eps: float, zero_centered: bool,
                       k_cache, v_cache, slots, loc, pdl: bool = False) -> torch.Tensor:
    """pointwise.qk_norm_rope's arguments, then store_kv's cache, slots and loc -> rotated q [B, T, H, D]
    (contiguous); the rotated k and the v are written into the cache. Contract: qk_norm_rope_store_ref. pdl: the
    kernel launches with programmatic dependent launch (ops/pdl.py)."""
    if use_triton(q):
        from specpilot.ops.qk_norm_rope_store.triton import qk_norm_rope_store as qk_norm_rope_store_triton
        from specpilot.ops.qk_norm_rope_store.triton import supports

        if takes("qk_norm_rope_store", supports(q, k, q_weight, k_weight, cos)):
            return qk_norm_rope_store_triton(q, k, v, q_weight, k_weight, cos, sin, eps, zero_centered,
                                             k_cache, v_cache, slots, loc, pdl=pdl)
    return qk_norm_rope_store_ref(q, k, v, q_weight, k_weight, cos, sin, eps, zero_centered,
                                  k_cache, v_cache, slots, loc)
