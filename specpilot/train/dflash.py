"""`specpilot train drafter --kind dflash`: a DFlash block drafter trained against a frozen target.

Each training sequence runs through the target once (no grad) for the hidden states of `target_layer_ids`.
Random anchor positions a are drawn per sequence; the drafter sees the context features of positions < a and
the block [token_a, MASK x (B-1)], exactly as at inference (the same DFlashModel forward, the context K/V built
in memory instead of in a cache), and learns what the target emits at a+1 .. a+B-1 (each after the true prefix:
self-distillation) with a loss weighted by position (exp(-(k-1)/gamma): the first draft positions matter most,
since acceptance stops at the first miss). Two losses: "ce", cross-entropy on the target's greedy token (what
greedy acceptance asks); "kl", KL(p || q) against the target's whole next-token distribution p (soft labels), so
the draft's q follows p at every temperature, which sampled acceptance asks (the draft's and the target's
temperatures divide logits that match). The target's embedding and LM head stay frozen and are not saved. The
result is a z-lab DFlashDraftModel directory.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from specpilot.config import ModelConfig
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.loader import load_model, load_tokenizer, load_weights, unpacked_state_dict
from specpilot.models.dflash import DFlashModel, default_target_layers
from specpilot.train import checkpoint as checkpoint_io
from specpilot.train.corpus import Corpus
from specpilot.train.lm import TrainConfig, batch_at, train_device
from specpilot.train.loop import optimize
from specpilot.train.output_dir import cast_state, save_drafter
from specpilot.train.tokens import corpus_tokens


class _ContextKV:
    """Per-layer context keys/values of a training batch, in the cache layout the DFlash forward reads."""

    def __init__(self, kvs: list[tuple[torch.Tensor, torch.Tensor]]):
        self.kvs = kvs

    def kv(self, index: int):
        return self.kvs[index]


def draft_config(target_cfg: ModelConfig, num_layers: int, intermediate_size: int | None = None) -> ModelConfig:
    """Qwen3-style layers of the target's width (the context features and the borrowed embedding have it); the MLP
    width is the target's unless given."""
    import dataclasses

    from specpilot.config import RopeConfig

    return dataclasses.replace(target_cfg, num_hidden_layers=num_layers, layer_types=("full_attention",) * num_layers,
                               intermediate_size=intermediate_size or target_cfg.intermediate_size,
                               family="qwen3", architecture="Qwen3ForCausalLM", ignored_key_prefixes=(),
                               rope=RopeConfig(theta=target_cfg.rope.theta), tie_word_embeddings=False)


def dflash_forward(model: DFlashModel, target, features, tokens, anchors, block: int, mask_id: int,
                   context_window: int | None = None):
    """features [B, L, K*H] (no grad), tokens [B, L], anchors [B, n] -> draft logits [B*n, block-1, vocab].
    context_window: a block sees only the last that many context positions (a training-time probe of attention
    dilution; inference reads the whole context)."""
    hidden = block_hidden(model, target, features, tokens, anchors, block, mask_id, context_window)
    return F.linear(hidden[:, 1:], target.lm_head.weight)


