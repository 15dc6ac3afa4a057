"""Real-shape random-weight models for benchmarks: the exact shapes of public checkpoints, weights drawn like
trained ones (normal, std 0.02, bf16; norms at identity), built on the device in seconds. Acceptance on such
weights means nothing, so they are always paired with synthetic acceptance.

Also the matching DFlash drafters (Qwen3-8B: 5 layers; Qwen3.5-27B: 5 layers, about the size of the public
DFlash2 drafter, 3.7 GB vs 3.85 GB in bf16) and a byte tokenizer for prompts (ids are bytes: any text
works, and token content does not matter under synthetic acceptance).
"""

from __future__ import annotations

import torch
import transformers

from specpilot.config import ModelConfig
from specpilot.models.loader import build_empty

SHAPES = {
    "tiny-dense": (transformers.Qwen3Config, dict(
        architectures=["Qwen3ForCausalLM"], vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    "tiny-hybrid": (transformers.Qwen3_5TextConfig, dict(
        architectures=["Qwen3_5ForCausalLM"], vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, full_attention_interval=2)),
    "Qwen3-8B": (transformers.Qwen3Config, dict(
        architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=4096, intermediate_size=12288,
        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rope_theta=1000000.0, tie_word_embeddings=False)),
    "Qwen3.5-27B": (transformers.Qwen3_5TextConfig, dict(
        architectures=["Qwen3_5ForCausalLM"], vocab_size=248320, hidden_size=5120, intermediate_size=17408,
        num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
        full_attention_interval=4, max_position_embeddings=262144)),
}
DFLASH_LAYERS = {"Qwen3-8B": 5, "Qwen3.5-27B": 5, "tiny-dense": 1, "tiny-hybrid": 1}


def hf_config(shape: str, **overrides):
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: use one of {', '.join(SHAPES)}")
    config_cls, kw = SHAPES[shape]
    return config_cls(**{**kw, **overrides})


def clean(w: torch.Tensor, floor: float = 1e-4) -> torch.Tensor:
    """w with magnitudes below floor raised to floor, signs kept: no weight escapes the W12N exponent window, so
    the encoding has no escapes and no verbatim segments."""
    return torch.where(w.abs() < floor, torch.where(w < 0, -floor, floor).to(w.dtype), w)


def random_model(hf_cfg, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                 clean_weights: bool = False):
    """N(0, 0.02) matrices, identity norms. clean_weights: matrix magnitudes below 1e-4 raised to 1e-4, so that
    no weight escapes the W12N exponent window (random weights otherwise have verbatim segments, which trained
    checkpoints mostly lack, and the W12N GEMV then runs its fix-up path)."""
    cfg = ModelConfig.from_dict(hf_cfg.to_dict())
    model = build_empty(cfg, torch.device(device), dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape, device=device).uniform_(1, 16, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.fill_(1.0)
            elif p.ndim == 1:
                # plain norms scale by w (=1), zero-centred ones by 1 + w (w=0): both the identity
                zero_centered = cfg.family == "qwen3_5" and "linear_attn.norm" not in name
                p.fill_(0.0 if zero_centered else 1.0)
            else:
                p.normal_(0, 0.02, generator=gen)
                if clean_weights:
                    p.copy_(clean(p))
    return model


def random_dflash(target, shape: str, block: int = 8, seed: int = 1):
    """A DFlash drafter of the shape's size with random weights, for timing under synthetic acceptance."""
    from specpilot.spec.drafters.dflash import DFlashDrafter, DFlashModel, default_target_layers
    from specpilot.train.dflash import draft_config

    layers = DFLASH_LAYERS.get(shape, 5)
    depth = target.config.num_hidden_layers
    taps = default_target_layers(depth, layers) if depth >= 5 else tuple(range(depth))
    param = next(target.parameters())
    with torch.device("meta"):
        model = DFlashModel(draft_config(target.config, layers), len(taps))
    model = model.to(dtype=param.dtype).to_empty(device=param.device)
    model.reset_buffers()
    gen = torch.Generator(device=param.device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0) if p.ndim == 1 else p.normal_(0, 0.02, generator=gen)
    return DFlashDrafter(model.eval().requires_grad_(False), target, taps, block, mask_token_id=0)


class ByteTokenizer:
    """UTF-8 bytes as token ids (no model vocabulary needed): prompts for random-weight targets."""

    eos_token_id = None
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8")) or [0]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
