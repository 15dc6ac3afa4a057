"""The training run DFlash2 and DSpark share: the DFlash recipe (train/dflash.py) around each drafter's own network
and loss.

`prepare` loads the frozen target, its <|mask|> token and the layers the drafter reads; `BlockRun.blocks` draws a
batch of anchored blocks with the target's features and greedy labels; `BlockRun.fit` runs the optimisation (resume
checkpoints in OUT/checkpoint) and the held-out batches; `BlockRun.report` is training.json's common part.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from specpilot.models.dflash import default_target_layers
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.train import checkpoint as checkpoint_io
from specpilot.train.corpus import Corpus
from specpilot.train.dflash import _features, _rollout_prompt_len, _rollouts
from specpilot.train.lm import TrainConfig, batch_at, train_device
from specpilot.train.loop import optimize
from specpilot.train.tokens import corpus_tokens

HELD_OUT_SEED = 12345


class Blocks(NamedTuple):
    """One batch of anchored blocks: R = batch rows x anchors blocks, `slots` labelled positions each."""
    tokens: torch.Tensor  # [B, L]
    features: torch.Tensor  # [B, L, K*H] the target's, no grad
    anchors: torch.Tensor  # [B, anchors]
    labels: torch.Tensor  # [R, slots]: the target's greedy token after a, a+1, ...
    prev: torch.Tensor  # [R, slots]: the true token before each label (the anchor's token first)


@dataclass(frozen=True)
class BlockRun:
    corpus: Corpus
    target_dir: str | Path
    out: Path
    cfg: TrainConfig
    block: int
    num_layers: int
    anchors: int
    rollouts: int
    resume: bool
    console: object
    device: torch.device
    tokenizer: object
    target: torch.nn.Module
    mask_id: int
    layers: tuple[int, ...]
    prompt_len: int  # corpus tokens before each rollout's continuation (0: no rollouts)

    @property
    def first_anchor(self) -> int:
        return max(1, self.prompt_len)  # rollouts: anchors in the continuation of whole rows

    def blocks(self, tokens_all, step: int, seed: int, slots: int) -> Blocks:
        cfg, device = self.cfg, self.device
        tokens = batch_at(tokens_all, step, seed, cfg.batch_size, cfg.seq_len, rows=self.first_anchor > 1).to(device)
        with torch.no_grad():
            features, greedy = _features(self.target, tokens, self.layers)
        gen = torch.Generator().manual_seed(seed * 7919 + step)
        a = torch.randint(self.first_anchor, cfg.seq_len - self.block + 1, (tokens.shape[0], self.anchors),
                          generator=gen).to(device)
        seq = torch.arange(tokens.shape[0], device=device).repeat_interleave(self.anchors)
        at = a.reshape(-1)[:, None] + torch.arange(0, slots, device=device)
        labels = greedy[seq[:, None], at]
        prev = torch.cat((tokens[seq, a.reshape(-1)][:, None], labels[:, :-1]), dim=1)
        return Blocks(tokens, features, a, labels, prev)

    def fit(self, kind: str, model: torch.nn.Module, step_fn) -> tuple[float, list, float]:
        """(the last training loss, each held-out batch's step_fn outputs, the seconds the optimisation took);
        step_fn(tokens, step, seed) -> (loss, stats...)."""
        cfg = self.cfg
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        train_ids, held_ids = corpus_tokens(self.corpus, self.tokenizer)
        if self.rollouts:
            train_ids, held_ids = _rollouts(self.target, self.target_dir, train_ids, held_ids, self.rollouts, cfg,
                                            self.prompt_len)
        ckpt = self.out / "checkpoint"
        start = checkpoint_io.load(model, opt, ckpt) if self.resume and checkpoint_io.exists(ckpt) else 0
        t0 = time.perf_counter()
        loss = optimize(model.parameters(), opt, lambda step: step_fn(train_ids, step, cfg.seed)[0], cfg, self.console,
                        kind, start, checkpoint_io.every(model, opt, ckpt, cfg.save_every, cfg.steps))
        seconds = time.perf_counter() - t0
        with torch.no_grad():
            held = [step_fn(held_ids, i, HELD_OUT_SEED) for i in range(cfg.eval_batches)]
        return loss, held, seconds

    def report(self, kind: str, model: torch.nn.Module, options: dict, loss: float, held: list, seconds: float,
               stats: tuple[str, ...]) -> dict:
        """training.json: the run (its TrainConfig with the device it ran on, the optimisation's seconds), the
        drafter's `options`, the losses and the held-out means of `stats` (each held-out batch's step outputs after
        the loss, in order)."""
        means = {name: float(sum(h[i] for h in held) / len(held)) for i, name in enumerate(stats, start=1)}
        return {"kind": kind, "block_size": self.block, "layers": self.num_layers,
                "target_layer_ids": list(self.layers), "intermediate_size": model.config.intermediate_size, **options,
                "steps": self.cfg.steps,
                "final_loss": loss, "held_out_loss": sum(float(h[0]) for h in held) / len(held), **means,
                "corpus_files_hash": self.corpus.files_hash, "rollouts": self.rollouts,
                "rollout_prompt_len": self.prompt_len, "anchors": self.anchors,
                "parameters": sum(p.numel() for p in model.parameters()),
                "config": asdict(self.cfg) | {"device": self.device.type}, "train_seconds": round(seconds, 1)}


def prepare(corpus: Corpus, target_dir: str | Path, out: str | Path, cfg: TrainConfig, block: int, num_layers: int,
            anchors: int, rollouts: int, resume: bool, console, target_layers: tuple[int, ...] | None,
            rollout_prompt_len: int | None) -> BlockRun:
    device = train_device(cfg)
    tokenizer = load_tokenizer(str(target_dir))
    mask_id = _mask_id(tokenizer, target_dir)
    target = load_model(str(target_dir), device, "float32").requires_grad_(False)
    layers = _layers(target, num_layers, target_layers)
    prompt_len = _rollout_prompt_len(cfg, rollout_prompt_len) if rollouts else 0
    return BlockRun(corpus, target_dir, Path(out), cfg, block, num_layers, anchors, rollouts, resume, console, device,
                    tokenizer, target, mask_id, layers, prompt_len)


def _mask_id(tokenizer, target_dir) -> int:
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    if mask_id is None or mask_id == tokenizer.unk_token_id:
        raise ValueError(f"{target_dir}: the tokenizer has no <|mask|> token (train it with `specpilot train "
                         "tokenizer`, which adds one)")
    return mask_id


def _layers(target, num_layers: int, target_layers) -> tuple[int, ...]:
    depth = target.config.num_hidden_layers
    layers = tuple(target_layers) if target_layers else (
        default_target_layers(depth, num_layers) if depth >= 5 else tuple(range(depth)))
    if any(not 0 <= i < depth for i in layers):
        raise ValueError(f"target layers {list(layers)} out of range: the target has {depth} layers (0 .. {depth - 1})")
    return layers
