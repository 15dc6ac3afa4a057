"""Full-attention layer (Llama, Qwen3, Qwen3.5 gated attention) over the preallocated KV cache.

One block of T tokens per request: q/k/v from one packed projection, optional per-head q/k norm, RoPE at the
given positions, K/V written into the slot at `cache_loc`, then attention over the committed prefix plus the
block under `block_mask`. A single causal token (AR decode) takes the split-K decode kernel. The step's
`meta.paths` (layers/paths.py) choose the rest: a causal block of one request, or of requests whose prefixes the
host knows are equal (`equal_prefix`: prefill_many's chunks), with `causal_sdpa`, through SDPA's FlashAttention /
memory-efficient kernel where they take it; other multi-token blocks through the tree-attention op
(`block_kernel`: the committed K/V read once for all block tokens) or SDPA; and, with `fused_qk_rope_store`, a
decode step or a tree-op block normalises and rotates q and k and stores k and v in one kernel
(ops/qk_norm_rope_store) instead of the pointwise helper, then store_kv.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from specpilot.config import ModelConfig
from specpilot.layers import pointwise as pw
from specpilot.layers.linear import Linear
from specpilot.layers.metadata import BatchMetadata, MixedMetadata, join, segments
from specpilot.layers.norm import RMSNorm
from specpilot.layers.packed import PackedLinear
from specpilot.ops.decode_attention import decode_attention
from specpilot.ops.qk_norm_rope_store import qk_norm_rope_store
from specpilot.ops.store_kv import store_kv
from specpilot.ops.tree_attention import tree_attention


SDPA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
FUSED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, qk_norm: bool, output_gate: bool, zero_centered_norm: bool = False):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.output_gate = output_gate
        q_rows = self.num_heads * self.head_dim * (2 if output_gate else 1)
        kv_rows = self.num_kv_heads * self.head_dim
        shards = {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows}
        self.qkv_proj = PackedLinear(cfg.hidden_size, shards, bias=cfg.attention_bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=cfg.attention_bias)
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, zero_centered_norm)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, zero_centered_norm)
        else:
            self.q_norm = self.k_norm = None
        self.scale = self.head_dim**-0.5

    def forward(self, x, meta: BatchMetadata | MixedMetadata, kv: tuple[torch.Tensor, torch.Tensor], cos,
                sin) -> torch.Tensor:
        """x [B, T, hidden] of one block, or [1, N, hidden] of a MixedMetadata's blocks (the projections once over
        all of them, the attention per block)."""
        qkv = self.qkv_proj(x, meta.paths)
        out = join([self._mix(*seg, kv) for seg in segments(meta, qkv, cos, sin)])
        return self.o_proj(out, meta.paths)

    def _mix(self, meta: BatchMetadata, qkv, cos, sin, kv) -> torch.Tensor:
        """One block's packed projections [B, T, q|k|v] -> its attention output [B, T, H * D] (K/V stored)."""
        B, T, _ = qkv.shape
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        q_rows = H * D * (2 if self.output_gate else 1)
        paths = meta.paths
        q, k, v = qkv.split([q_rows, KVH * D, KVH * D], dim=-1)
        gate = None
        if self.output_gate:
            # strided views, no copies: the fused norm/RoPE and gate kernels read them in place
            q, gate = q.view(B, T, H, 2 * D).chunk(2, dim=-1)
        else:
            q = q.view(B, T, H, D)
        k, v = k.view(B, T, KVH, D), v.view(B, T, KVH, D)
        q_weight, k_weight, eps, zero_centered = self._norms()
        if paths.fused_qk_rope_store and (meta.is_decode or paths.block_kernel):
            q = qk_norm_rope_store(q, k, v, q_weight, k_weight, cos, sin, eps, zero_centered, kv[0], kv[1],
                                   meta.slots, meta.cache_loc, pdl=paths.pdl)
            out = decode(q, kv, meta, self.scale) if meta.is_decode else tree_attention(
                q, kv[0], kv[1], meta.slots, meta.prefix_len, meta.cache_loc, meta.block_mask, self.scale)
        else:
            q, k = pw.qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, zero_centered, compiled=paths.compiled)
            out = attend(q, k, v, kv, meta, self.scale)
        if gate is not None:
            out = pw.sigmoid_gate(out, gate, compiled=paths.compiled)
        return out.reshape(B, T, H * D)

    def _norms(self):
        """(q weight, k weight, eps, zero-centred) of the per-head norms; None weights when the model has none."""
        if self.q_norm is None:
            return None, None, 0.0, False
        return self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, self.q_norm.zero_centered


