"""`specpilot train drafter --kind dflash2`: a DFlash2 drafter trained against a frozen target.

The DFlash recipe (train/dflash.py: the target's features once per sequence, random anchors, the block [token_a,
MASK x (B-1)] over the context before it, the target's greedy tokens a+1 .. a+B-1 as labels, position-weighted
cross-entropy), run through the DFlash2 network (models/dflash2.py: the local convolutions inside every layer), plus
the candidate selector's loss: at each slot, the cross-entropy of its pair scores over the slot's top-K candidates
given the true previous token (the anchor for the first slot), on the slots whose label is among the candidates.
The output multiplier is 1, no cap, no embedding scale. The result is a DFlash2DraftModel directory (public layout).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from specpilot.models.dflash import default_target_layers
from specpilot.models.dflash2 import DFlash2Model, DFlash2Options
from specpilot.models.loader import load_model, load_tokenizer, unpacked_state_dict
from specpilot.train import checkpoint as checkpoint_io
from specpilot.train.corpus import Corpus
from specpilot.train.dflash import _features, _init, _rollout_prompt_len, _rollouts, block_hidden, draft_config
from specpilot.train.dflash import position_weights
from specpilot.train.lm import TrainConfig, batch_at, train_device
from specpilot.train.loop import optimize
from specpilot.train.tokens import corpus_tokens


def train_dflash2(corpus: Corpus, target_dir: str | Path, out: str | Path, cfg: TrainConfig, block: int = 8,
                  num_layers: int = 2, anchors: int = 16, gamma: float = 4.0, rollouts: int = 0, resume: bool = False,
                  console=None, target_layers: tuple[int, ...] | None = None, rollout_prompt_len: int | None = None,
                  intermediate_size: int | None = None, taps: int = 2, group_size: int = 16, rank: int = 32,
                  top_k: int = 8) -> dict:
    out = Path(out)
    device = train_device(cfg)
    tokenizer = load_tokenizer(str(target_dir))
    mask_id = _mask_id(tokenizer, target_dir)
    target = load_model(str(target_dir), device, "float32").requires_grad_(False)
    layers = _layers(target, num_layers, target_layers)
    prompt_len = _rollout_prompt_len(cfg, rollout_prompt_len) if rollouts else 0
    torch.manual_seed(cfg.seed)
    opts = DFlash2Options(block, mask_id, layers, taps, group_size, rank, top_k)
    model = DFlash2Model(draft_config(target.config, num_layers, intermediate_size), len(layers), opts).to(device)
    init(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    train_ids, held_ids = corpus_tokens(corpus, tokenizer)
    if rollouts:
        train_ids, held_ids = _rollouts(target, target_dir, train_ids, held_ids, rollouts, cfg, prompt_len)
    step_fn = _step(model, target, layers, anchors, position_weights(block, gamma, device), cfg, device,
                    max(1, prompt_len))
    ckpt = out / "checkpoint"
    start = checkpoint_io.load(model, opt, ckpt) if resume and checkpoint_io.exists(ckpt) else 0
    loss = optimize(model.parameters(), opt, lambda step: step_fn(train_ids, step, cfg.seed)[0], cfg, console,
                    "dflash2", start, checkpoint_io.every(model, opt, ckpt, cfg.save_every, cfg.steps))
    with torch.no_grad():
        held = [step_fn(held_ids, i, 12345) for i in range(cfg.eval_batches)]
    report = {"kind": "dflash2", "block_size": block, "layers": num_layers, "target_layer_ids": list(layers),
              "intermediate_size": model.config.intermediate_size, "conv_kernel_size": taps,
              "conv_group_size": group_size, "selector_rank": rank, "selector_top_k": top_k, "steps": cfg.steps,
              "final_loss": loss, "held_out_loss": sum(float(h[0]) for h in held) / len(held),
              "held_out_first_token_accuracy": float(sum(h[1] for h in held) / len(held)),
              "held_out_selector_chain_tau": float(sum(h[2] for h in held) / len(held)),
              "corpus_files_hash": corpus.files_hash, "rollouts": rollouts, "rollout_prompt_len": prompt_len,
              "anchors": anchors, "parameters": sum(p.numel() for p in model.parameters())}
    save_dflash2(model, target.config, out, report, cfg.save_dtype)
    return report


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


def init(model: DFlash2Model) -> None:
    """DFlash's init; the convolutions start as the identity (tap 0 = 1, small dynamic part)."""
    _init(model)
    with torch.no_grad():
        for layer in model.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.zero_()[:, 0] = 1.0
                conv.kernel_projection.weight.mul_(0.1)


