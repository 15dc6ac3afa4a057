"""Plain-torch batch decode attention over a slotted KV cache: the truth the Triton kernel is tested against."""

import torch


def decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot: torch.Tensor,
    kv_len: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per request attends to positions 0..kv_len[b]-1 of cache slot slot[b].

    q [B, H, D]; k_cache, v_cache [N, KVH, S, D]; slot, kv_len [B] int; returns o [B, H, D] in q.dtype.
    Query head h reads kv head h // (H // KVH). Softmax in fp32.
    """
    B, H, D = q.shape
    KVH, S = k_cache.shape[1], k_cache.shape[2]
    live = torch.arange(S, device=q.device)[None, :] < kv_len[:, None]  # [B, S]
    # Dead positions may hold anything (NaN included): zero them so 0-probability * NaN cannot leak in.
    dead = ~live[:, None, :, None]  # [B, 1, S, 1]
    k = k_cache[slot].float().masked_fill(dead, 0.0)  # [B, KVH, S, D]
    v = v_cache[slot].float().masked_fill(dead, 0.0)
    qg = q.float().reshape(B, KVH, H // KVH, D)  # [B, KVH, G, D]
    scores = torch.einsum("bkgd,bksd->bkgs", qg, k) * scale
    scores = scores.masked_fill(~live[:, None, None, :], float("-inf"))
    o = torch.einsum("bkgs,bksd->bkgd", scores.softmax(dim=-1), v)
    return o.reshape(B, H, D).to(q.dtype)
