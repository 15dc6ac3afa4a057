"""Llama family (LlamaForCausalLM, Llama 3 / 3.1 with "llama3" RoPE scaling): GQA attention, SwiGLU MLP."""

from specpilot.config import ModelConfig
from specpilot.layers.attention import Attention
from specpilot.layers.mlp import MLP
from specpilot.models.causal_lm import CausalLM, DecoderLayer

CHECKPOINT_PREFIXES = {"": ""}


def build_layer(cfg: ModelConfig, index: int) -> DecoderLayer:
    attn = Attention(cfg, qk_norm=False, output_gate=False)
    return DecoderLayer(attn, "self_attn", MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias), cfg, False)


def build(cfg: ModelConfig) -> CausalLM:
    return CausalLM(cfg, build_layer, zero_centered=False)