def _step(model: DFlash2Model, target, layers, anchors: int, weights, cfg: TrainConfig, device, first_anchor: int):
    opts = model.options
    block, K = opts.block_size, opts.selector_top_k

    def run(tokens_all, step: int, seed: int):
        tokens = batch_at(tokens_all, step, seed, cfg.batch_size, cfg.seq_len, rows=first_anchor > 1).to(device)
        with torch.no_grad():
            features, greedy = _features(target, tokens, layers)
        gen = torch.Generator().manual_seed(seed * 7919 + step)
        a = torch.randint(first_anchor, cfg.seq_len - block + 1, (tokens.shape[0], anchors), generator=gen).to(device)
        seq = torch.arange(tokens.shape[0], device=device).repeat_interleave(anchors)
        at = a.reshape(-1)[:, None] + torch.arange(0, block - 1, device=device)
        labels = greedy[seq[:, None], at]  # [R, block-1]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            hidden = block_hidden(model, target, features, tokens, a, block, opts.mask_token_id)[:, 1:]
            logits = F.linear(hidden, target.lm_head.weight)
        ce = F.cross_entropy(logits.float().transpose(1, 2), labels, reduction="none")
        cand, unary = model.unary(logits.float(), K)
        prev = torch.cat((tokens[seq, a.reshape(-1)][:, None], labels[:, :-1]), dim=1)
        scores = model.candidate_selector.given(cand, unary, hidden.float(), prev)  # [R, block-1, K]
        hit = cand == labels[..., None]
        present = hit.any(-1)
        sel = F.cross_entropy(scores.transpose(1, 2), hit.float().argmax(-1), reduction="none") * present
        loss = ((ce + sel) * weights).sum(-1).mean()
        right = (cand.gather(-1, scores.argmax(-1, keepdim=True))[..., 0] == labels).float()
        return loss, right[:, 0].mean(), 1 + right.cumprod(-1).sum(-1).mean()

    return run


def save_dflash2(model: DFlash2Model, target_cfg, out: Path, report: dict, save_dtype: str = "bfloat16") -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg, opts = model.config, model.options
    dtype = getattr(torch, save_dtype)
    save_file({k: v.to(dtype).cpu() for k, v in unpacked_state_dict(model).items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config = {"architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "is_causal": False,
              "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
              "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
              "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
              "rms_norm_eps": cfg.rms_norm_eps,
              "rope_parameters": {"rope_theta": cfg.rope.theta, "rope_type": "default"},
              "max_position_embeddings": cfg.max_position_embeddings, "layer_types": ["full_attention"] *
              cfg.num_hidden_layers, "num_target_layers": target_cfg.num_hidden_layers, "tie_word_embeddings": False,
              "dflash_config": {"block_size": opts.block_size, "mask_token_id": opts.mask_token_id,
                                "target_layer_ids": list(opts.target_layers), "conv_kernel_size": opts.conv_taps,
                                "conv_group_size": opts.conv_group_size, "selector_rank": opts.selector_rank,
                                "selector_top_k": opts.selector_top_k, "output_multiplier": 1.0}}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "training.json").write_text(json.dumps(report, indent=1))
