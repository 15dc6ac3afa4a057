"""`specpilot train drafter --kind mtp`: an MTP layer (models/mtp.py) trained for a frozen Qwen3.5-style target,
written into a copy of the target's checkpoint as the public checkpoints carry it.

Each training sequence runs through the target once (no grad) for its final-normed hidden states h and greedy next
tokens g; the MTP layer reads the pairs (h_j, token j+1) at positions j, causally over the sequence, and learns g at
j+1, the target's token at j+2 (self-distillation, as the drafters here learn), under cross-entropy through the
target's LM head. It learns depth 1 only; inference chains it for deeper drafts as the public engines do. The
output directory is the target's files plus `model-mtp.safetensors` (the `mtp.*` tensors) and
`mtp_num_hidden_layers: 1` in config.json: `--target OUT --drafter mtp`. An MTP layer the target already carried
is left out of the copy, and so is its W12N manifest (it would not list the new shard). training.json keeps the
target's own record and holds this training under `"mtp"`.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from specpilot.checkpoint import checksum
from specpilot.config import ConfigError
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.loader import load_model, load_tokenizer, unpacked_state_dict
from specpilot.models.mtp import PREFIX, MTPModel, head_config
from specpilot.models.random_checkpoint import add_mtp_layer
from specpilot.runtime.cache import ModelCache
from specpilot.train import checkpoint as checkpoint_io
from specpilot.train.corpus import Corpus
from specpilot.train.lm import TrainConfig, batch_at, train_device
from specpilot.train.loop import optimize
from specpilot.train.output_dir import cast_state, output_dir
from specpilot.train.tokens import corpus_tokens
from specpilot.weights.compress import MANIFEST as W12N_MANIFEST


def train_mtp(corpus: Corpus, target_dir: str | Path, out: str | Path, cfg: TrainConfig, resume: bool = False,
              console=None) -> dict:
    out, target_dir = Path(out), Path(target_dir)
    device = train_device(cfg)
    tokenizer = load_tokenizer(str(target_dir))
    target = load_model(str(target_dir), device, "float32").requires_grad_(False)
    if target.config.family != "qwen3_5":
        raise ConfigError(f"{target_dir}: an MTP layer is a Qwen3.5 / Qwen3-Next layer; {target.config.architecture} "
                          "takes a DFlash, DFlash2, DSpark or EAGLE-3 drafter instead")
    torch.manual_seed(cfg.seed)
    model = MTPModel(head_config(target.config)).to(device)
    init(model)
    params = list(model.mtp.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    train_ids, held_ids = corpus_tokens(corpus, tokenizer)
    step_fn = _step(model, target, cfg, device)
    ckpt = out / "checkpoint"
    start = checkpoint_io.load(model, opt, ckpt) if resume and checkpoint_io.exists(ckpt) else 0
    t0 = time.perf_counter()
    loss = optimize(params, opt, lambda step: step_fn(train_ids, step, cfg.seed)[0], cfg, console, "mtp", start,
                    checkpoint_io.every(model, opt, ckpt, cfg.save_every, cfg.steps))
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        held = [step_fn(held_ids, i, 12345) for i in range(cfg.eval_batches)]
    report = {"kind": "mtp", "steps": cfg.steps, "final_loss": loss,
              "held_out_loss": sum(float(h[0]) for h in held) / len(held),
              "held_out_first_token_accuracy": float(sum(h[1] for h in held) / len(held)),
              "corpus_files_hash": corpus.files_hash, "parameters": sum(p.numel() for p in params),
              "config": asdict(cfg) | {"device": device.type}, "train_seconds": round(seconds, 1)}
    save_mtp(model, target_dir, out, report, cfg.save_dtype)
    return report


def init(model: MTPModel) -> None:
    """Matrices N(0, 0.02) (the residual branches' outputs smaller), zero-centred norms at the identity (0)."""
    with torch.no_grad():
        for p in model.mtp.parameters():
            p.zero_() if p.ndim == 1 else p.normal_(0, 0.02)
        layer = model.mtp.layers[0]
        layer.self_attn.o_proj.weight.mul_(1 / math.sqrt(2))
        layer.mlp.down_proj.weight.mul_(1 / math.sqrt(2))


def _step(model: MTPModel, target, cfg: TrainConfig, device):
    def run(tokens_all, step: int, seed: int):
        tokens = batch_at(tokens_all, step, seed, cfg.batch_size, cfg.seq_len).to(device)
        B, L = tokens.shape
        zero, rows = torch.zeros(B, dtype=torch.long, device=device), torch.arange(B, device=device)
        with torch.no_grad():
            cache = ModelCache(target.config, B, L, device, torch.float32)
            hidden = target(BatchMetadata.contiguous(tokens, zero, rows, 0), cache)
            greedy = target.logits(hidden).argmax(-1)
            embeds = target.model.embed_tokens(tokens[:, 1:])
        cache = ModelCache(model.config, B, L, device, torch.float32)
        meta = BatchMetadata.contiguous(tokens[:, 1:], zero, rows, 0)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = model(embeds, hidden[:, :-1], meta, cache)  # pair j: (h_j, token j+1) at position j
            logits = F.linear(out, target.lm_head.weight).float()
        labels = greedy[:, 1:]  # the target's token j+2
        loss = F.cross_entropy(logits.transpose(1, 2), labels)
        return loss, (logits.argmax(-1) == labels).float().mean()

    return run


def save_mtp(model: MTPModel, target_dir: Path, out: Path, report: dict, save_dtype: str = "bfloat16") -> None:
    """`out`, whole or not at all (train/output_dir.py, which keeps a resume checkpoint): the target's files
    without any MTP layer of its own, then the MTP shard and config field, then the training record."""
    mtp = {k: v for k, v in unpacked_state_dict(model).items() if k.startswith("mtp.")}
    with output_dir(out) as tmp:
        for f in target_dir.iterdir():
            if not f.is_file() or f.name in ("training.json", W12N_MANIFEST):
                continue
            if f.suffix == ".safetensors":
                _copy_without_mtp(f, tmp / f.name)
            else:
                shutil.copy2(f, tmp / f.name)
        add_mtp_layer(tmp, cast_state(mtp, save_dtype))
        (tmp / "training.json").write_text(json.dumps(training_record(target_dir, report), indent=1))


def training_record(target_dir: Path, report: dict) -> dict:
    """The target's training.json (none for a checkpoint trained elsewhere) with this MTP training under "mtp"."""
    path = target_dir / "training.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    return {k: v for k, v in record.items() if k != "mtp"} | {"mtp": report}


def _copy_without_mtp(src: Path, dst: Path) -> None:
    """Copies a safetensors file without its `mtp.*` tensors (W12N planes included: their keys share the prefix)
    and their checksums; a file that holds only `mtp.*` tensors is not copied."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), framework="pt") as f:
        keys = [k for k in f.keys() if not k.startswith(PREFIX)]
        if len(keys) == len(f.keys()):
            shutil.copy2(src, dst)
            return
        if not keys:
            return
        tensors, meta = {k: f.get_tensor(k) for k in keys}, dict(f.metadata() or {})
    sums = checksum.from_metadata(meta)
    if sums is not None:
        meta |= checksum.to_metadata({k: v for k, v in sums.items() if not k.startswith(PREFIX)})
    save_file(tensors, str(dst), metadata=meta)
