"""DFlash (v1) block drafter, loading z-lab `DFlashDraftModel` checkpoints.

A few Qwen3-style layers with no embedding and no LM head of their own (the target's are borrowed). The
target's hidden states at `target_layer_ids` are concatenated, projected by `fc` and normalised by
`hidden_norm`; every draft layer turns that context into extra keys and values (its own k_proj / v_proj /
k_norm, RoPE at the tokens' absolute positions), kept in the drafter's cache. One forward over the block
[root, MASK x (B-1)], bidirectional inside the block and seeing all context, gives a distribution for each
of the B-1 next positions: a chain takes the argmax of each, a tree the top candidates per position.
Block K/V are never cached; after verification the accepted tokens' target features extend the context.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specpilot.config import ConfigError, ModelConfig
from specpilot.engine.cache import ModelCache
from specpilot.layers import pointwise as pw
from specpilot.layers.attention import Attention, block_attention
from specpilot.layers.linear import Linear
from specpilot.layers.metadata import BatchMetadata
from specpilot.layers.mlp import MLP
from specpilot.layers.norm import RMSNorm
from specpilot.layers.rotary import RotaryEmbedding
from specpilot.models.causal_lm import CausalLM
from specpilot.models.loader import CheckpointError, load_weights, resolve_dtype, safetensors_files
from specpilot.spec.tree import DraftTree, TreeSpec, grow

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

    def context_kv(self, ctx: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """ctx [B, n, H] projected target context -> its keys and values [B, n, KVH, D] for this layer."""
        attn = self.self_attn
        kvh, d = attn.num_kv_heads, attn.head_dim
        start, _ = attn.qkv_proj.shard_rows("k_proj")
        kv = torch.nn.functional.linear(ctx, attn.qkv_proj.weight[start:])
        k, v = kv.view(ctx.shape[0], -1, 2 * kvh, d).split(kvh, dim=2)
        k = pw.apply_rotary(attn.k_norm(k), cos, sin)
        return k, v

    def forward(self, x, meta: BatchMetadata, kv, cos, sin) -> torch.Tensor:
        attn = self.self_attn
        B, T, _ = x.shape
        H, KVH, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
        q, k, v = attn.qkv_proj(self.input_layernorm(x)).split([H * D, KVH * D, KVH * D], dim=-1)
        q, k = pw.qk_norm_rope(q.view(B, T, H, D), k.view(B, T, KVH, D), attn.q_norm.weight, attn.k_norm.weight,
                               cos, sin, attn.q_norm.eps, False)
        out = block_attention(q, k, v.view(B, T, KVH, D), kv, meta, attn.scale)
        x = x + attn.o_proj(out.reshape(B, T, H * D))
        return x + self.mlp.down_proj(pw.silu_mul(self.mlp.gate_up_proj(self.post_attention_layernorm(x))))


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

    def add_context(self, features: torch.Tensor, positions: torch.Tensor, cache: ModelCache, slot: int) -> None:
        """features [n, K * H] of tokens at `positions` [n] -> their K/V in every layer's cache slot."""
        ctx = self.hidden_norm(self.fc(features[None].to(self.fc.weight.dtype)))
        cos, sin = self.rotary(positions[None])
        for i, layer in enumerate(self.layers):
            k, v = layer.context_kv(ctx, cos, sin)
            k_cache, v_cache = cache.kv(i)
            k_cache[slot, :, positions] = k[0].transpose(0, 1).to(k_cache.dtype)
            v_cache[slot, :, positions] = v[0].transpose(0, 1).to(v_cache.dtype)

    def forward(self, embeds: torch.Tensor, meta: BatchMetadata, cache: ModelCache) -> torch.Tensor:
        """embeds [1, B, H] of the block -> final-normed hidden [1, B, H]; the block sees all of it and the
        cached context (meta.block_mask all true)."""
        cos, sin = self.rotary(meta.positions)
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, meta, cache.kv(i), cos, sin)
        return self.norm(x)


