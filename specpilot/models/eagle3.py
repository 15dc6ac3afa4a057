"""The EAGLE-3 head network (SafeAILab format: `LlamaForCausalLMEagle3` / `Eagle3LlamaForCausalLM`) and its loader.

The head is one Llama decoder layer over its own KV cache. Its input at head position p pairs the target
feature of position p (the outputs of three target layers, fused by `fc`) with the embedding of token p+1; its
output h_p predicts token p+2 through `norm` -> `lm_head` over a reduced draft vocabulary (`d2t` maps a
draft id to a target id: target = draft + d2t[draft]). Per token:

    x = cat(input_layernorm(embed(token)), hidden_norm(fused))        # 2H
    a = o_proj(attention(RoPE(q_proj(x)), RoPE(k_proj(x)), v_proj(x)))  # causal over the head cache
    r = fused + a            (hidden_norm(fused) + a with `norm_before_residual`)
    h = r + mlp(post_attention_layernorm(r))

The drafter that runs it is spec_decode/drafters/eagle3.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from specpilot.checkpoint.directory import safetensors_files
from specpilot.checkpoint.errors import CheckpointError
from specpilot.checkpoint.file import CheckpointFile
from specpilot.config import ConfigError, ModelConfig
from specpilot.layers.attention import Attention
from specpilot.layers.linear import Linear
from specpilot.layers.metadata import BatchMetadata
from specpilot.layers.mlp import MLP
from specpilot.layers.norm import RMSNorm
from specpilot.layers.packed import PackedLinear
from specpilot.layers.rotary import RotaryEmbedding
from specpilot.models.causal_lm import CausalLM
from specpilot.models.loader import load_weights, resolve_dtype

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
NUM_FEATURES = 3


def eagle3_target_layers(num_target_layers: int, aux_layer_ids=None) -> tuple[int, ...]:
    """Target decoder layers whose OUTPUTS the head reads: EAGLE-3 taps the inputs of layers 2, L//2, L-3 (or the
    given input-of-layer ids), i.e. the outputs of those layers minus one."""
    L = num_target_layers
    inputs = tuple(int(i) for i in aux_layer_ids) if aux_layer_ids else (2, L // 2, L - 3)
    layers = tuple(i - 1 for i in inputs)
    if len(layers) != NUM_FEATURES or len(set(layers)) != NUM_FEATURES or not all(0 <= i < L for i in layers):
        raise ConfigError(f"EAGLE-3 taps the inputs of target layers {list(inputs)}, which a {L}-layer target does "
                          f"not have as {NUM_FEATURES} distinct decoder-layer inputs past the embedding (needs at "
                          "least 7 layers, or eagle_aux_hidden_state_layer_ids in the drafter's config)")
    return layers


class Eagle3Layer(nn.Module):
    """`midlayer`: a Llama decoder layer whose q/k/v read cat(normed embedding, normed feature) (2H inputs)."""

    def __init__(self, cfg: ModelConfig, norm_before_residual: bool):
        super().__init__()
        H = cfg.hidden_size
        self.self_attn = Attention(cfg, qk_norm=False, output_gate=False)
        # same attention, wider input: replace the packed q/k/v projection by one that reads 2H
        self.self_attn.qkv_proj = PackedLinear(2 * H, dict(self.self_attn.qkv_proj.shards), bias=cfg.attention_bias)
        self.mlp = MLP(H, cfg.intermediate_size, cfg.mlp_bias)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, emb, fused, meta: BatchMetadata, kv, cos, sin) -> torch.Tensor:
        paths = meta.paths
        normed = self.hidden_norm(fused, paths)
        x = torch.cat((self.input_layernorm(emb, paths), normed), dim=-1)
        a = self.self_attn(x, meta, kv, cos, sin)
        h, residual = self.post_attention_layernorm.add_forward(a, normed if self.norm_before_residual else fused,
                                                                paths)
        return residual + self.mlp(h, paths)


class Eagle3Head(nn.Module):
    """Parameter names are the checkpoint keys (q/k/v and gate/up packed as loader shards)."""

    def __init__(self, cfg: ModelConfig, target_hidden: int, draft_vocab: int, own_embedding: bool,
                 norm_before_residual: bool):
        super().__init__()
        H = cfg.hidden_size
        self.config = cfg
        if own_embedding:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.fc = Linear(NUM_FEATURES * target_hidden, H, bias=False)
        self.midlayer = Eagle3Layer(cfg, norm_before_residual)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = Linear(H, draft_vocab, bias=False)
        self.d2t = nn.Parameter(torch.zeros(draft_vocab, dtype=torch.long), requires_grad=False)
        self.t2d = nn.Parameter(torch.zeros(cfg.vocab_size, dtype=torch.bool), requires_grad=False)
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)


def head_config(raw: dict, source: str) -> ModelConfig:
    """The head's Llama fields parsed by ModelConfig (as a one-layer Llama), under its own architecture name."""
    archs = raw.get("architectures") or []
    layers = int(raw.get("num_hidden_layers", 1))
    if layers != 1:
        raise ConfigError(f"{source}: EAGLE-3 heads have one decoder layer (midlayer), got num_hidden_layers={layers}")
    llama = dict(raw, architectures=["LlamaForCausalLM"], num_hidden_layers=1, tie_word_embeddings=False)
    cfg = ModelConfig.from_dict(llama, source=source)
    arch = next(a for a in archs if a in ARCHITECTURES)
    return dataclasses.replace(cfg, architecture=arch)


