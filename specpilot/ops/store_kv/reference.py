"""Reference K/V store: advanced-index assignment into the cache."""

import torch


def store_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slots: torch.Tensor, loc: torch.Tensor) -> None:
    """k, v [B, T, KVH, D] -> k_cache, v_cache [N, KVH, S, D] at [slots[b], :, loc[b, t]]."""
    idx = (slots[:, None], slice(None), loc)
    k_cache[idx] = k.to(k_cache.dtype)
    v_cache[idx] = v.to(v_cache.dtype)
