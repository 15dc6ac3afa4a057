"""Qwen3.5 hybrid family: Gated DeltaNet layers and gated full-attention layers, zero-centred RMSNorm.

Loads both Qwen3_5ForCausalLM checkpoints and the text tower of Qwen3_5ForConditionalGeneration, whose keys
live under model.language_model.* (the vision tower and the MTP head are not part of the text model).
"""

from specpilot.config import ModelConfig
from specpilot.layers.attention import Attention
from specpilot.layers.gated_deltanet import GatedDeltaNet
from specpilot.layers.mlp import MLP
from specpilot.models.causal_lm import CausalLM, DecoderLayer

CHECKPOINT_PREFIXES = {"model.language_model.": "model.", "": ""}


def build_layer(cfg: ModelConfig, index: int) -> DecoderLayer:
    mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
    if cfg.layer_types[index] == "linear_attention":
        return DecoderLayer(GatedDeltaNet(cfg), "linear_attn", mlp, cfg, True)
    attn = Attention(cfg, qk_norm=True, output_gate=True, zero_centered_norm=True)
    return DecoderLayer(attn, "self_attn", mlp, cfg, True)


def build(cfg: ModelConfig) -> CausalLM:
    return CausalLM(cfg, build_layer, zero_centered=True)
