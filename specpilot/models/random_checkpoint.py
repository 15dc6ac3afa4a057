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
