"""Random-weight Hugging Face checkpoints of any supported architecture, written with transformers' classes.

Used by the demo (until the trained zoo lands) and by the tests. Every weight is drawn at random, norms
included, and a small byte-level BPE tokenizer trained on the given text is saved beside the weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

EOS = "<|endoftext|>"


def randomize(model: torch.nn.Module, std: float = 0.08) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.01, 4).log())
            elif p.ndim == 1:
                # zero-centred norms (Qwen3.5) scale by 1 + w, all others by w
                centre = 0.0 if ("norm" in name and "linear_attn.norm" not in name and _zero_centered(model)) else 1.0
                p.copy_(torch.randn_like(p) * 0.2 + centre)
            else:
                p.normal_(0, std)


def _zero_centered(model) -> bool:
    return type(model).__name__.startswith("Qwen3_5")


def write_random_checkpoint(config, path: Path, texts: list[str], seed: int = 0):
    """Saves a random model of `config` (a transformers config) and a tokenizer to `path`; returns the HF model."""
    import transformers

    path = Path(path)
    arch = config.architectures[0] if config.architectures else None
    model_cls = getattr(transformers, arch) if arch else transformers.AutoModelForCausalLM.from_config
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    randomize(model)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path, config.vocab_size, texts)
    return model


def write_tokenizer(path: Path, vocab_size: int, texts, special_tokens: tuple[str, ...] = (EOS,)) -> None:
    """Trains a byte-level BPE tokenizer on `texts` and saves tokenizer.json + tokenizer_config.json (the first
    special token is EOS)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, special_tokens=list(special_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=special_tokens[0],
                                                additional_special_tokens=list(special_tokens[1:]) or None)
    fast.save_pretrained(path)
    # compact JSON: 40% of the pretty file, and the zoo commits three copies inside its 32 MB budget
    tok_file = Path(path) / "tokenizer.json"
    Tokenizer.from_file(str(tok_file)).save(str(tok_file), pretty=False)


def mtp_tensors(cfg, gen: torch.Generator, dtype: torch.dtype = torch.float32, std: float = 0.08) -> dict:
    """Random `mtp.*` tensors of a Qwen3.5 / Qwen3-Next MTP layer for a target of ModelConfig `cfg`, under the
    public key names and shapes (models/mtp.py); norms are zero-centred (scale 1 + w)."""
    H, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nH, nKV = cfg.num_attention_heads, cfg.num_key_value_heads

    def w(*shape, scale=std):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    p = "mtp.layers.0."
    return {"mtp.fc.weight": w(H, 2 * H), "mtp.pre_fc_norm_embedding.weight": w(H, scale=0.2),
            "mtp.pre_fc_norm_hidden.weight": w(H, scale=0.2), "mtp.norm.weight": w(H, scale=0.2),
            p + "input_layernorm.weight": w(H, scale=0.2), p + "post_attention_layernorm.weight": w(H, scale=0.2),
            p + "self_attn.q_proj.weight": w(2 * nH * D, H), p + "self_attn.k_proj.weight": w(nKV * D, H),
            p + "self_attn.v_proj.weight": w(nKV * D, H), p + "self_attn.o_proj.weight": w(H, nH * D),
            p + "self_attn.q_norm.weight": w(D, scale=0.2), p + "self_attn.k_norm.weight": w(D, scale=0.2),
            p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H), p + "mlp.down_proj.weight": w(H, I)}


def add_mtp_layer(path: Path, tensors: dict | None = None, seed: int = 0, dtype: torch.dtype = torch.float32) -> None:
    """Adds an MTP layer to the Qwen3.5 checkpoint at `path` as the public checkpoints carry it: `mtp.*` tensors
    in a shard of their own (listed in the index when there is one) and `mtp_num_hidden_layers: 1` in
    config.json (in text_config when the config nests one)."""
    import json

    from safetensors.torch import save_file

    from specpilot.config import ModelConfig

    path = Path(path)
    if tensors is None:
        tensors = mtp_tensors(ModelConfig.from_file(path / "config.json"), torch.Generator().manual_seed(seed), dtype)
    shard = "model-mtp.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / shard), metadata={"format": "pt"})
    index = path / "model.safetensors.index.json"
    if index.exists():
        raw = json.loads(index.read_text())
        raw["weight_map"].update({k: shard for k in tensors})
        index.write_text(json.dumps(raw, indent=2))
    raw = json.loads((path / "config.json").read_text())
    text = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    text["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(raw, indent=2))
