"""`specpilot train target` / `train drafter --kind draft-lm`: language models trained from scratch.

Dense (Qwen3) and hybrid (Qwen3.5: Gated DeltaNet + gated attention) models are built and trained with
transformers' own classes, so the result is a Hugging Face checkpoint that transformers and our loader both
read. The token stream is the corpus joined by EOS; the batch of step s is drawn from a generator seeded by
(seed, s), so a run is repeatable and a resumed run sees exactly the batches it would have seen. Checkpoints
hold the model (safetensors), the AdamW moments (safetensors) and the step; nothing is pickled.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specpilot.train import checkpoint as checkpoint_io
from specpilot.train.corpus import Corpus
from specpilot.train.loop import optimize
from specpilot.train.output_dir import output_dir
from specpilot.train.tokens import corpus_tokens

PRESETS = {
    # the bundled zoo's targets (~6M parameters with a 4k vocabulary): sized so that both targets, their drafters
    # and the shared draft LM fit the repository's 32 MB budget for committed weights in W12N
    "dense": dict(arch="Qwen3ForCausalLM", hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "hybrid": dict(arch="Qwen3_5ForCausalLM", hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                   linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
                   full_attention_interval=4),
    # a draft LM: a quarter of the depth, half the width
    "draft": dict(arch="Qwen3ForCausalLM", hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=64),
}


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch_size: int = 32
    seq_len: int = 512
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.1
    seed: int = 0
    device: str = "auto"
    save_every: int = 500
    eval_batches: int = 8
    save_dtype: str = "bfloat16"  # the released weights (training keeps fp32 masters; resume checkpoints too)


def train_device(cfg: TrainConfig) -> torch.device:
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if cfg.device == "auto" else cfg.device))
    if device.type == "cuda":  # the fp32 parts (drafter training, frozen-target features) may use TF32 tensor cores
        torch.backends.cuda.matmul.allow_tf32 = True
    return device


def hf_config(preset: str | dict, vocab_size: int, eos_id: int, max_len: int):
    import transformers

    spec = dict(PRESETS[preset]) if isinstance(preset, str) else dict(preset)
    arch = spec.pop("arch")
    cls = transformers.Qwen3Config if arch == "Qwen3ForCausalLM" else transformers.Qwen3_5TextConfig
    return cls(vocab_size=vocab_size, max_position_embeddings=max(max_len, 2048), eos_token_id=eos_id,
               tie_word_embeddings=True, architectures=[arch], rope_theta=10000.0, **spec)


def batch_at(tokens: torch.Tensor, step: int, seed: int, batch_size: int, seq_len: int,
             rows: bool = False) -> torch.Tensor:
    """The [batch, seq_len] windows of step `step`: a pure function of (seed, step). rows: the stream is rows of
    seq_len tokens (rollouts) and windows are whole rows."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    if rows:
        starts = torch.randint(0, len(tokens) // seq_len, (batch_size,), generator=gen) * seq_len
    else:
        starts = torch.randint(0, len(tokens) - seq_len, (batch_size,), generator=gen)
    return torch.stack([tokens[s:s + seq_len] for s in starts.tolist()])


def train_lm(corpus: Corpus, tokenizer_dir: str | Path, out: str | Path, preset: str | dict, cfg: TrainConfig,
             resume: bool = False, console=None) -> dict:
    """Trains a model of `preset` on the corpus and writes a Hugging Face checkpoint (+ tokenizer) to `out`."""
    from transformers import AutoTokenizer

    out = Path(out)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    device = train_device(cfg)
    train_ids, held_ids = corpus_tokens(corpus, tokenizer)
    if len(train_ids) <= cfg.seq_len or len(held_ids) <= cfg.seq_len:
        raise ValueError(f"corpus too small for seq_len {cfg.seq_len}: {len(train_ids)} train / {len(held_ids)} "
                         "held-out tokens")
    model, opt, start = _build(preset, tokenizer, cfg, device, out / "checkpoint" if resume else None)
    loss = _loop(model, opt, train_ids, cfg, device, start, out, console)
    report = {"preset": preset if isinstance(preset, str) else "custom", "parameters": _params(model),
              "steps": cfg.steps, "train_tokens": cfg.steps * cfg.batch_size * cfg.seq_len, "final_loss": loss,
              "held_out_loss": evaluate(model, held_ids, cfg, device), "corpus": corpus.source,
              "corpus_files_hash": corpus.files_hash, "config": asdict(cfg)}
    _save_final(model, tokenizer_dir, out, report, cfg.save_dtype)
    return report


def _build(preset, tokenizer, cfg: TrainConfig, device, checkpoint: Path | None):
    import transformers

    torch.manual_seed(cfg.seed)
    resuming = checkpoint is not None and checkpoint_io.exists(checkpoint)
    if resuming:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    else:
        config = hf_config(preset, len(tokenizer), tokenizer.eos_token_id, cfg.seq_len)
        model = getattr(transformers, config.architectures[0])(config)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    start = checkpoint_io.load(model, opt, checkpoint, weights=False) if resuming else 0
    return model, opt, start


def _loop(model, opt, tokens, cfg: TrainConfig, device, start: int, out: Path, console) -> float:
    def step_loss(step: int) -> torch.Tensor:
        batch = batch_at(tokens, step, cfg.seed, cfg.batch_size, cfg.seq_len).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            return model(input_ids=batch, labels=batch).loss

    hook = checkpoint_io.every(model, opt, out / "checkpoint", cfg.save_every, cfg.steps, model.save_pretrained)
    return optimize(model.parameters(), opt, step_loss, cfg, console, "train", start, hook)


@torch.no_grad()
def evaluate(model, tokens: torch.Tensor, cfg: TrainConfig, device) -> float:
    """Mean next-token loss on held-out windows (fixed: the same for every run)."""
    model.eval()
    losses = []
    for i in range(cfg.eval_batches):
        batch = batch_at(tokens, i, 12345, min(cfg.batch_size, 8), cfg.seq_len).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            losses.append(float(model(input_ids=batch, labels=batch).loss))
    model.train()
    return sum(losses) / len(losses)


def _save_final(model, tokenizer_dir, out: Path, report: dict, save_dtype: str) -> None:
    """`out`, whole or not at all (train/output_dir.py): the model, the tokenizer's files and training.json."""
    with output_dir(out) as tmp:
        model.to(getattr(torch, save_dtype)).save_pretrained(tmp, safe_serialization=True)
        for f in Path(tokenizer_dir).iterdir():
            if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
                shutil.copy2(f, tmp / f.name)
        (tmp / "training.json").write_text(json.dumps(report, indent=1))


def _params(model) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total
