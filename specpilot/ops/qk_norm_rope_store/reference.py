"""Reference decode prologue of an attention layer: per-head RMSNorm of q and k, RoPE, then the K/V store.

Today's unfused path written out in plain torch (layers.pointwise.qk_norm_rope, then store_kv_ref), rounding
step for step included; it lives here so that ops never import layers, and a test holds it equal to that path.
"""

import torch

from specpilot.ops.store_kv.reference import store_kv_ref


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool) -> torch.Tensor:
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        # Qwen3.5 rounding: the (1 + w) scale is applied in fp32 before the cast
        return (n * (1.0 + weight.float())).to(x.dtype)
    # Llama / Qwen3 rounding: cast, then scale in the model dtype
    return weight * n.to(x.dtype)


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r = cos.shape[-1]
    cos, sin = cos.to(x.dtype)[:, :, None, :], sin.to(x.dtype)[:, :, None, :]
    x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
    rot = x[..., :r] * cos + torch.cat((-x2, x1), dim=-1) * sin
    return torch.cat((rot, x[..., r:]), dim=-1)


def qk_norm_rope_store_ref(q, k, v, q_weight, k_weight, cos, sin, eps: float, zero_centered: bool,
                           k_cache, v_cache, slots, loc) -> torch.Tensor:
    """q [B, T, H, D], k/v [B, T, KVH, D]; q_weight/k_weight [D] (None: no norm); cos/sin [B, T, R] fp32,
    R <= D rotary dims in the rotate-half layout; caches [N, KVH, S, D]; slots [B]; loc [B, T]
    -> rotated q [B, T, H, D]; rotated k and v written at k_cache/v_cache[slots[b], :, loc[b, t]]."""
    if q_weight is not None:
        q, k = _norm(q, q_weight, eps, zero_centered), _norm(k, k_weight, eps, zero_centered)
    q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
    store_kv_ref(k, v, k_cache, v_cache, slots, loc)
    return q