def block_hidden(model: DFlashModel, target, features, tokens, anchors, block: int, mask_id: int,
                 context_window: int | None = None, embed=None, embed_scale: float = 1.0):
    """The final-normed hidden states [B*n, block, H] of every block [token_a, MASK x (block-1)] (anchor slot
    included) over the context before its anchor, as dflash_forward describes; embed: the block's embedding (default
    the target's), times embed_scale. DFlash-family drafters (DFlash2, DSpark) train on it too."""
    B, L = tokens.shape
    n = anchors.shape[1]
    dev = tokens.device
    ctx = model.hidden_norm(model.fc(features))
    cos, sin = model.rotary(torch.arange(L, device=dev).expand(B, L))
    seq = torch.arange(B, device=dev).repeat_interleave(n)  # request r reads sequence seq[r]
    a = anchors.reshape(-1)
    steps = torch.arange(block, device=dev)
    if context_window:  # each block's own window [start, a) and block positions, gathered densely from position 0
        start = (a - context_window).clamp(min=0)
        rows = (start[:, None] + torch.arange(context_window + block, device=dev)).clamp(max=L - 1)
        prefix, loc = a - start, (a - start)[:, None] + steps
    else:
        rows, prefix, loc = None, a, a[:, None] + steps
    kvs = []
    for layer in model.layers:
        k, v = layer.context_kv(ctx, cos, sin)  # [B, L, KVH, D]
        # [R, KVH, L', D], dense: the block's K/V are stored into it as into a cache (a Triton store under no_grad)
        if rows is None:
            kvs.append((k.transpose(1, 2).contiguous()[seq], v.transpose(1, 2).contiguous()[seq]))
        else:
            kvs.append((k[seq[:, None], rows].transpose(1, 2).contiguous(),
                        v[seq[:, None], rows].transpose(1, 2).contiguous()))
    ids = torch.full((B * n, block), mask_id, device=dev)
    ids[:, 0] = tokens[seq, a]
    pos = a[:, None] + steps
    meta = BatchMetadata(ids, pos, loc, torch.arange(B * n, device=dev), prefix, context_window or L,
                         torch.ones(B * n, block, block, dtype=torch.bool, device=dev))
    with torch.no_grad():
        embeds = (embed or target.model.embed_tokens)(ids) * embed_scale
    return model(embeds, meta, _ContextKV(kvs))


def position_weights(block: int, gamma: float, device) -> torch.Tensor:
    w = torch.exp(-torch.arange(block - 1, device=device, dtype=torch.float32) / gamma)
    return w / w.sum()


