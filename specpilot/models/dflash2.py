"""The DFlash2 draft network (z-lab / Inco AI `DFlash2DraftModel` checkpoints), its config and its candidate selector.

DFlash2 is DFlash v1 (models/dflash.py: KV injection of the target's context, one non-causal block
[root, MASK x (B-1)] whose mask slots predict their own positions) plus:
- a grouped dynamic depthwise convolution before and after each sublayer (`attention_conv`, `mlp_conv`): from the
  sublayer's normed input x, `kernel_projection` (H -> 2 * taps * G, G = H / conv_group_size) gives per-token
  coefficients d; `prepare` mixes the input, `finish` the sublayer's output, each as
  y[i, c] = sum_t (base_kernel[side, t, c] + d[i, side, t, g(c)]) * x[i - t, c], causal inside the block only (taps
  that would reach before the block's first token read zeros); the context K/V take no convolution;
- `input_embedding_scale` on the block's token embeddings; `output_multiplier` and a tanh
  `final_logit_softcapping` on the draft logits;
- a candidate selector: per draft slot the top `selector_top_k` tokens of the target head (the unary scores, after
  the multiplier and the cap) and a low-rank pair score from predecessor a to candidate b at slot s,
  unary_s(b) + < P[a] * W h_s, S[b] >  (P, S: the two [V, r] codebooks, W: `hidden_projection`), the first slot's
  predecessor being the root. A chain walks the slots left to right taking the best candidate given the previous
  choice; a tree takes the best few children of each node by the softmax of those scores.

Keys: every DFlash v1 key plus `layers.{i}.{attention_conv,mlp_conv}.base_kernel` [2, taps, H],
`layers.{i}.{attention_conv,mlp_conv}.kernel_projection.weight` [2 * taps * G, H],
`candidate_selector.hidden_projection.weight` [r, H] and the bare tensors (no `.weight`)
`candidate_selector.predecessor_codebook` / `successor_codebook` [V, r]. Config: `dflash_config` holds block_size,
mask_token_id, target_layer_ids, conv_kernel_size, conv_group_size, selector_rank, selector_top_k and the optional
input_embedding_scale, output_multiplier, final_logit_softcapping; top level `is_causal` (else layers are causal
when `layer_types` says sliding_attention), `sliding_window`. The drafter is spec_decode/drafters/dflash2.py.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specpilot.config import ConfigError, ModelConfig
from specpilot.layers.linear import Linear
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.dflash import DFlashLayer, DFlashModel

ARCHITECTURES = ("DFlash2DraftModel",)
REQUIRED = ("block_size", "mask_token_id", "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


@dataclass(frozen=True, slots=True)
class DFlash2Options:
    block_size: int
    mask_token_id: int
    target_layers: tuple[int, ...] | None
    conv_taps: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    logit_softcap: float = 0.0  # 0: none
    causal: bool = False  # inside the block
    sliding_window: int | None = None


def grouped_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, group_size: int) -> torch.Tensor:
    """x [R, B, H] (one block per row), delta [R, B, taps, G], base [taps, H] -> [R, B, H]: tap t reads token i - t
    of the same block (zeros before its start)."""
    R, B, H = x.shape
    taps, G = base.shape[0], H // group_size
    blocks = x.view(R, B, G, group_size)
    coef = base.view(1, 1, taps, G, group_size).to(x.dtype) + delta[..., None].to(x.dtype)
    out = coef[:, :, 0] * blocks
    for t in range(1, min(taps, B)):
        out = out + coef[:, :, t] * F.pad(blocks[:, :-t], (0, 0, 0, 0, t, 0))
    return out.view(R, B, H)


class GroupedConv(nn.Module):
    def __init__(self, hidden: int, taps: int, group_size: int):
        super().__init__()
        self.taps, self.group_size, self.groups = taps, group_size, hidden // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))  # [prepare | finish, tap, channel]
        self.kernel_projection = Linear(hidden, 2 * taps * self.groups, bias=False)

    def prepare(self, x: torch.Tensor, paths) -> tuple[torch.Tensor, torch.Tensor]:
        """The sublayer's normed input x [R, B, H] -> (its convolution, the finish side's coefficients)."""
        d = self.kernel_projection(x, paths).view(*x.shape[:2], 2, self.taps, self.groups)
        return grouped_conv(x, d[:, :, 0], self.base_kernel[0], self.group_size), d[:, :, 1]

    def finish(self, y: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return grouped_conv(y, d, self.base_kernel[1], self.group_size)


class DFlash2Layer(DFlashLayer):
    def __init__(self, cfg: ModelConfig, opts: DFlash2Options):
        super().__init__(cfg)
        self.attention_conv = GroupedConv(cfg.hidden_size, opts.conv_taps, opts.conv_group_size)
        self.mlp_conv = GroupedConv(cfg.hidden_size, opts.conv_taps, opts.conv_group_size)

    def forward(self, x, meta: BatchMetadata, kv, cos, sin) -> torch.Tensor:
        paths = meta.paths
        h, d = self.attention_conv.prepare(self.input_layernorm(x, paths), paths)
        x = x + self.attention_conv.finish(self.self_attn(h, meta, kv, cos, sin), d)
        h, d = self.mlp_conv.prepare(self.post_attention_layernorm(x, paths), paths)
        return x + self.mlp_conv.finish(self.mlp(h, paths), d)


class CandidateSelector(nn.Module):
    def __init__(self, hidden: int, vocab: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.hidden_projection = Linear(hidden, rank, bias=False)

    def scores(self, ids: torch.Tensor, unary: torch.Tensor, hidden: torch.Tensor, roots: torch.Tensor,
               paths) -> torch.Tensor:
        """ids / unary [n, S, K] (the slots' candidates and their scores), hidden [n, S, H], roots [n] -> pair scores
        [n, S, K_prev, K] fp32: row p of slot s scores the candidates given candidate p of slot s - 1 (slot 0: the
        root, every row the same)."""
        n, S, K = ids.shape
        prev = torch.cat((roots[:, None, None].expand(n, 1, K), ids[:, :-1]), dim=1)
        w = self.hidden_projection(hidden, paths).float()
        pred = self.predecessor_codebook[prev].float() * w[:, :, None]
        return unary[:, :, None, :] + torch.einsum("nspr,nscr->nspc", pred, self.successor_codebook[ids].float())

    def given(self, ids: torch.Tensor, unary: torch.Tensor, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """The candidates' scores [n, S, K] fp32 given one predecessor token per slot, prev [n, S] (training: the
        true previous tokens)."""
        w = self.hidden_projection(hidden).float()
        pred = self.predecessor_codebook[prev].float() * w
        return unary + torch.einsum("nsr,nscr->nsc", pred, self.successor_codebook[ids].float())


class DFlash2Model(DFlashModel):
    def __init__(self, cfg: ModelConfig, num_features: int, opts: DFlash2Options):
        super().__init__(cfg, num_features)
        self.options = opts
        self.layers = nn.ModuleList(DFlash2Layer(cfg, opts) for _ in range(cfg.num_hidden_layers))
        self.candidate_selector = CandidateSelector(cfg.hidden_size, cfg.vocab_size, opts.selector_rank,
                                                    opts.selector_top_k)

    def unary(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Target-head logits [..., V] -> (top-k ids, their unary scores fp32: times output_multiplier, tanh-capped);
        both maps are increasing, so the top-k of the raw logits are the top-k of the scores."""
        values, ids = logits.topk(k, dim=-1)
        values = values.float() * self.options.output_multiplier
        cap = self.options.logit_softcap
        return ids, torch.tanh(values / cap) * cap if cap > 0 else values


