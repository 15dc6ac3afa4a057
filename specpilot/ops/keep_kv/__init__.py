"""Compacts the K/V of kept tree paths into consecutive positions (the K/V half of a tree commit)."""

from specpilot.ops.dispatch import use_triton
from specpilot.ops.keep_kv.reference import keep_kv_ref
from specpilot.ops.path_index import PathIndex

__all__ = ["keep_kv", "keep_kv_ref"]


def keep_kv(k_cache, v_cache, index: PathIndex) -> None:
    """k_cache, v_cache [L, N, KVH, S, D]; index: each request's slot, base and kept path -> moved in place."""
    if use_triton(k_cache):
        from specpilot.ops.keep_kv.triton import keep_kv as kernel

        return kernel(k_cache, v_cache, index)
    return keep_kv_ref(k_cache, v_cache, index)
