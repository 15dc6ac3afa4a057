"""Tiny random checkpoints of every supported architecture, created and saved with transformers' classes.

Every weight (norms, A_log, dt_bias included) is drawn at random so that parity tests cannot pass by
accident on zero or identity parameters. A tiny byte-level BPE tokenizer is saved beside the weights.
"""

from __future__ import annotations

from pathlib import Path

import transformers

from specpilot.models.random_checkpoint import write_random_checkpoint

VOCAB = 320

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)

CONFIGS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(BASE, head_dim=16, rope_theta=10000.0)),
    "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
               dict(BASE, head_dim=16, num_key_value_heads=1, tie_word_embeddings=True, max_position_embeddings=512,
                    rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0, original_max_position_embeddings=64))),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(BASE, head_dim=16, tie_word_embeddings=True)),
    "qwen3_untied": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                     dict(BASE, head_dim=24, num_key_value_heads=4, tie_word_embeddings=False)),
    "qwen3_5": (transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM,
                dict(BASE, num_hidden_layers=4, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                     linear_key_head_dim=16, linear_value_head_dim=8, full_attention_interval=2)),
}


TEXTS = ["def add(a, b):\n    return a + b\n", "the quick brown fox jumps over the lazy dog. " * 4,
         "for i in range(10):\n    print(i * i)\n"] * 20


def hf_config(name: str, **overrides):
    config_cls, model_cls, kw = CONFIGS[name]
    return config_cls(**{**kw, **overrides}, architectures=[model_cls.__name__])


def write_checkpoint(name: str, path: Path, **overrides):
    return write_random_checkpoint(hf_config(name, **overrides), path, TEXTS)
