"""The DFlash (v1) draft network (z-lab `DFlashDraftModel` checkpoints) and its config.

A few Qwen3-style layers with no embedding and no LM head of their own (the target's are borrowed). The
target's hidden states at `target_layer_ids` are concatenated, projected by `fc` and normalised by
`hidden_norm`; every draft layer turns that context into extra keys and values (its own k_proj / v_proj /
k_norm, RoPE at the tokens' absolute positions), kept in the drafter's cache. One forward over a block
[root, MASK x (B-1)], bidirectional inside the block and seeing all context, gives the hidden states of the
B-1 next positions. The drafter that runs it is spec_decode/drafters/dflash.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specpilot.config import ConfigError, ModelConfig
from specpilot.layers import pointwise as pw
from specpilot.layers.attention import Attention
from specpilot.layers.linear import Linear
from specpilot.layers.metadata import BatchMetadata
from specpilot.layers.mlp import MLP
from specpilot.layers.norm import RMSNorm
from specpilot.layers.paths import PLAIN, KernelPaths
from specpilot.layers.rotary import RotaryEmbedding

ARCHITECTURES = ("DFlashDraftModel",)


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The reference spread when a checkpoint does not list its layers: 1 .. L-3, evenly."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, qk_norm=True, output_gate=False)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def context_kv(self, ctx: torch.Tensor, cos, sin, paths: KernelPaths = PLAIN) -> tuple[torch.Tensor, torch.Tensor]:
        """ctx [B, n, H] projected target context -> its keys and values [B, n, KVH, D] for this layer."""
        attn = self.self_attn
        kvh, d = attn.num_kv_heads, attn.head_dim
        start, _ = attn.qkv_proj.shard_rows("k_proj")
        kv = torch.nn.functional.linear(ctx, attn.qkv_proj.weight[start:])
        k, v = kv.view(ctx.shape[0], -1, 2 * kvh, d).split(kvh, dim=2)
        k = pw.apply_rotary(attn.k_norm(k, paths), cos, sin, compiled=paths.compiled)
        return k, v

    def forward(self, x, meta: BatchMetadata, kv, cos, sin) -> torch.Tensor:
        """The block's K/V are stored at meta.cache_loc, then attend to the prefix and the whole block (the
        tree-attention op under meta.paths.block_kernel, else SDPA)."""
        paths = meta.paths
        x = x + self.self_attn(self.input_layernorm(x, paths), meta, kv, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x, paths), paths)


class DFlashModel(nn.Module):
    def __init__(self, cfg: ModelConfig, num_features: int):
        super().__init__()
        self.config = cfg
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = Linear(num_features * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)

    def tie_weights(self) -> None:
        pass

    def reset_buffers(self) -> None:
        self.rotary.reset_buffers()

    def add_context(self, features: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                    cache, paths: KernelPaths = PLAIN) -> None:
        """features [n, K * H] of tokens at `positions` [n] of cache slots `slots` [n] (any mix of requests)
        -> their K/V in every layer's cache."""
        ctx = self.hidden_norm(self.fc(features[None].to(self.fc.weight.dtype), paths), paths)
        cos, sin = self.rotary(positions[None])
        for i, layer in enumerate(self.layers):
            k, v = layer.context_kv(ctx, cos, sin, paths)
            k_cache, v_cache = cache.kv(i)
            k_cache[slots, :, positions] = k[0].to(k_cache.dtype)
            v_cache[slots, :, positions] = v[0].to(v_cache.dtype)

    def forward(self, embeds: torch.Tensor, meta: BatchMetadata, cache) -> torch.Tensor:
        """embeds [R, B, H] of the blocks -> final-normed hidden [R, B, H]; a block sees all of itself and its
        cached context (meta.block_mask all true)."""
        cos, sin = self.rotary(meta.positions)
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, meta, cache.kv(i), cos, sin)
        return self.norm(x, meta.paths)


def read_config(model_dir: Path) -> tuple[ModelConfig, tuple[int, ...] | None, int, int, dict]:
    raw = json.loads((model_dir / "config.json").read_text())
    extra = dict(raw.get("dflash_config") or {})
    if raw.get("is_causal") or extra.get("causal") or "sliding_attention" in (raw.get("layer_types") or []):
        raise NotImplementedError(f"{model_dir}: causal or sliding-window DFlash layers are not supported yet")
    cfg = ModelConfig.from_dict({**raw, "architectures": ["Qwen3ForCausalLM"]}, source=str(model_dir / "config.json"))
    block = raw.get("block_size", extra.get("block_size"))
    if "mask_token_id" not in extra or block is None:
        raise ConfigError(f"{model_dir}/config.json: a DFlash config needs block_size and dflash_config.mask_token_id")
    layers = extra.get("target_layer_ids")
    return cfg, tuple(layers) if layers else None, int(block), int(extra["mask_token_id"]), raw