def load_eagle3_head(model_dir: Path, target: CausalLM, dtype) -> tuple[Eagle3Head, tuple[int, ...]]:
    """Builds the head from `model_dir` for `target`; every tensor checked (name, shape, exactly once)."""
    source = str(model_dir / "config.json")
    try:
        raw = json.loads((model_dir / "config.json").read_text())
    except FileNotFoundError:
        raise ConfigError(f"{model_dir}: no config.json; an EAGLE-3 drafter directory needs one") from None
    cfg = head_config(raw, source)
    tcfg = target.config
    if cfg.vocab_size != tcfg.vocab_size:
        raise CheckpointError(f"{model_dir}: EAGLE-3 vocab_size {cfg.vocab_size} differs from the target's "
                              f"{tcfg.vocab_size}; the head must be trained for this target's tokenizer")
    draft_vocab = int(raw.get("draft_vocab_size") or cfg.vocab_size)
    target_hidden = int(raw.get("target_hidden_size") or tcfg.hidden_size)
    if target_hidden != tcfg.hidden_size:
        raise CheckpointError(f"{model_dir}: EAGLE-3 target_hidden_size {target_hidden} differs from the target's "
                              f"hidden_size {tcfg.hidden_size}")
    eagle_cfg = raw.get("eagle_config") or {}
    aux = raw.get("eagle_aux_hidden_state_layer_ids", eagle_cfg.get("eagle_aux_hidden_state_layer_ids"))
    target_layers = eagle3_target_layers(tcfg.num_hidden_layers, aux)
    files = safetensors_files(model_dir)
    keys = set()
    for file in files:
        with CheckpointFile(file) as f:
            keys |= set(f.names)
    own_embedding = "embed_tokens.weight" in keys
    if not own_embedding and cfg.hidden_size != tcfg.hidden_size:
        raise CheckpointError(f"{model_dir}: no embed_tokens.weight and hidden_size {cfg.hidden_size} differs from "
                              f"the target's {tcfg.hidden_size}, so the target's embedding cannot be borrowed")
    param = next(target.parameters())
    device = param.device
    dtype = param.dtype if dtype == "auto" else resolve_dtype(dtype, device)
    with torch.device("meta"):
        head = Eagle3Head(cfg, target_hidden, draft_vocab, own_embedding, bool(raw.get("norm_before_residual")))
    head = head.to(dtype=dtype).to_empty(device=device).requires_grad_(False)
    head.rotary.reset_buffers()
    try:
        load_weights(head, files, progress=False)
    except CheckpointError as e:
        raise CheckpointError(f"{model_dir}: {e}") from None
    ids = torch.arange(draft_vocab, device=device) + head.d2t
    if draft_vocab and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size):
        raise CheckpointError(f"{model_dir}: d2t maps draft ids outside the target vocabulary [0, {cfg.vocab_size})")
    return head.eval(), target_layers
