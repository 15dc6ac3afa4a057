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

from pathlib import Path

import torch
import torch.nn.functional as F

from specpilot.models.dspark import DSparkModel, DSparkOptions
from specpilot.models.loader import unpacked_state_dict
from specpilot.train.block_drafter import BlockRun, prepare
from specpilot.train.corpus import Corpus
from specpilot.train.dflash import _init, block_hidden, draft_config, layer_fields
from specpilot.train.lm import TrainConfig
from specpilot.train.output_dir import cast_state, save_drafter


def train_dspark(corpus: Corpus, target_dir: str | Path, out: str | Path, cfg: TrainConfig, block: int = 7,
                 num_layers: int = 2, anchors: int = 16, gamma: float = 4.0, rollouts: int = 0, resume: bool = False,
                 console=None, target_layers: tuple[int, ...] | None = None, rollout_prompt_len: int | None = None,
                 intermediate_size: int | None = None, markov_rank: int = 32) -> dict:
    run = prepare(corpus, target_dir, out, cfg, block, num_layers, anchors, rollouts, resume, console, target_layers,
                  rollout_prompt_len)
    if cfg.seq_len - block <= run.first_anchor:
        raise ValueError(f"seq_len {cfg.seq_len} leaves no anchor for a block of {block} after {run.prompt_len} "
                         "prompt tokens")
    torch.manual_seed(cfg.seed)
    opts = DSparkOptions(block, run.mask_id, run.layers, markov_rank, True, markov_rank > 0, False, False)
    model = DSparkModel(draft_config(run.target.config, num_layers, intermediate_size), opts).to(run.device)
    _init(model)
    w = torch.exp(-torch.arange(block, device=run.device, dtype=torch.float32) / gamma)
    loss, held, seconds = run.fit("dspark", model, _step(model, run, w / w.sum()))
    report = run.report("dspark", model, {"markov_rank": markov_rank}, loss, held, seconds,
                        ("held_out_first_token_accuracy", "held_out_chain_tau", "held_out_confidence_brier"))
    save_dspark(model, run.target.config, run.out, report, cfg.save_dtype)
    return report


def _step(model: DSparkModel, run: BlockRun, weights):
    opts = model.options
    block = opts.block_size

    def step(tokens_all, i: int, seed: int):
        # slot block-1 learns greedy[a + block - 1], the target's token at a + block: a <= seq_len - block
        b = run.blocks(tokens_all, i, seed, block)
        labels = b.labels  # [R, block]: slot i's label is the token a+i+1
        with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.device.type == "cuda"):
            hidden = block_hidden(model, run.target, b.features, b.tokens, b.anchors, block, opts.mask_token_id)
            logits = F.linear(hidden, run.target.lm_head.weight).float()
        head = model.markov_head if opts.markov_rank else None
        e = head.markov_w1(b.prev) if head is not None else None
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

    return step


def save_dspark(model: DSparkModel, target_cfg, out: Path, report: dict, save_dtype: str = "bfloat16") -> None:
    """`out`, whole or not at all (train/output_dir.py), as a Qwen3DSparkModel directory."""
    cfg, opts = model.config, model.options
    config = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", **layer_fields(cfg),
              "rope_theta": cfg.rope.theta, "max_position_embeddings": cfg.max_position_embeddings,
              "layer_types": ["full_attention"] * cfg.num_hidden_layers, "tie_word_embeddings": False,
              "num_target_layers": target_cfg.num_hidden_layers, "block_size": opts.block_size,
              "mask_token_id": opts.mask_token_id, "target_layer_ids": list(opts.target_layers),
              "num_anchors": int(report["anchors"]), "enable_confidence_head": opts.confidence,
              "confidence_head_with_markov": opts.confidence_with_markov, "markov_rank": opts.markov_rank,
              "markov_head_type": "vanilla"}
    save_drafter(out, cast_state(unpacked_state_dict(model), save_dtype), config, report)
