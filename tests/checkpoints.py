"""Tiny random checkpoints of every supported architecture, created and saved with transformers' classes.

Every weight (norms, A_log, dt_bias included) is drawn at random so that parity tests cannot pass by
accident on zero or identity parameters. A tiny byte-level BPE tokenizer is saved beside the weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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


def hf_config(name: str, **overrides):
    config_cls, _, kw = CONFIGS[name]
    return config_cls(**{**kw, **overrides})


def randomize(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.01, 4).log())
            elif p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.2 + (0.0 if "norm" in name and "linear_attn.norm" not in name else 1.0))
            else:
                p.normal_(0, 0.08)


def write_checkpoint(name: str, path: Path, **overrides):
    config = hf_config(name, **overrides)
    model_cls = CONFIGS[name][1]
    torch.manual_seed(0)
    model = model_cls(config).eval()
    randomize(model)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path)
    return model


def write_tokenizer(path: Path, vocab_size: int = VOCAB) -> None:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = ["def add(a, b):\n    return a + b\n", "the quick brown fox jumps over the lazy dog. " * 4,
            "for i in range(10):\n    print(i * i)\n"]
    tok.train_from_iterator(text * 20, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(path)