def attend(q, k, v, kv, meta: BatchMetadata, scale: float) -> torch.Tensor:
    """q [B, T, H, D], k/v [B, T, KVH, D] of the new block -> [B, T, H, D]; writes the block into the cache."""
    store_kv(k, v, kv[0], kv[1], meta.slots, meta.cache_loc)
    if meta.is_decode:
        return decode(q, kv, meta, scale)
    # one request, or prefixes the host knows are equal: a shorter prefix than max_prefix_len would read stale rows
    if (meta.paths.causal_sdpa and meta.block_mask is None and (q.shape[0] == 1 or meta.equal_prefix)
            and fused_sdpa_fits(q, kv)):
        return causal_block_attention(q, kv, meta, scale)
    if meta.paths.block_kernel:
        return tree_attention(q, kv[0], kv[1], meta.slots, meta.prefix_len, meta.cache_loc, meta.block_mask, scale)
    return block_attention(q, k, v, kv, meta, scale)


def decode(q, kv, meta: BatchMetadata, scale: float) -> torch.Tensor:
    """q [B, 1, H, D] of one causal token per request, whose K/V are already stored -> [B, 1, H, D]."""
    kv_len = meta.kv_len if meta.kv_len is not None else meta.prefix_len + 1
    paths = meta.paths
    return decode_attention(q[:, 0].contiguous(), kv[0], kv[1], meta.slots, kv_len, scale,
                            paths.decode_splits or None, pdl=paths.pdl)[:, None]


def block_attention(q, k, v, kv, meta: BatchMetadata, scale: float) -> torch.Tensor:
    """Attention of a block over the committed prefix (read from the cache) and the block itself (masked)."""
    B, T, H, D = q.shape
    KVH = k.shape[2]
    G = H // KVH
    P = meta.max_prefix_len
    prefix_k = kv[0][meta.slots, :, :P].to(q.dtype)  # [B, KVH, P, D]
    prefix_v = kv[1][meta.slots, :, :P].to(q.dtype)
    keys = torch.cat((prefix_k, k.transpose(1, 2)), dim=2)  # [B, KVH, P+T, D]
    values = torch.cat((prefix_v, v.transpose(1, 2)), dim=2)
    prefix_ok = torch.arange(P, device=q.device)[None, :] < meta.prefix_len[:, None]  # [B, P]
    block_ok = meta.block_mask
    if block_ok is None:
        block_ok = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()[None].expand(B, T, T)
    mask = torch.cat((prefix_ok[:, None, :].expand(B, T, P), block_ok), dim=-1)  # [B, T, P+T]
    # grouped-query attention without repeating K/V: the G query heads of a KV head become G*T query rows
    qg = q.reshape(B, T, KVH, G, D).permute(0, 2, 3, 1, 4).reshape(B, KVH, G * T, D)
    mask = mask[:, None, None].expand(B, 1, G, T, P + T).reshape(B, 1, G * T, P + T)
    # cuDNN's SDPA builds an execution plan per new shape, and P grows every step (docs/drafters.md)
    with sdpa_kernel(SDPA_BACKENDS):
        out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask, scale=scale)
    return out.view(B, KVH, G, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, H, D)


def fused_sdpa_fits(q, kv) -> bool:
    """Whether SDPA's FlashAttention kernel (any GQA ratio) or its memory-efficient one (as many K/V heads as query
    heads) takes causal_block_attention's inputs: q [B, T, H, D] and the cache's dtype, head dim and layout."""
    B, T, H, D = q.shape
    KVH = kv[0].shape[1]
    if H % KVH:
        return False
    rows = kv[0][:B, :, :T]  # stands in for the K/V read from the cache: same dtype, heads, head dim, last stride
    params = SDPAParams(q.transpose(1, 2), rows, rows, None, 0.0, False, True)
    return can_use_flash_attention(params) or (H == KVH and can_use_efficient_attention(params))


def causal_block_attention(q, kv, meta: BatchMetadata, scale: float, backends=FUSED_BACKENDS) -> torch.Tensor:
    """q [B, T, H, D] of a causal block stored at positions P .. P+T-1 of each slot (P = meta.max_prefix_len, which
    must be every request's prefix: attend takes this path for B == 1 or meta.equal_prefix) -> [B, T, H, D]:
    attention over the slot's cache rows [0, P+T), bottom-right causal (block token t sees rows up to P + t), in one
    fused SDPA call (the K/V heads shared by their query-head groups inside the kernel)."""
    T = q.shape[1]
    end = meta.max_prefix_len + T
    keys = kv[0][meta.slots, :, :end].to(q.dtype)  # [B, KVH, P+T, D], the block's rows just written by store_kv
    values = kv[1][meta.slots, :, :end].to(q.dtype)
    with sdpa_kernel(backends):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=causal_lower_right(T, end),
                                             scale=scale, enable_gqa=True)
    return out.transpose(1, 2)
