"""Qwen3 dense family (Qwen3ForCausalLM): Llama layout plus per-head RMSNorm on q and k before RoPE."""

from specpilot.config import ModelConfig
from specpilot.layers.attention import Attention
from specpilot.layers.mlp import MLP
from specpilot.models.causal_lm import CausalLM, DecoderLayer

CHECKPOINT_PREFIXES = {"": ""}


def build_layer(cfg: ModelConfig, index: int) -> DecoderLayer:
    attn = Attention(cfg, qk_norm=True, output_gate=False)
    return DecoderLayer(attn, "self_attn", MLP(cfg.hidden_size, cfg.intermediate_size), cfg, False)


def build(cfg: ModelConfig) -> CausalLM:
    return CausalLM(cfg, build_layer, zero_centered=False)
