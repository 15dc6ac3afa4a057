"""Plain-torch tree attention over a slotted KV cache: the truth the Triton kernel is tested against."""

import torch


def tree_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    prefix_len: torch.Tensor,
    cache_loc: torch.Tensor,
    block_mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """A block of T tokens per request attends to its committed prefix plus the block itself under a mask.

    q [B, T, H, D]; k_cache, v_cache [N, KVH, S, D]; slots, prefix_len [B] int; cache_loc [B, T] int (where
    block token t's K/V already sits in slot slots[b]); block_mask [B, T, T] bool (query i sees block token j),
    None = causal. Every query of request b sees prefix positions 0..prefix_len[b]-1.
    Returns o [B, T, H, D] in q.dtype. Query head h reads kv head h // (H // KVH). Softmax in fp32.
    """
    B, T, H, D = q.shape
    KVH, S = k_cache.shape[1], k_cache.shape[2]
    G = H // KVH
    # Prefix: all S positions of the slot (S, not max(prefix_len), so there is no host sync), live below
    # prefix_len. Dead positions may hold anything (NaN included): zero them so 0-probability * NaN cannot leak in.
    live = torch.arange(S, device=q.device)[None, :] < prefix_len[:, None]  # [B, S]
    dead = ~live[:, None, :, None]  # [B, 1, S, 1]
    prefix_k = k_cache[slots].float().masked_fill(dead, 0.0)  # [B, KVH, S, D]
    prefix_v = v_cache[slots].float().masked_fill(dead, 0.0)
    # Block: the rows at cache_loc (advanced indices around a slice put their [B, T] dims first).
    block_k = k_cache[slots[:, None], :, cache_loc].float().transpose(1, 2)  # [B, KVH, T, D]
    block_v = v_cache[slots[:, None], :, cache_loc].float().transpose(1, 2)
    keys = torch.cat((prefix_k, block_k), dim=2)  # [B, KVH, S+T, D]
    values = torch.cat((prefix_v, block_v), dim=2)

    if block_mask is None:
        block_mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril().expand(B, T, T)
    mask = torch.cat((live[:, None, :].expand(B, T, S), block_mask.bool()), dim=-1)  # [B, T, S+T]

    # GQA without repeating K/V: the G query heads of a kv head are grouped next to it.
    qg = q.float().reshape(B, T, KVH, G, D).permute(0, 2, 3, 1, 4)  # [B, KVH, G, T, D]
    scores = torch.einsum("bkgtd,bksd->bkgts", qg, keys) * scale
    scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    o = torch.einsum("bkgts,bksd->bkgtd", scores.softmax(dim=-1), values)
    return o.permute(0, 3, 1, 2, 4).reshape(B, T, H, D).to(q.dtype)