class DFlashDrafter:
    name = "dflash"

    def __init__(self, model: DFlashModel, target: CausalLM, target_layers: tuple[int, ...], block_size: int,
                 mask_token_id: int):
        self.model, self.target = model, target
        self.target_layers, self.block_size, self.mask_token_id = tuple(target_layers), block_size, mask_token_id
        self.device = next(model.parameters()).device
        self.cache: ModelCache | None = None
        self.context_len: dict[int, int] = {}

    def allocate(self, num_slots: int, max_seq_len: int) -> None:
        c = self.cache
        if c is None or c.num_slots < num_slots or c.max_seq_len < max_seq_len:
            self.cache = ModelCache(self.model.config, num_slots, max_seq_len, self.device, self.model.fc.weight.dtype)

    @torch.inference_mode()
    def start(self, slot: int, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        self.context_len[slot] = 0
        self._extend(slot, features)

    @torch.inference_mode()
    def commit(self, slot: int, accepted: list[int], features: torch.Tensor | None) -> None:
        self._extend(slot, features)

    def _extend(self, slot: int, features: torch.Tensor) -> None:
        start = self.context_len[slot]
        positions = torch.arange(start, start + features.shape[0], device=self.device)
        self.model.add_context(features, positions, self.cache, slot)
        self.context_len[slot] = start + features.shape[0]

    @torch.inference_mode()
    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]:
        return [self._propose_one(slot, root, spec) for slot, root in zip(slots, roots)]

    def block_logits(self, slot: int, root: int) -> torch.Tensor:
        """Draft logits [B-1, vocab] for the positions after the root (the root sits at the context length)."""
        B, start, dev = self.block_size, self.context_len[slot], self.device
        ids = torch.tensor([[root] + [self.mask_token_id] * (B - 1)], device=dev)
        meta = BatchMetadata(ids, start + torch.arange(B, device=dev)[None], ids, torch.tensor([slot], device=dev),
                             torch.tensor([start], device=dev), start, torch.ones(1, B, B, dtype=torch.bool,
                                                                                  device=dev))
        hidden = self.model(self.target.model.embed_tokens(ids), meta, self.cache)
        return self.target.logits(hidden[0, 1:]).float()

    def _propose_one(self, slot: int, root: int, spec: TreeSpec) -> DraftTree:
        logits = self.block_logits(slot, root)
        depth = min(spec.depth, self.block_size - 1)
        if spec.kind == "chain":
            return DraftTree.chain([root] + logits[:depth].argmax(-1).tolist())
        width = max(max(spec.branching, default=1), spec.top_k)
        top = torch.log_softmax(logits, dim=-1).topk(width, dim=-1)
        tokens, logps = top.indices.tolist(), top.values.tolist()
        capped = TreeSpec(spec.kind, depth, spec.branching[:depth], spec.top_k, spec.max_nodes)
        # positions in a block are predicted independently: a node's children are its depth's top tokens
        return grow(capped, root, lambda tree, frontier: [(tokens[tree.depths[f]], logps[tree.depths[f]])
                                                          for f in frontier])


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


def load_dflash(model_dir: Path, target: CausalLM, dtype="auto") -> DFlashDrafter:
    cfg, layers, block, mask_id, raw = read_config(model_dir)
    tcfg = target.config
    if layers is None:
        layers = default_target_layers(int(raw.get("num_target_layers", tcfg.num_hidden_layers)), cfg.num_hidden_layers)
    if cfg.vocab_size != tcfg.vocab_size:
        raise CheckpointError(f"{model_dir}: vocab_size {cfg.vocab_size} differs from the target's {tcfg.vocab_size}; "
                              "a DFlash drafter is trained for one target vocabulary")
    if cfg.hidden_size != tcfg.hidden_size:
        raise CheckpointError(f"{model_dir}: hidden_size {cfg.hidden_size} differs from the target's "
                              f"{tcfg.hidden_size}; DFlash borrows the target's embedding and LM head")
    if not 0 <= mask_id < tcfg.vocab_size:
        raise CheckpointError(f"{model_dir}: mask_token_id {mask_id} is outside the target vocabulary "
                              f"({tcfg.vocab_size})")
    if any(not 0 <= i < tcfg.num_hidden_layers for i in layers):
        raise CheckpointError(f"{model_dir}: target_layer_ids {list(layers)} out of range for a "
                              f"{tcfg.num_hidden_layers}-layer target")
    param = next(target.parameters())
    dtype = param.dtype if dtype == "auto" else resolve_dtype(dtype, param.device)
    with torch.device("meta"):
        model = DFlashModel(cfg, len(layers))
    model = model.to(dtype=dtype).to_empty(device=param.device)
    model.reset_buffers()
    load_weights(model, safetensors_files(model_dir))
    return DFlashDrafter(model.eval().requires_grad_(False), target, layers, block, mask_id)