def train_dflash(corpus: Corpus, target_dir: str | Path, out: str | Path, cfg: TrainConfig, block: int = 8,
                 num_layers: int = 2, anchors: int = 16, gamma: float = 4.0, rollouts: int = 0, resume: bool = False,
                 console=None, greedy_path_labels: bool = False, target_layers: tuple[int, ...] | None = None,
                 rollout_prompt_len: int | None = None, context_window: int | None = None,
                 intermediate_size: int | None = None, loss: str = "ce",
                 rollout_temperatures: tuple[float, ...] = (0.0,), init_from: str | Path | None = None) -> dict:
    """rollouts > 0: train on that many rollouts of the target (self-distillation data) per temperature of
    rollout_temperatures (0: greedy, T > 0: sampled at T; the streams are joined) instead of the corpus text
    itself, each a corpus prompt of rollout_prompt_len tokens (default: a quarter of seq_len, at most 32) and the
    target's continuation; anchors are drawn in the continuation only. anchors: blocks drawn per training sequence.
    target_layers: the target layers whose outputs feed the drafter (default: default_target_layers).
    greedy_path_labels: see label_mask. context_window: see dflash_forward (a probe: the saved drafter is read with
    its whole context). loss: "ce" or "kl" (module docstring). init_from: a DFlash drafter directory of this shape
    to start from (fine-tuning) instead of a random init."""
    _check_options(loss, rollouts, rollout_temperatures, greedy_path_labels)
    out = Path(out)
    device = train_device(cfg)
    tokenizer = load_tokenizer(str(target_dir))
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    if mask_id is None or mask_id == tokenizer.unk_token_id:
        raise ValueError(f"{target_dir}: the tokenizer has no <|mask|> token (train it with `specpilot train "
                         "tokenizer`, which adds one)")
    target = load_model(str(target_dir), device, "float32").requires_grad_(False)
    depth = target.config.num_hidden_layers
    layers = tuple(target_layers) if target_layers else (
        default_target_layers(depth, num_layers) if depth >= 5 else tuple(range(depth)))
    if any(not 0 <= i < depth for i in layers):
        raise ValueError(f"target layers {list(layers)} out of range: the target has {depth} layers (0 .. {depth - 1})")
    prompt_len = _rollout_prompt_len(cfg, rollout_prompt_len) if rollouts else 0
    if prompt_len > cfg.seq_len - block:
        raise ValueError(f"--rollout-prompt-len {prompt_len} leaves no anchor: it must be at most seq_len - block "
                         f"= {cfg.seq_len - block}")
    torch.manual_seed(cfg.seed)
    model = DFlashModel(draft_config(target.config, num_layers, intermediate_size), len(layers)).to(device)
    _init(model)
    if init_from is not None:
        _load_init(model, Path(init_from), layers, block, mask_id)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    train_ids, held_ids = corpus_tokens(corpus, tokenizer)
    if rollouts:
        train_ids, held_ids = _rollouts(target, target_dir, train_ids, held_ids, rollouts, cfg, prompt_len,
                                        rollout_temperatures)
    weights = position_weights(block, gamma, device)
    step_fn = _step(model, target, layers, block, anchors, mask_id, weights, cfg, device, greedy_path_labels,
                    max(1, prompt_len), context_window, loss)  # rollouts: anchors in the continuation of whole rows
    ckpt = out / "checkpoint"
    start = checkpoint_io.load(model, opt, ckpt) if resume and checkpoint_io.exists(ckpt) else 0
    final = optimize(model.parameters(), opt, lambda step: step_fn(train_ids, step, cfg.seed)[0], cfg, console,
                     "dflash", start, checkpoint_io.every(model, opt, ckpt, cfg.save_every, cfg.steps))
    with torch.no_grad():
        held = [step_fn(held_ids, i, 12345) for i in range(cfg.eval_batches)]
    report = {"kind": "dflash", "block_size": block, "layers": num_layers, "target_layer_ids": list(layers),
              "intermediate_size": model.config.intermediate_size,
              "steps": cfg.steps, "final_loss": final, "held_out_loss": sum(float(h[0]) for h in held) / len(held),
              "held_out_first_token_accuracy": float(sum(h[1] for h in held) / len(held)),
              # 1 + the mean run of right guesses from slot 1: a chain's tau if the target's greedy path were the
              # rollout itself (it is, in the continuation of rollouts)
              "held_out_chain_tau": float(sum(h[2] for h in held) / len(held)),
              "held_out_position_accuracy": [round(v, 4) for v in torch.stack([h[3] for h in held]).mean(0).tolist()],
              # KL(p || q) by the position weights, whatever the loss: how closely q follows the target's p
              "held_out_kl": float(sum(h[4] for h in held) / len(held)),
              "context_window": context_window,
              "corpus_files_hash": corpus.files_hash, "rollouts": rollouts, "rollout_prompt_len": prompt_len,
              "rollout_temperatures": list(rollout_temperatures) if rollouts else [], "loss": loss,
              "init_from": str(init_from) if init_from is not None else None,
              "anchors": anchors, "greedy_path_labels": greedy_path_labels,
              "parameters": sum(p.numel() for p in model.parameters())}
    save_dflash(model, target.config, layers, block, mask_id, out, report, cfg.save_dtype)
    return report


