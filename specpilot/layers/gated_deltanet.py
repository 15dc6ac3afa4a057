"""Gated DeltaNet layer (Qwen3.5 linear attention) with its per-request conv window and fp32 delta-rule state.

in_proj packs the checkpoint's in_proj_qkv | in_proj_z | in_proj_b | in_proj_a (one GEMV at decode). The
short causal conv and the delta rule read and update the request's state slot in place. Short blocks (decode,
chains) take the fused recurrent kernel; long blocks (prefill) the chunked form. A tree block (meta.block_mask
set) runs the conv through parent pointers and the tree-masked delta rule from the committed state, writes no
state, and stashes per node what the commit of the kept path needs into the cache's buffers
(ModelCache.tree_stash_out, then ModelCache.commit_tree). With `meta.paths.gdn_prefill_kernel` the chunked form
runs on CUDA as fla-core's chunked kernel where it is installed, else as our one Triton kernel per layer, instead of
the torch form (ops.gated_delta_rule.prefill_kernel chooses).
"""

from __future__ import annotations

import torch
from torch import nn

from specpilot.config import ModelConfig
from specpilot.layers import pointwise as pw
from specpilot.layers.linear import Linear
from specpilot.layers.metadata import BatchMetadata, MixedMetadata, join, segments
from specpilot.layers.packed import PackedLinear
from specpilot.ops.causal_conv1d import causal_conv1d_prefill, causal_conv1d_update
from specpilot.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, gdn_gating
from specpilot.ops.gdn_tree import tree_causal_conv1d, tree_gated_delta_rule

# blocks up to this many tokens run the token-by-token kernel; longer ones the chunked (WY) form
RECURRENT_MAX_TOKENS = 16


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.H, self.HV = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.K, self.V = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = self.H * self.K, self.HV * self.V
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.eps = cfg.rms_norm_eps
        shards = {"in_proj_qkv": self.conv_dim, "in_proj_z": self.value_dim, "in_proj_b": self.HV, "in_proj_a": self.HV}
        self.in_proj = PackedLinear(cfg.hidden_size, shards)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.linear_conv_kernel_dim, groups=self.conv_dim, bias=False)
        self.A_log = nn.Parameter(torch.zeros(self.HV))
        self.dt_bias = nn.Parameter(torch.ones(self.HV))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(self.V))
        self.out_proj = Linear(self.value_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, meta: BatchMetadata | MixedMetadata, cache, index: int) -> torch.Tensor:
        """x [B, T, hidden] of one block, or [1, N, hidden] of a MixedMetadata's blocks (the projections once over
        all of them, the conv and the delta rule per block)."""
        projected = self.in_proj(x, meta.paths)
        out = join([self._mix(*seg, cache, index) for seg in segments(meta, projected)])
        return self.out_proj(out, meta.paths)

    def _mix(self, meta: BatchMetadata, projected: torch.Tensor, cache, index: int) -> torch.Tensor:
        """One block's packed projections [B, T, qkv|z|b|a] -> its normed, gated output [B, T, HV * V]."""
        B, T, _ = projected.shape
        conv_pool, ssm_pool = cache.linear_state(index)  # [N, C, W-1], [N, HV, K, V] fp32
        mixed, z, b, a = projected.split([self.conv_dim, self.value_dim, self.HV, self.HV], dim=-1)
        weight = self.conv1d.weight[:, 0, :]  # [C, W]
        if meta.block_mask is not None:
            o = self._tree(mixed, a, b, weight, meta, cache, index)
        else:
            o = self._sequence(mixed, a, b, weight, meta, conv_pool, ssm_pool)
        o = pw.gated_rms_norm(o, z.reshape(B, T, self.HV, self.V), self.norm.weight, self.eps,
                              compiled=meta.paths.compiled)
        return o.reshape(B, T, self.value_dim)

    def _split_heads(self, mixed: torch.Tensor):
        B, T, _ = mixed.shape
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (q.reshape(B, T, self.H, self.K), k.reshape(B, T, self.H, self.K), v.reshape(B, T, self.HV, self.V))

    def _tree(self, mixed, a, b, weight, meta: BatchMetadata, cache, index: int) -> torch.Tensor:
        conv_pool, ssm_pool = cache.linear_state(index)
        # the pre-conv inputs and the fold terms go straight into the cache's stacked stash (one batched commit
        # for all layers)
        stash = cache.tree_stash_out(index, *mixed.shape[:2])
        conv = tree_causal_conv1d(mixed, meta.parents, conv_pool[meta.slots], weight, x_out=stash[0])
        q, k, v = self._split_heads(conv)
        g, beta = pw.gdn_gating(a, b, self.A_log, self.dt_bias, compiled=meta.paths.compiled)
        o, _ = tree_gated_delta_rule(q, k, v, g, beta, meta.block_mask, ssm_pool, out=stash[1:],
                                     state_slots=meta.slots)
        cache.tree_stash[index] = stash
        return o

    def _sequence(self, mixed, a, b, weight, meta: BatchMetadata, conv_pool, ssm_pool) -> torch.Tensor:
        T = mixed.shape[1]
        if T <= RECURRENT_MAX_TOKENS:
            mixed = causal_conv1d_update(mixed, conv_pool, meta.slots, weight)
        else:
            mixed, conv_final = causal_conv1d_prefill(mixed, weight, conv_pool[meta.slots])
            conv_pool[meta.slots] = conv_final.to(conv_pool.dtype)
        q, k, v = self._split_heads(mixed)
        if T <= RECURRENT_MAX_TOKENS:
            return fused_recurrent_gated_delta_rule(q, k, v, a, b, self.A_log, self.dt_bias, ssm_pool, meta.slots)
        g, beta = gdn_gating(a, b, self.A_log, self.dt_bias)
        o, final = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=ssm_pool[meta.slots],
                                          kernel=meta.paths.gdn_prefill_kernel)
        ssm_pool[meta.slots] = final
        return o
