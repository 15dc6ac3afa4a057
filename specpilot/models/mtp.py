"""The multi-token-prediction (MTP) layer that Qwen3.5 / Qwen3-Next checkpoints carry beside the text model
(`mtp.*` keys), and its loader.

One pair per position j: the target's final-normed hidden state h_j and the embedding of token j+1, each
normalised, concatenated (embedding first) and projected back to the hidden size; one full-attention Qwen3.5
decoder layer (gated attention, zero-centred norms, partial RoPE) over the MTP's own KV cache at position j;
then `mtp.norm`. Its output predicts token j+2 through the target's LM head, and is itself the hidden state
the next chained step pairs with the token it drafted:

    x = fc(cat(pre_fc_norm_embedding(embed(t_{j+1})), pre_fc_norm_hidden(h_j)))     # 2H -> H
    h' = norm(layers.0(x))                                                             # causal over the cache

Keys (H hidden, I intermediate, nH/nKV heads, D head dim, as in the target's config):
mtp.fc.weight [H, 2H]; mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.norm.weight [H];
mtp.layers.0.{input_layernorm, post_attention_layernorm}.weight [H]; mtp.layers.0.self_attn.q_proj.weight
[2 nH D, H] (query and output gate), k_proj / v_proj [nKV D, H], o_proj [H, nH D], q_norm / k_norm [D];
mtp.layers.0.mlp.{gate_proj, up_proj} [I, H], down_proj [H, I]. The embedding and LM head are the target's.
The drafter that runs it is spec_decode/drafters/mtp.py.
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
from specpilot.layers.rotary import RotaryEmbedding
from specpilot.models.causal_lm import CausalLM, DecoderLayer
from specpilot.models.loader import load_weights, resolve_dtype

PREFIX = "mtp."


class MTPHead(nn.Module):
    """Parameter names are the checkpoint keys without `mtp.` (q/k/v and gate/up packed as loader shards)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H = cfg.hidden_size
        self.fc = Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(H, cfg.rms_norm_eps, zero_centered=True)
        self.pre_fc_norm_hidden = RMSNorm(H, cfg.rms_norm_eps, zero_centered=True)
        attn = Attention(cfg, qk_norm=True, output_gate=True, zero_centered_norm=True)
        layer = DecoderLayer(attn, "self_attn", MLP(H, cfg.intermediate_size), cfg, True)
        layer.cache_index = 0  # the MTP cache holds this one attention layer
        self.layers = nn.ModuleList([layer])
        self.norm = RMSNorm(H, cfg.rms_norm_eps, zero_centered=True)


class MTPModel(nn.Module):
    """The `mtp` module under the checkpoint's own prefix, so the loader checks the keys as they are stored; the
    config ignores every other key of the target's checkpoint (the text model, the vision tower)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.mtp = MTPHead(cfg)
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, meta: BatchMetadata, cache) -> torch.Tensor:
        """embeds [B, T, H] of tokens j+1 and hidden [B, T, H] (final-normed target states, or the MTP's own
        outputs when chained) at positions j -> the MTP outputs [B, T, H] (K/V stored at meta.cache_loc)."""
        m, paths = self.mtp, meta.paths
        x = m.fc(torch.cat((m.pre_fc_norm_embedding(embeds, paths), m.pre_fc_norm_hidden(hidden, paths)), dim=-1),
                 paths)
        cos, sin = self.rotary(meta.positions)
        x, residual = m.layers[0](x, None, meta, cache, cos, sin)
        return m.norm.add_forward(x, residual, paths)[0]


def mtp_config(model_dir: Path, target: CausalLM) -> ModelConfig:
    """The target's config as a one-layer, full-attention Qwen3.5 stack that loads only `mtp.*` keys."""
    tcfg = target.config
    source = model_dir / "config.json"
    try:
        raw = json.loads(source.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{model_dir}: no config.json; --drafter mtp reads the target's checkpoint") from None
    text = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
    if tcfg.family != "qwen3_5":
        raise ConfigError(f"{source}: --drafter mtp reads the MTP layer of Qwen3.5 / Qwen3-Next checkpoints; "
                          f"{tcfg.architecture} has none (use a drafter checkpoint, ngram or none)")
    layers = text.get("mtp_num_hidden_layers", raw.get("mtp_num_hidden_layers"))
    if layers is None:
        raise ConfigError(f"{source}: no mtp_num_hidden_layers; this checkpoint declares no MTP layer for "
                          "--drafter mtp")
    if int(layers) != 1:
        raise ConfigError(f"{source}: mtp_num_hidden_layers={layers}; --drafter mtp runs checkpoints with one MTP "
                          "layer (Qwen3.5, Qwen3-Next)")
    if text.get("mtp_use_dedicated_embeddings"):
        raise ConfigError(f"{source}: mtp_use_dedicated_embeddings=true is not supported; --drafter mtp shares "
                          "the target's embedding")
    return head_config(tcfg)


def head_config(tcfg: ModelConfig) -> ModelConfig:
    """A Qwen3.5 target's config as the MTP stack: one full-attention layer; every key but `mtp.*` ignored."""
    return dataclasses.replace(tcfg, num_hidden_layers=1, layer_types=("full_attention",),
                               ignored_key_prefixes=("model.", "lm_head."))


def load_mtp(model_dir: Path, target: CausalLM, dtype="auto") -> MTPModel:
    """The MTP layer of the target checkpoint in `model_dir`; every `mtp.*` tensor checked (name, shape, exactly
    once), a missing one named."""
    cfg = mtp_config(model_dir, target)
    files = safetensors_files(model_dir)
    if not any(n.startswith(PREFIX) for f in files for n in _names(f)):
        raise CheckpointError(f"{model_dir}: no mtp.* tensors; the checkpoint was saved without its MTP layer "
                              "(some conversions drop it): use the original checkpoint or another drafter")
    param = next(target.parameters())
    dtype = param.dtype if dtype == "auto" else resolve_dtype(dtype, param.device)
    with torch.device("meta"):
        model = MTPModel(cfg)
    model = model.to(dtype=dtype).to_empty(device=param.device).requires_grad_(False)
    model.rotary.reset_buffers()
    try:
        load_weights(model, files, progress=False)
    except CheckpointError as e:
        raise CheckpointError(f"{model_dir}: MTP layer: {e}") from None
    return model.eval()


def _names(path: Path) -> list[str]:
    with CheckpointFile(path) as f:
        return list(f.names)
