"""`specpilot train drafter --kind dflash2`: a DFlash2 drafter trained against a frozen target.

The DFlash recipe (train/dflash.py: the target's features once per sequence, random anchors, the block [token_a,
MASK x (B-1)] over the context before it, the target's greedy tokens a+1 .. a+B-1 as labels, position-weighted
cross-entropy), run through the DFlash2 network (models/dflash2.py: the local convolutions inside every layer), plus
the candidate selector's loss: at each slot, the cross-entropy of its pair scores over the slot's top-K candidates
given the true previous token (the anchor for the first slot), on the slots whose label is among the candidates.
The output multiplier is 1, no cap, no embedding scale. The result is a DFlash2DraftModel directory (public layout).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specpilot.models.dflash2 import DFlash2Model, DFlash2Options
from specpilot.models.loader import unpacked_state_dict
from specpilot.train.block_drafter import BlockRun, prepare
from specpilot.train.corpus import Corpus
from specpilot.train.dflash import _init, block_hidden, draft_config, layer_fields, position_weights
from specpilot.train.lm import TrainConfig
from specpilot.train.output_dir import cast_state, save_drafter


def train_dflash2(corpus: Corpus, target_dir: str | Path, out: str | Path, cfg: TrainConfig, block: int = 8,
                  num_layers: int = 2, anchors: int = 16, gamma: float = 4.0, rollouts: int = 0, resume: bool = False,
                  console=None, target_layers: tuple[int, ...] | None = None, rollout_prompt_len: int | None = None,
                  intermediate_size: int | None = None, taps: int = 2, group_size: int = 16, rank: int = 32,
                  top_k: int = 8) -> dict:
    run = prepare(corpus, target_dir, out, cfg, block, num_layers, anchors, rollouts, resume, console, target_layers,
                  rollout_prompt_len)
    torch.manual_seed(cfg.seed)
    opts = DFlash2Options(block, run.mask_id, run.layers, taps, group_size, rank, top_k)
    model = DFlash2Model(draft_config(run.target.config, num_layers, intermediate_size), len(run.layers), opts)
    model = model.to(run.device)
    init(model)
    loss, held, seconds = run.fit("dflash2", model, _step(model, run, position_weights(block, gamma, run.device)))
    report = run.report("dflash2", model, {"conv_kernel_size": taps, "conv_group_size": group_size,
                                           "selector_rank": rank, "selector_top_k": top_k}, loss, held, seconds,
                        ("held_out_first_token_accuracy", "held_out_selector_chain_tau"))
    save_dflash2(model, run.target.config, run.out, report, cfg.save_dtype)
    return report


def init(model: DFlash2Model) -> None:
    """DFlash's init; the convolutions start as the identity (tap 0 = 1, small dynamic part)."""
    _init(model)
    with torch.no_grad():
        for layer in model.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.zero_()[:, 0] = 1.0
                conv.kernel_projection.weight.mul_(0.1)


def _step(model: DFlash2Model, run: BlockRun, weights):
    opts = model.options
    block, K = opts.block_size, opts.selector_top_k

    def step(tokens_all, i: int, seed: int):
        b = run.blocks(tokens_all, i, seed, block - 1)
        labels = b.labels  # [R, block-1]
        with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.device.type == "cuda"):
            hidden = block_hidden(model, run.target, b.features, b.tokens, b.anchors, block, opts.mask_token_id)[:, 1:]
            logits = F.linear(hidden, run.target.lm_head.weight)
        ce = F.cross_entropy(logits.float().transpose(1, 2), labels, reduction="none")
        cand, unary = model.unary(logits.float(), K)
        scores = model.candidate_selector.given(cand, unary, hidden.float(), b.prev)  # [R, block-1, K]
        hit = cand == labels[..., None]
        present = hit.any(-1)
        sel = F.cross_entropy(scores.transpose(1, 2), hit.float().argmax(-1), reduction="none") * present
        loss = ((ce + sel) * weights).sum(-1).mean()
        right = (cand.gather(-1, scores.argmax(-1, keepdim=True))[..., 0] == labels).float()
        return loss, right[:, 0].mean(), 1 + right.cumprod(-1).sum(-1).mean()

    return step


def save_dflash2(model: DFlash2Model, target_cfg, out: Path, report: dict, save_dtype: str = "bfloat16") -> None:
    """`out`, whole or not at all (train/output_dir.py), as a DFlash2DraftModel directory."""
    cfg, opts = model.config, model.options
    config = {"architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "is_causal": False, **layer_fields(cfg),
              "rope_parameters": {"rope_theta": cfg.rope.theta, "rope_type": "default"},
              "max_position_embeddings": cfg.max_position_embeddings, "layer_types": ["full_attention"] *
              cfg.num_hidden_layers, "num_target_layers": target_cfg.num_hidden_layers, "tie_word_embeddings": False,
              "dflash_config": {"block_size": opts.block_size, "mask_token_id": opts.mask_token_id,
                                "target_layer_ids": list(opts.target_layers), "conv_kernel_size": opts.conv_taps,
                                "conv_group_size": opts.conv_group_size, "selector_rank": opts.selector_rank,
                                "selector_top_k": opts.selector_top_k, "output_multiplier": 1.0}}
    save_drafter(out, cast_state(unpacked_state_dict(model), save_dtype), config, report)
