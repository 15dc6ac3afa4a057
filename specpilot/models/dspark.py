"""The DSpark draft network (DeepSeek-AI `Qwen3DSparkModel` checkpoints, DeepSpec layout): a DFlash backbone with
its own block layout, a Markov head and a confidence head.

Backbone: DFlash v1's (models/dflash.py: the target's context features at `target_layer_ids`, fc + hidden_norm,
injected as extra keys and values in every layer; one non-causal block). Block layout, "anchor as the first
prediction": the block is [root, MASK x (B-1)] at positions p .. p+B-1 and slot i predicts the token at p+i+1, so B
inputs give B drafts (DFlash v1: B-1).

Heads, on each slot's final-normed hidden state h_k and the token x_{k-1} before it (x_0: the root):
- logits: `lm_head` (the checkpoint's own, else the target's) plus the Markov bias W2 W1[x_{k-1}] (`markov_head`,
  rank r; none when markov_rank is 0, as in DeepSpec's DFlash checkpoints); drafted left to right, each slot's
  bias from the token just drafted;
- confidence: sigmoid(proj([h_k ; W1[x_{k-1}]])) (`confidence_head`, [h_k] alone without
  confidence_head_with_markov), the predicted probability that the slot's draft is accepted.

Keys: every DFlash v1 key, optionally `embed_tokens.weight` and `lm_head.weight` [V, H] (DeepSpec saves both;
otherwise the target's are shared), `markov_head.markov_w1.weight` and `markov_head.markov_w2.weight` [V, r],
`confidence_head.proj.weight` [1, H (+ r)] and `confidence_head.proj.bias` [1]. Config (top level): block_size,
mask_token_id, target_layer_ids, markov_rank, markov_head_type ("vanilla"), enable_confidence_head,
confidence_head_with_markov, num_target_layers. The drafter is spec_decode/drafters/dspark.py.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specpilot.config import ConfigError, ModelConfig
from specpilot.layers.linear import Linear
from specpilot.models.dflash import DFlashModel

ARCHITECTURES = ("Qwen3DSparkModel",)


@dataclass(frozen=True, slots=True)
class DSparkOptions:
    block_size: int
    mask_token_id: int
    target_layers: tuple[int, ...]
    markov_rank: int  # 0: no Markov head
    confidence: bool
    confidence_with_markov: bool
    own_embedding: bool  # the checkpoint ships embed_tokens.weight
    own_head: bool  # the checkpoint ships lm_head.weight


class MarkovHead(nn.Module):
    def __init__(self, vocab: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = Linear(rank, vocab, bias=False)


class ConfidenceHead(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 1)


class DSparkModel(DFlashModel):
    def __init__(self, cfg: ModelConfig, opts: DSparkOptions):
        super().__init__(cfg, len(opts.target_layers))
        self.options = opts
        if opts.own_embedding:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        if opts.own_head:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if opts.markov_rank:
            self.markov_head = MarkovHead(cfg.vocab_size, opts.markov_rank)
        if opts.confidence:
            self.confidence_head = ConfidenceHead(cfg.hidden_size + (opts.markov_rank if opts.confidence_with_markov
                                                                      else 0))

    def step(self, base: torch.Tensor, hidden: torch.Tensor, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One slot: base logits [n, V], hidden [n, H], previous tokens [n] -> (logits with the Markov bias [n, V]
        fp32, confidence [n] fp32, all ones without a confidence head)."""
        return self.markov_logits(base, prev), self.confidence(hidden, prev)

    def markov_logits(self, base: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Base logits [..., V] plus the Markov bias W2 W1[prev] of the previous tokens prev [...], fp32."""
        logits = base.float()
        if self.options.markov_rank:
            head = self.markov_head
            logits = logits + head.markov_w2(head.markov_w1(prev)).float()
        return logits

    def confidence(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """sigmoid(proj([hidden ; W1[prev]])) [...] fp32 of hidden [..., H] and the previous tokens prev [...] (any
        leading shape: a chain's slots at once); all ones without a confidence head."""
        opts = self.options
        if not opts.confidence:
            return torch.ones(prev.shape, device=hidden.device)
        if opts.confidence_with_markov:
            hidden = torch.cat((hidden, self.markov_head.markov_w1(prev).to(hidden.dtype)), dim=-1)
        proj = self.confidence_head.proj
        return torch.sigmoid(nn.functional.linear(hidden.float(), proj.weight.float(), proj.bias.float()))[..., 0]


def read_config(model_dir: Path, keys: set[str]) -> tuple[ModelConfig, DSparkOptions, dict]:
    """The config of the checkpoint in `model_dir` whose tensors are named `keys` (the optional embedding and
    head are taken when present)."""
    source = model_dir / "config.json"
    try:
        raw = json.loads(source.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{model_dir}: no config.json; a DSpark drafter directory needs one") from None
    for key in ("block_size", "mask_token_id", "target_layer_ids", "markov_rank", "enable_confidence_head"):
        if raw.get(key) is None:
            raise ConfigError(f"{source}: a DSpark config needs {key}")
    rank = int(raw["markov_rank"])
    if rank and raw.get("markov_head_type") != "vanilla":
        raise ConfigError(f"{source}: markov_head_type={raw.get('markov_head_type')!r}; specpilot runs the "
                          "'vanilla' Markov head (W2 W1[previous token])")
    confidence = bool(raw["enable_confidence_head"])
    with_markov = bool(raw.get("confidence_head_with_markov", False))
    if confidence and raw.get("confidence_head_with_markov") is None:
        raise ConfigError(f"{source}: enable_confidence_head needs confidence_head_with_markov")
    if with_markov and confidence and not rank:
        raise ConfigError(f"{source}: confidence_head_with_markov needs markov_rank > 0")
    layers = tuple(int(i) for i in raw["target_layer_ids"])
    if any(i < 0 for i in layers):
        raise ConfigError(f"{source}: target_layer_ids {list(layers)} reads the embedding output (-1); specpilot "
                          "hands drafters decoder-layer outputs only")
    if int(raw["block_size"]) < 1:
        raise ConfigError(f"{source}: block_size must be >= 1, got {raw['block_size']}")
    cfg = ModelConfig.from_dict({**raw, "architectures": ["Qwen3ForCausalLM"], "tie_word_embeddings": False},
                                source=str(source))
    cfg = dataclasses.replace(cfg, architecture=ARCHITECTURES[0])  # named in the loader's messages
    opts = DSparkOptions(int(raw["block_size"]), int(raw["mask_token_id"]), layers, rank, confidence,
                         with_markov, "embed_tokens.weight" in keys, "lm_head.weight" in keys)
    return cfg, opts, raw
