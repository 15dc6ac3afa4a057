"""`specpilot train drafter --kind dspark`: a DSpark drafter trained against a frozen target.

The DFlash data path (train/dflash.py: the target's features once per sequence, random anchors, the block over
the context before its anchor) with DSpark's block layout: the block [token_a, MASK x (B-1)] has B prediction slots,
slot i learning the target's greedy token a+i+1. Each slot's logits are the target's LM head on its hidden state
plus the Markov bias W2 W1[previous token], the previous token being the true one (the anchor for slot 0), under a
position-weighted cross-entropy (w_i = exp(-i / gamma)); the confidence head learns, by binary cross-entropy, whether
the slot's greedy draft equals its label (greedy verification's acceptance event; DeepSpec's soft label is the
total-variation overlap of the two distributions, for sampled verification). The embedding and LM head are the
target's and are not saved (specpilot and vLLM share them; DeepSpec's own loader expects copies). The result is a
Qwen3DSparkModel directory (DeepSpec's config fields).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from specpilot.models.dspark import DSparkModel, DSparkOptions
from specpilot.models.loader import load_model, load_tokenizer, unpacked_state_dict
from specpilot.train import checkpoint as checkpoint_io
from specpilot.train.corpus import Corpus
from specpilot.train.dflash import _features, _init, _rollout_prompt_len, _rollouts, block_hidden, draft_config
from specpilot.train.dflash2 import _layers, _mask_id
from specpilot.train.lm import TrainConfig, batch_at, train_device
from specpilot.train.loop import optimize
from specpilot.train.tokens import corpus_tokens


def train_dspark(corpus: Corpus, target_dir: str | Path, out: str | Path, cfg: TrainConfig, block: int = 7,
                 num_layers: int = 2, anchors: int = 16, gamma: float = 4.0, rollouts: int = 0, resume: bool = False,
                 console=None, target_layers: tuple[int, ...] | None = None, rollout_prompt_len: int | None = None,
                 intermediate_size: int | None = None, markov_rank: int = 32) -> dict:
    out = Path(out)
    device = train_device(cfg)
    tokenizer = load_tokenizer(str(target_dir))
    mask_id = _mask_id(tokenizer, target_dir)
    target = load_model(str(target_dir), device, "float32").requires_grad_(False)
    layers = _layers(target, num_layers, target_layers)
    prompt_len = _rollout_prompt_len(cfg, rollout_prompt_len) if rollouts else 0
    if cfg.seq_len - block <= max(1, prompt_len):
        raise ValueError(f"seq_len {cfg.seq_len} leaves no anchor for a block of {block} after {prompt_len} prompt "
                         "tokens")
    torch.manual_seed(cfg.seed)
    opts = DSparkOptions(block, mask_id, layers, markov_rank, True, markov_rank > 0, False, False)
    model = DSparkModel(draft_config(target.config, num_layers, intermediate_size), opts).to(device)
    _init(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    train_ids, held_ids = corpus_tokens(corpus, tokenizer)
    if rollouts:
        train_ids, held_ids = _rollouts(target, target_dir, train_ids, held_ids, rollouts, cfg, prompt_len)
    w = torch.exp(-torch.arange(block, device=device, dtype=torch.float32) / gamma)
    step_fn = _step(model, target, layers, anchors, w / w.sum(), cfg, device, max(1, prompt_len))
    ckpt = out / "checkpoint"
    start = checkpoint_io.load(model, opt, ckpt) if resume and checkpoint_io.exists(ckpt) else 0
    loss = optimize(model.parameters(), opt, lambda step: step_fn(train_ids, step, cfg.seed)[0], cfg, console,
                    "dspark", start, checkpoint_io.every(model, opt, ckpt, cfg.save_every, cfg.steps))
    with torch.no_grad():
        held = [step_fn(held_ids, i, 12345) for i in range(cfg.eval_batches)]
    report = {"kind": "dspark", "block_size": block, "layers": num_layers, "target_layer_ids": list(layers),
              "intermediate_size": model.config.intermediate_size, "markov_rank": markov_rank, "steps": cfg.steps,
              "final_loss": loss, "held_out_loss": sum(float(h[0]) for h in held) / len(held),
              "held_out_first_token_accuracy": float(sum(h[1] for h in held) / len(held)),
              "held_out_chain_tau": float(sum(h[2] for h in held) / len(held)),
              "held_out_confidence_brier": float(sum(h[3] for h in held) / len(held)),
              "corpus_files_hash": corpus.files_hash, "rollouts": rollouts, "rollout_prompt_len": prompt_len,
              "anchors": anchors, "parameters": sum(p.numel() for p in model.parameters())}
    save_dspark(model, target.config, out, report, cfg.save_dtype)
    return report


def _step(model: DSparkModel, target, layers, anchors: int, weights, cfg: TrainConfig, device, first_anchor: int):
    opts = model.options
    block = opts.block_size

    def run(tokens_all, step: int, seed: int):
        tokens = batch_at(tokens_all, step, seed, cfg.batch_size, cfg.seq_len, rows=first_anchor > 1).to(device)
        with torch.no_grad():
            features, greedy = _features(target, tokens, layers)
        gen = torch.Generator().manual_seed(seed * 7919 + step)
        # slot block-1 learns greedy[a + block - 1], the target's token at a + block: a <= seq_len - block
        a = torch.randint(first_anchor, cfg.seq_len - block + 1, (tokens.shape[0], anchors), generator=gen).to(device)
        seq = torch.arange(tokens.shape[0], device=device).repeat_interleave(anchors)
        at = a.reshape(-1)[:, None] + torch.arange(0, block, device=device)
        labels = greedy[seq[:, None], at]  # [R, block]: slot i's label is the token a+i+1
        prev = torch.cat((tokens[seq, a.reshape(-1)][:, None], labels[:, :-1]), dim=1)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            hidden = block_hidden(model, target, features, tokens, a, block, opts.mask_token_id)
            logits = F.linear(hidden, target.lm_head.weight).float()
        head = model.markov_head if opts.markov_rank else None
        e = head.markov_w1(prev) if head is not None else None
        if head is not None:
            logits = logits + head.markov_w2(e).float()
        ce = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")  # [R, block]
        right = (logits.argmax(-1) == labels).float()
        x = torch.cat((hidden.float(), e.float()), -1) if opts.confidence_with_markov else hidden.float()
        conf = model.confidence_head.proj(x.to(model.confidence_head.proj.weight.dtype)).float()[..., 0]
        bce = F.binary_cross_entropy_with_logits(conf, right, reduction="none")
        loss = ((ce + bce) * weights).sum(-1).mean()
        brier = ((torch.sigmoid(conf) - right) ** 2).mean()
        return loss, right[:, 0].mean(), 1 + right.cumprod(-1).sum(-1).mean(), brier

    return run


def save_dspark(model: DSparkModel, target_cfg, out: Path, report: dict, save_dtype: str = "bfloat16") -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg, opts = model.config, model.options
    dtype = getattr(torch, save_dtype)
    save_file({k: v.to(dtype).cpu() for k, v in unpacked_state_dict(model).items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "vocab_size": cfg.vocab_size,
              "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
              "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
              "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
              "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope.theta,
              "max_position_embeddings": cfg.max_position_embeddings,
              "layer_types": ["full_attention"] * cfg.num_hidden_layers, "tie_word_embeddings": False,
              "num_target_layers": target_cfg.num_hidden_layers, "block_size": opts.block_size,
              "mask_token_id": opts.mask_token_id, "target_layer_ids": list(opts.target_layers),
              "num_anchors": int(report["anchors"]), "enable_confidence_head": opts.confidence,
              "confidence_head_with_markov": opts.confidence_with_markov, "markov_rank": opts.markov_rank,
              "markov_head_type": "vanilla"}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "training.json").write_text(json.dumps(report, indent=1))

