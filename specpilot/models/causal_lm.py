"""CausalLM: the decoder stack every family shares (embedding, pre-norm layers, final norm, LM head).

A family file supplies `build_layer(cfg, index)` and its checkpoint layout; parameter names follow the
Hugging Face checkpoints (model.layers.N.self_attn..., lm_head.weight) except where projections are packed.
The model also accounts for its own cost (bytes read per decoded token, cache bytes) for the roofline.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from specpilot.config import ModelConfig
from specpilot.layers.linear import Linear
from specpilot.layers.metadata import BatchMetadata
from specpilot.layers.norm import RMSNorm
from specpilot.layers.paths import PLAIN, KernelPaths
from specpilot.layers.rotary import RotaryEmbedding


class DecoderLayer(nn.Module):
    def __init__(self, mixer: nn.Module, mixer_name: str, mlp: nn.Module, cfg: ModelConfig, zero_centered: bool):
        super().__init__()
        self.mixer_name = mixer_name
        setattr(self, mixer_name, mixer)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered)
        self.cache_index = -1  # index into the cache's attention or linear-state arrays, set by CausalLM

    def forward(self, x, residual, meta: BatchMetadata, cache, cos, sin):
        paths = meta.paths
        if residual is None:
            residual, h = x, self.input_layernorm(x, paths)
        else:
            h, residual = self.input_layernorm.add_forward(x, residual, paths)
        if self.mixer_name == "self_attn":
            h = self.self_attn(h, meta, cache.kv(self.cache_index), cos, sin)
        else:
            h = self.linear_attn(h, meta, cache, self.cache_index)
        h, residual = self.post_attention_layernorm.add_forward(h, residual, paths)
        return self.mlp(h, paths), residual


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, build_layer: Callable[[ModelConfig, int], DecoderLayer], zero_centered: bool):
        super().__init__()
        self.config = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(build_layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)
        # called with each decoder layer's index after it runs: where a CUDA graph capture may cut
        # (specpilot/runtime/graphs.py)
        self.after_layer: Callable[[int], None] | None = None
        counters = {"self_attn": 0, "linear_attn": 0}
        for layer in self.model.layers:
            layer.cache_index = counters[layer.mixer_name]
            counters[layer.mixer_name] += 1

    def tie_weights(self) -> None:
        """Share the embedding with the LM head when the config says so (moving to a device unties them)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers (after the model was built on the meta device)."""
        self.rotary.reset_buffers()

    def forward(self, meta: BatchMetadata, cache, capture_layers: tuple[int, ...] = ()):
        """Returns the final-normed hidden states [B, T, hidden] and, if asked, the outputs of the given decoder
        layers (0-based, before the final norm) as a list in the order asked."""
        x = self.model.embed_tokens(meta.input_ids)
        cos, sin = self.rotary(meta.positions)
        residual, captured = None, {}
        for i, layer in enumerate(self.model.layers):
            x, residual = layer(x, residual, meta, cache, cos, sin)
            if i in capture_layers:
                captured[i] = x + residual
            if self.after_layer is not None:
                self.after_layer(i)
        x, _ = self.model.norm.add_forward(x, residual, meta.paths)
        return (x, [captured[i] for i in capture_layers]) if capture_layers else x

    def logits(self, hidden: torch.Tensor, paths: KernelPaths = PLAIN) -> torch.Tensor:
        return self.lm_head(hidden, paths)

    def weight_bytes_per_token(self) -> int:
        """Bytes of parameters a decode step reads: every weight except the embedding table (one row is read)."""
        total = sum(p.numel() * p.element_size() for p in self.parameters())
        emb = self.model.embed_tokens.weight
        if not self.config.tie_word_embeddings:
            total -= emb.numel() * emb.element_size() - emb.shape[1] * emb.element_size()
        return total
