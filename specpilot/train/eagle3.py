"""`specpilot train drafter --kind eagle3`: an EAGLE-3 head trained against a frozen target.

The head reads the outputs of three target layers (EAGLE-3's low / mid / high taps), fused by `fc`, paired with
the embedding of the next token; at position p it learns the target's greedy token p+2 (self-distillation). The
draft vocabulary is the corpus's most frequent target tokens (d2t / t2d maps). Training runs the drafter's own
inference forward (causal over the block, a scratch cache per step), so train and serve cannot drift. This is step-0 teacher forcing only: the
training-time test (unrolling on the head's own outputs) is not done yet, so deeper drafts are weaker than a
full EAGLE-3 recipe would give. The result is a SafeAILab-layout directory (`LlamaForCausalLMEagle3`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specpilot.layers.metadata import BatchMetadata
from specpilot.models.loader import load_model, load_tokenizer, unpacked_state_dict
from specpilot.models.eagle3 import Eagle3Head, eagle3_target_layers, head_config
from specpilot.spec_decode.drafters.eagle3 import Eagle3Drafter
from specpilot.train import checkpoint as checkpoint_io
from specpilot.train.corpus import Corpus
from specpilot.train.dflash import _features, _rollouts
from specpilot.train.lm import TrainConfig, batch_at, train_device
from specpilot.train.loop import optimize
from specpilot.train.output_dir import cast_state, save_drafter
from specpilot.train.tokens import corpus_tokens


def tap_inputs(num_layers: int) -> tuple[int, int, int]:
    """Input-of-layer ids of the three taps: EAGLE-3's (2, L//2, L-3), spread out on shallow targets."""
    if num_layers >= 7:
        return (2, num_layers // 2, num_layers - 3)
    return (1, 1 + (num_layers - 1) // 2, num_layers)


def head_raw_config(target_cfg, draft_vocab: int, taps) -> dict:
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": target_cfg.hidden_size,
            "intermediate_size": target_cfg.intermediate_size, "num_attention_heads": target_cfg.num_attention_heads,
            "num_key_value_heads": target_cfg.num_key_value_heads, "head_dim": target_cfg.head_dim,
            "rms_norm_eps": target_cfg.rms_norm_eps, "rope_theta": target_cfg.rope.theta,
            "max_position_embeddings": target_cfg.max_position_embeddings, "vocab_size": target_cfg.vocab_size,
            "draft_vocab_size": draft_vocab, "num_hidden_layers": 1, "eagle_aux_hidden_state_layer_ids": list(taps)}


def draft_vocabulary(tokens: torch.Tensor, vocab: int, size: int) -> torch.Tensor:
    """The `size` most frequent token ids (ascending), always including the EOS-like ids that occur."""
    counts = torch.bincount(tokens, minlength=vocab)
    return counts.topk(min(size, vocab)).indices.sort().values


def train_eagle3(corpus: Corpus, target_dir: str | Path, out: str | Path, cfg: TrainConfig,
                 draft_vocab_size: int | None = None, rollouts: int = 0, resume: bool = False, console=None) -> dict:
    """rollouts > 0: train on that many greedy rollouts of the target instead of the corpus text (the draft
    vocabulary then comes from the rollouts too: the tokens the target emits)."""
    out = Path(out)
    device = train_device(cfg)
    tokenizer = load_tokenizer(str(target_dir))
    target = load_model(str(target_dir), device, "float32").requires_grad_(False)
    tcfg = target.config
    train_ids, held_ids = corpus_tokens(corpus, tokenizer)
    if rollouts:
        train_ids, held_ids = _rollouts(target, target_dir, train_ids, held_ids, rollouts, cfg)
    selected = draft_vocabulary(train_ids, tcfg.vocab_size, draft_vocab_size or min(32000, tcfg.vocab_size)).to(device)
    taps = tap_inputs(tcfg.num_hidden_layers)
    raw = head_raw_config(tcfg, selected.numel(), taps)
    torch.manual_seed(cfg.seed)
    head = Eagle3Head(head_config(raw, "train"), tcfg.hidden_size, selected.numel(), False, False).to(device)
    _init(head, selected, tcfg.vocab_size)
    drafter = Eagle3Drafter(head, target, eagle3_target_layers(tcfg.num_hidden_layers, taps))
    to_draft = torch.full((tcfg.vocab_size,), -100, dtype=torch.long, device=device)
    to_draft[selected] = torch.arange(selected.numel(), device=device)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    ckpt = out / "checkpoint"
    start = checkpoint_io.load(head, opt, ckpt) if resume and checkpoint_io.exists(ckpt) else 0
    loss = optimize(params, opt, lambda step: _loss(drafter, target, train_ids, step, cfg.seed, cfg, to_draft, device,
                                                  train=True)[0], cfg, console, "eagle3", start,
                    checkpoint_io.every(head, opt, ckpt, cfg.save_every, cfg.steps))
    with torch.no_grad():
        held = [_loss(drafter, target, held_ids, i, 12345, cfg, to_draft, device, train=False)
                for i in range(cfg.eval_batches)]
    report = {"kind": "eagle3", "draft_vocab_size": selected.numel(), "taps_input_of_layers": list(taps),
              "steps": cfg.steps, "final_loss": loss, "held_out_loss": sum(float(h[0]) for h in held) / len(held),
              "held_out_top1_accuracy": sum(h[1] for h in held) / len(held), "training_time_test": False,
              "rollouts": rollouts,
              "corpus_files_hash": corpus.files_hash}
    save_eagle3(head, raw, out, report, cfg.save_dtype)
    return report


def _init(head: Eagle3Head, selected: torch.Tensor, vocab: int) -> None:
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name in ("d2t", "t2d"):
                continue
            p.fill_(1.0) if p.ndim == 1 else p.normal_(0, 0.02)
        head.d2t.copy_(selected - torch.arange(selected.numel(), device=selected.device))
        head.t2d.zero_()
        head.t2d[selected] = True


def _loss(drafter: Eagle3Drafter, target, tokens_all, step: int, seed: int, cfg: TrainConfig, to_draft, device,
          train: bool):
    """Teacher-forced step 0: pair (feature_p, token_p+1), predict the target's greedy token p+2, over windows."""
    tokens = batch_at(tokens_all, step, seed, cfg.batch_size, cfg.seq_len).to(device)
    with torch.no_grad():
        features, greedy = _features(target, tokens, drafter.target_layers)
    # bf16 mixed precision for the head's training steps on a GPU (the target's features and labels stay fp32;
    # held-out evaluation runs in fp32)
    with torch.set_grad_enabled(train), torch.autocast(device.type, dtype=torch.bfloat16,
                                                       enabled=train and device.type == "cuda"):
        logits = eagle3_forward(drafter, features, tokens)
    labels = to_draft[greedy[:, 1:-1]]  # the target's greedy token at p+2 (self-distillation)
    loss = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100)
    hit = (logits.argmax(-1) == labels).float()[labels >= 0].mean()
    return loss, float(hit)


def eagle3_forward(drafter: Eagle3Drafter, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """features [B, L, 3*H] and tokens [B, L] -> step-0 draft logits [B, L-2, draft vocab]: head position p pairs
    feature p with token p+1 (RoPE position p, causal, a scratch cache) and predicts token p+2."""
    B, L = tokens.shape
    device = tokens.device
    drafter.cache = None
    drafter.allocate(B, L)
    meta = BatchMetadata.contiguous(tokens[:, 1:], torch.zeros(B, dtype=torch.long, device=device),
                                    torch.arange(B, device=device), 0)
    h = drafter.forward(meta, drafter.head.fc(features[:, :-1]))
    return drafter.draft_logits(h[:, :-1])


def save_eagle3(head: Eagle3Head, raw: dict, out: Path, report: dict, save_dtype: str = "bfloat16") -> None:
    """`out`, whole or not at all (train/output_dir.py); the vocabulary maps d2t / t2d keep their dtypes."""
    save_drafter(out, cast_state(unpacked_state_dict(head), save_dtype, keep=("d2t", "t2d")), raw, report)