def read_config(model_dir: Path) -> tuple[ModelConfig, DFlash2Options, dict]:
    source = model_dir / "config.json"
    try:
        raw = json.loads(source.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{model_dir}: no config.json; a DFlash2 drafter directory needs one") from None
    extra = dict(raw.get("dflash_config") or {})

    def get(key, default=None):
        return extra.get(key, raw.get(key, default))

    for key in REQUIRED:
        if get(key) is None:
            raise ConfigError(f"{source}: a DFlash2 config needs dflash_config.{key}")
    cfg = ModelConfig.from_dict({**raw, "architectures": ["Qwen3ForCausalLM"]}, source=str(source))
    cfg = dataclasses.replace(cfg, architecture=ARCHITECTURES[0])  # named in the loader's messages
    types = raw.get("layer_types") or []
    causal = raw.get("is_causal", extra.get("causal"))
    causal = bool(causal) if causal is not None else "sliding_attention" in types
    window = raw.get("sliding_window") if "sliding_attention" in types else None
    layers = get("target_layer_ids")
    cap = get("final_logit_softcapping")
    opts = DFlash2Options(
        block_size=int(get("block_size")), mask_token_id=int(get("mask_token_id")),
        target_layers=tuple(int(i) for i in layers) if layers else None, conv_taps=int(get("conv_kernel_size")),
        conv_group_size=int(get("conv_group_size")), selector_rank=int(get("selector_rank")),
        selector_top_k=int(get("selector_top_k")), input_embedding_scale=float(get("input_embedding_scale", 1.0)),
        output_multiplier=float(get("output_multiplier", 1.0)), logit_softcap=float(cap) if cap else 0.0,
        causal=causal, sliding_window=int(window) if window else None)
    if cfg.hidden_size % opts.conv_group_size:
        raise ConfigError(f"{source}: dflash_config.conv_group_size={opts.conv_group_size} does not divide "
                          f"hidden_size={cfg.hidden_size}")
    if opts.block_size < 2 or opts.conv_taps < 1 or not 1 <= opts.selector_top_k <= cfg.vocab_size:
        raise ConfigError(f"{source}: dflash_config needs block_size >= 2, conv_kernel_size >= 1 and "
                          f"1 <= selector_top_k <= vocab_size (got {opts.block_size}, {opts.conv_taps}, "
                          f"{opts.selector_top_k})")
    return cfg, opts, raw
