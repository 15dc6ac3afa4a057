"""What the GPU gate tests run on: margin targets in the real shapes (bf16, CUDA), ragged prompts up to 4,096
tokens, and a drafter of every kind built with random weights of matching shape and vocabulary.

SPECPILOT_GPU_DRY_RUN=1 runs the same tests on the CPU in fp32 on the tiny shapes (short prompts): a check of the
tests themselves where there is no GPU (the kernel tests still skip).
"""

from __future__ import annotations

import os
import random

import torch
import transformers

from specpilot.bench.shapes import hf_config, margin_model, random_dflash
from specpilot.bench.synthetic import AcceptanceProfile

DRY = os.environ.get("SPECPILOT_GPU_DRY_RUN") == "1"
DEVICE, DTYPE = ("cpu", torch.float32) if DRY else ("cuda", torch.bfloat16)
# kind -> (shape, sweep depth): 4-8 layers for the sweep (the hybrid at 8 has two full-attention layers)
SWEEP = {"dense": ("tiny-dense", 2), "hybrid": ("tiny-hybrid", 4)} if DRY else \
    {"dense": ("Qwen3-8B", 4), "hybrid": ("Qwen3.5-27B", 8)}
BATCHES = (1, 3, 8)
# per batch size, the prompt lengths: ragged, up to 4,096 tokens of context with the new tokens
LENGTHS = {1: (37,), 3: (5, 300, 1200), 8: (2, 17, 64, 129, 511, 1000, 2047, 4000)}
NEW_TOKENS = 32
TREES = ("chain:5", "static:3,2,1", "dynamic:4,5,16")
DRAFTERS = ("ngram", "draft-lm", "dflash", "eagle3", "random-dflash")
ORACLE = AcceptanceProfile.load("dflash2-gsm8k")  # the synthetic oracle's profile (tau ~5.5 on a chain of 7)
# drafter contexts (K/V of target features) may differ from a prefill rebuild by rounding; a wrong row by O(1)
CONTEXT_TOL = 1e-3 if DRY else 0.1


def build_target(kind: str, full: bool = False):
    shape, layers = SWEEP[kind]
    cfg = hf_config(shape) if full else hf_config(shape, num_hidden_layers=layers)
    return margin_model(cfg, DEVICE, DTYPE)


def prompts(target, batch: int, seed: int = 0) -> list[list[int]]:
    """Ragged prompts (LENGTHS, capped at 200 tokens on a dry run). Longer ones end with an n-gram that occurred
    earlier followed by the target's own continuation (its margin chain), so that prompt lookup drafts get
    accepted for a while, then rejected."""
    rng, codes = random.Random(seed + batch), target.margin_codes
    memory, vocab = target.config.is_hybrid, target.config.vocab_size
    out = []
    for n in LENGTHS[batch]:
        n = min(n, 200) if DRY else n
        if n < 40:
            out.append([rng.randrange(vocab) for _ in range(max(n, 2))])
            continue
        head = [rng.randrange(vocab) for _ in range(n - 26)]
        out.append(head + codes.chain(head, 24, memory) + head[-2:])
    return out


def draft_lm(target):
    """A small dense margin model that predicts the target's chain with a quarter of its rows shuffled: right
    most of the time, wrong often enough to reject."""
    cfg = target.config
    draft = transformers.Qwen3Config(architectures=["Qwen3ForCausalLM"], vocab_size=cfg.vocab_size,
                                     hidden_size=256 if DRY else 2048, intermediate_size=512 if DRY else 2048,
                                     num_hidden_layers=2, num_attention_heads=4 if DRY else 16,
                                     num_key_value_heads=2 if DRY else 8, head_dim=64 if DRY else 128,
                                     rope_theta=1e6, max_position_embeddings=40960, tie_word_embeddings=False)
    return margin_model(draft, DEVICE, DTYPE, seed=1, codes=target.margin_codes.drifted(0.25))


def random_eagle3(target, draft_vocab: int = 4096, seed: int = 2):
    """An EAGLE-3 head of the target's width with random weights and a random draft vocabulary."""
    from specpilot.models.eagle3 import Eagle3Head, eagle3_target_layers, head_config
    from specpilot.spec_decode.drafters.eagle3 import Eagle3Drafter

    t = target.config
    draft_vocab = min(draft_vocab, t.vocab_size // 2)
    raw = dict(architectures=["LlamaForCausalLMEagle3"], hidden_size=t.hidden_size,
               intermediate_size=t.intermediate_size, num_attention_heads=t.num_attention_heads,
               num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim, rms_norm_eps=1e-6, rope_theta=1e6,
               vocab_size=t.vocab_size, draft_vocab_size=draft_vocab, num_hidden_layers=1,
               max_position_embeddings=t.max_position_embeddings)
    L = t.num_hidden_layers
    layers = eagle3_target_layers(L) if L >= 7 else (0, L // 2, L - 1)
    with torch.device("meta"):
        head = Eagle3Head(head_config(raw, "random EAGLE-3"), t.hidden_size, draft_vocab, False, False)
    head = head.to(dtype=DTYPE).to_empty(device=DEVICE).requires_grad_(False)
    head.rotary.reset_buffers()
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.is_floating_point():
                p.fill_(1.0) if p.ndim == 1 else p.normal_(0, 0.02, generator=gen)
        ids = torch.randperm(t.vocab_size, device=DEVICE, generator=gen)[:draft_vocab].sort().values
        head.d2t.copy_(ids - torch.arange(draft_vocab, device=DEVICE))
        head.t2d.zero_()
        head.t2d[ids] = True
    return Eagle3Drafter(head.eval(), target, layers)


def dflash_checkpoint(target, kind: str, path):
    """A random one-layer DFlash drafter saved as a checkpoint and loaded back through the drafter registry."""
    from specpilot.spec_decode.drafters.registry import build_drafter
    from specpilot.train.dflash import save_dflash

    d = random_dflash(target, SWEEP[kind][0], layers=1, seed=3)
    save_dflash(d.model, target.config, d.target_layers, d.block_size, d.mask_token_id, path, {})
    return build_drafter(str(path), target)


def make_drafter(name: str, target, kind: str, tmp_path):
    """(drafter, runs inside the synthetic oracle). The random-weight DFlash and EAGLE-3 drafters run inside it
    (they draft at full cost; the oracle's drafts, probed against the verify, get accepted as the profile says);
    n-gram and the draft LM draft for real."""
    if name == "ngram":
        from specpilot.spec_decode.drafters.ngram import NgramDrafter

        return NgramDrafter(), False
    if name == "draft-lm":
        from specpilot.spec_decode.drafters.draft_lm import DraftLMDrafter

        return DraftLMDrafter(draft_lm(target)), False
    if name == "dflash":
        return dflash_checkpoint(target, kind, tmp_path / f"dflash-{kind}"), True
    if name == "eagle3":
        return random_eagle3(target), True
    if name == "random-dflash":
        return random_dflash(target, SWEEP[kind][0]), True
    raise ValueError(name)
