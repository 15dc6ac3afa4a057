"""Writes a block of new K/V rows into the slotted KV cache (one kernel for K and V on GPU)."""

from specpilot.ops.dispatch import use_triton
from specpilot.ops.store_kv.reference import store_kv_ref

__all__ = ["store_kv", "store_kv_ref"]


def store_kv(k, v, k_cache, v_cache, slots, loc) -> None:
    """k, v [B, T, KVH, D]; k_cache, v_cache [N, KVH, S, D]; slots [B]; loc [B, T] -> cache rows written in place."""
    if use_triton(k):
        from specpilot.ops.store_kv.triton import store_kv as store_kv_triton

        return store_kv_triton(k, v, k_cache, v_cache, slots, loc)
    return store_kv_ref(k, v, k_cache, v_cache, slots, loc)