def label_mask(tokens: torch.Tensor, greedy: torch.Tensor, seq: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """[R, block-1] 1.0 where a draft position's label is the one inference asks for. Slot k's label is the target's
    greedy token after the corpus prefix through a+k; a step verifies the target's own greedy continuation of the
    anchor, so the label is right only while the corpus tokens a+1 .. a+k are the target's greedy tokens. at:
    [R, block-1] the label positions a+k."""
    follows = (tokens[seq[:, None], at[:, :-1] + 1] == greedy[seq[:, None], at[:, :-1]]).float()
    return torch.cat([torch.ones_like(follows[:, :1]), follows.cumprod(-1)], dim=-1)


def _check_options(loss: str, rollouts: int, temperatures: tuple[float, ...], greedy_path_labels: bool) -> None:
    if loss not in ("ce", "kl"):
        raise ValueError(f"--loss {loss!r}: choose ce (the target's greedy token) or kl (its distribution)")
    if loss == "kl" and greedy_path_labels:
        raise ValueError("--greedy-path-labels masks greedy labels; it does not apply to --loss kl")
    if not temperatures or any(t < 0 for t in temperatures):
        raise ValueError(f"--rollout-temperature {list(temperatures)}: give one or more values >= 0 (0: greedy)")
    if tuple(temperatures) != (0.0,) and not rollouts:
        raise ValueError("--rollout-temperature needs --rollouts N (the rollouts drawn at each temperature)")


def _load_init(model: DFlashModel, init: Path, layers, block: int, mask_id: int) -> None:
    """The weights of the DFlash drafter in `init` (W12N or plain safetensors), which must have this run's shape."""
    from specpilot.checkpoint.directory import safetensors_files
    from specpilot.models.dflash import read_config

    if not (init / "config.json").exists():
        raise FileNotFoundError(f"--init-from {init}: no DFlash drafter there (no config.json)")
    cfg, init_layers, init_block, init_mask, _ = read_config(init)
    mine = model.config
    theirs = (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size, init_layers, init_block,
              init_mask)
    wanted = (mine.hidden_size, mine.intermediate_size, mine.num_hidden_layers, mine.vocab_size, tuple(layers), block,
              mask_id)
    if theirs != wanted:
        names = ("hidden_size", "intermediate_size", "layers", "vocab_size", "target_layers", "block_size", "mask id")
        diff = ", ".join(f"{n} {t} (this run: {w})" for n, t, w in zip(names, theirs, wanted) if t != w)
        raise ValueError(f"--init-from {init}: the drafter differs from this run's: {diff}")
    load_weights(model, safetensors_files(init), progress=False)


def soft_label_kl(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row, fp32: p = softmax(target_logits), q = softmax(logits); [..., vocab] -> [...]."""
    return F.kl_div(F.log_softmax(logits.float(), -1), F.log_softmax(target_logits.float(), -1), reduction="none",
                    log_target=True).sum(-1)


def _step(model, target, layers, block, anchors, mask_id, weights, cfg: TrainConfig, device,
          greedy_path_labels: bool = False, first_anchor: int = 1, context_window: int | None = None,
          loss: str = "ce"):
    def run(tokens_all, step: int, seed: int):
        tokens = batch_at(tokens_all, step, seed, cfg.batch_size, cfg.seq_len, rows=first_anchor > 1).to(device)
        with torch.no_grad():
            features, target_logits = _target_outputs(target, tokens, layers)
            greedy = target_logits.argmax(-1)
        gen = torch.Generator().manual_seed(seed * 7919 + step)
        a = torch.randint(first_anchor, cfg.seq_len - block + 1, (tokens.shape[0], anchors), generator=gen).to(device)
        # bf16 mixed precision for the drafter on a GPU; the target's features and labels stay fp32 (they are the
        # same numbers the fp32 rollouts were generated with)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = dflash_forward(model, target, features, tokens, a, block, mask_id, context_window)
        seq = torch.arange(tokens.shape[0], device=device).repeat_interleave(anchors)
        # position a+k's label: the target's greedy token after the true prefix up to a+k-1
        at = a.reshape(-1)[:, None] + torch.arange(0, block - 1, device=device)
        labels = greedy[seq[:, None], at]
        # position a+k's soft label: the target's distribution there ([R, block-1]; a statistic under "ce")
        with torch.set_grad_enabled(loss == "kl" and torch.is_grad_enabled()):
            kl = soft_label_kl(logits, target_logits[seq[:, None], at])
        if loss == "kl":
            ce = kl
        else:
            ce = F.cross_entropy(logits.float().transpose(1, 2), labels, reduction="none")  # [R, block-1]
        right = (logits.argmax(-1) == labels).float()  # [R, block-1]
        # device tensors: a training step reads none of them, so they cost it no host sync
        stats = (right[:, 0].mean(), 1 + right.cumprod(-1).sum(-1).mean(), right.mean(0),
                 (kl.detach() * weights).sum(-1).mean())
        if not greedy_path_labels:
            return (ce * weights).sum(-1).mean(), *stats
        # each position's mean over its kept labels, so that the position weights keep their shares
        keep = label_mask(tokens, greedy, seq, at)
        per_position = (ce * keep).sum(0) / keep.sum(0).clamp(min=1.0)
        return (per_position * weights).sum(), *stats

    return run


def _features(target, tokens, layers) -> tuple[torch.Tensor, torch.Tensor]:
    """(the concatenated hidden states of `layers` [B, L, K*H], the target's greedy next token at each position
    [B, L]): drafters learn what the target would emit (self-distillation), not what the corpus says."""
    features, logits = _target_outputs(target, tokens, layers)
    return features, logits.argmax(-1)


def _target_outputs(target, tokens, layers) -> tuple[torch.Tensor, torch.Tensor]:
    """(the concatenated hidden states of `layers` [B, L, K*H], the target's next-token logits [B, L, vocab] fp32)."""
    from specpilot.runtime.cache import ModelCache

    B, L = tokens.shape
    cache = ModelCache(target.config, B, L, tokens.device, torch.float32)
    meta = BatchMetadata.contiguous(tokens, torch.zeros(B, dtype=torch.long, device=tokens.device),
                                    torch.arange(B, device=tokens.device), 0)
    hidden, captured = target(meta, cache, tuple(layers))
    return torch.cat(captured, dim=-1), target.logits(hidden).float()


def _rollout_prompt_len(cfg: TrainConfig, prompt_len: int | None) -> int:
    return prompt_len if prompt_len is not None else max(1, min(32, cfg.seq_len // 4))


def _rollouts(target, target_dir, train_ids, held_ids, count: int, cfg: TrainConfig, prompt_len: int | None = None,
              temperatures: tuple[float, ...] = (0.0,)):
    """(train, held-out) streams of the target's own rollouts at each temperature (joined), prompted from the
    corpus's two splits."""
    from specpilot.train.rollouts import rollout_stream

    prompt = _rollout_prompt_len(cfg, prompt_len)
    held = max(4, min(64, count // 16))
    batch = 1024 if next(target.parameters()).is_cuda else 256  # a GPU decodes 1024 rows about as fast as 256
    streams = [(rollout_stream(target, target_dir, train_ids, count, cfg.seq_len, prompt, batch, cfg.seed, t),
                rollout_stream(target, target_dir, held_ids, held, cfg.seq_len, prompt, batch, cfg.seed + 1, t))
               for t in temperatures]
    return torch.cat([s[0] for s in streams]), torch.cat([s[1] for s in streams])


def _init(model: DFlashModel) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02)
        for layer in model.layers:  # residual branches start small
            layer.self_attn.o_proj.weight.mul_(1 / math.sqrt(2 * len(model.layers)))
            layer.mlp.down_proj.weight.mul_(1 / math.sqrt(2 * len(model.layers)))


def layer_fields(cfg: ModelConfig) -> dict:
    """The Hugging Face config fields of a draft's Qwen3 layers, as DFlash-family directories write them."""
    return {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps}


def save_dflash(model: DFlashModel, target_cfg: ModelConfig, layers, block: int, mask_id: int, out: Path,
                report: dict, save_dtype: str = "bfloat16") -> None:
    """`out`, whole or not at all (train/output_dir.py), as a z-lab DFlashDraftModel directory."""
    cfg = model.config
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **layer_fields(cfg),
              "rope_theta": cfg.rope.theta, "max_position_embeddings": cfg.max_position_embeddings, "block_size": block,
              "num_target_layers": target_cfg.num_hidden_layers,
              "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": list(layers)}}
    save_drafter(out, cast_state(unpacked_state_dict(model), save_dtype), config, report)
