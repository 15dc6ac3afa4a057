"""Builds a drafter from its CLI name (`ngram`, `none`, `mtp`: the target's own MTP layer; `mtp:FILE` / `mtp:N`: it
over a reduced draft vocabulary, drafters/draft_vocab.py; a `+fp8` suffix: its LM head as an FP8 copy) or from a
checkpoint directory / Hub id.

Checkpoints are dispatched on their config's `architectures`: drafter formats of their own (DFlash, EAGLE-3) by
the CHECKPOINT_DRAFTERS table, and any supported causal LM becomes a draft LM (which must share the target's
tokenizer). These tables are the only place drafter kinds are named.
"""

from __future__ import annotations

import json
from pathlib import Path

from specpilot.checkpoint.directory import resolve_model_dir
from specpilot.checkpoint.errors import CheckpointError
from specpilot.config import SUPPORTED_ARCHITECTURES, ConfigError, ModelConfig
from specpilot.models.causal_lm import CausalLM
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.runtime.settings import Runtime
from specpilot.spec_decode.drafters.dflash import load_dflash
from specpilot.spec_decode.drafters.dflash2 import load_dflash2
from specpilot.spec_decode.drafters.draft_lm import DraftLMDrafter
from specpilot.spec_decode.drafters.draft_vocab import DraftVocab
from specpilot.spec_decode.drafters.dspark import load_dspark
from specpilot.spec_decode.drafters.eagle3 import Eagle3Drafter
from specpilot.spec_decode.drafters.mtp import MTPDrafter
from specpilot.spec_decode.drafters.ngram import NgramDrafter

NAMED = {"ngram": NgramDrafter}
FP8_SUFFIX = "+fp8"  # an MTP drafter whose LM head is an FP8 copy of the target's (layers/fp8_linear.py)


def _eagle3(model_dir, target, dtype, runtime):
    # the head's per-request forwards have varying shapes and run plain torch (KernelPaths PLAIN) on any runtime
    return Eagle3Drafter.from_pretrained(model_dir, target, dtype)


# checkpoint architectures with a drafter of their own: builder(model_dir, target, dtype, runtime) -> Drafter
CHECKPOINT_DRAFTERS = {"DFlashDraftModel": load_dflash,
                       "DFlash2DraftModel": load_dflash2,
                       "Qwen3DSparkModel": load_dspark,
                       "LlamaForCausalLMEagle3": _eagle3,
                       "Eagle3LlamaForCausalLM": _eagle3}


def split_head_format(name: str) -> tuple[str, str]:
    """`mtp...+fp8` -> (`mtp...`, "fp8"); any other name -> (name, "bf16")."""
    return (name[:-len(FP8_SUFFIX)], "fp8") if name.endswith(FP8_SUFFIX) else (name, "bf16")


def _mtp(target, dtype, runtime, vocab: str | None, head_format: str):
    # the MTP layer lives in the target's own checkpoint (mtp.* keys), found where the target was loaded from
    draft_vocab = DraftVocab.parse(vocab, "--drafter mtp:") if vocab is not None else None
    model_dir = getattr(target, "checkpoint_dir", None)
    if model_dir is None:
        raise ConfigError("--drafter mtp reads the MTP layer from the target's checkpoint directory; this target "
                          "was not loaded from one (load it with models.loader.load_model)")
    return MTPDrafter.from_target(model_dir, target, dtype, runtime, draft_vocab, head_format)


def build_drafter(name: str, target: CausalLM, target_tokenizer=None, dtype="auto", cache_dir: str | None = None,
                  runtime: Runtime | None = None):
    """Returns a Drafter, or None for `none`. runtime: the target runner's (ModelRunner.runtime), handed to the
    drafter so that the engine's settings (CUDA graphs, weight format, ablations) reach it; default:
    Runtime.build(EngineConfig(), the target's device)."""
    if name == "none":
        return None
    if name in NAMED:
        return NAMED[name]()
    base, head_format = split_head_format(name)
    if base == "mtp" or base.startswith("mtp:"):
        return _mtp(target, dtype, runtime, base[len("mtp:"):] if base != "mtp" else None, head_format)
    if head_format != "bf16":
        raise ConfigError(f"--drafter {name}: the {FP8_SUFFIX} suffix applies to the MTP drafter only "
                          f"(mtp{FP8_SUFFIX}, mtp:N{FP8_SUFFIX}, mtp:FILE{FP8_SUFFIX})")
    model_dir = resolve_model_dir(name, cache_dir)
    archs = _architectures(model_dir)
    own = [a for a in archs if a in CHECKPOINT_DRAFTERS]
    if own:
        return CHECKPOINT_DRAFTERS[own[0]](model_dir, target, dtype, runtime)
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ConfigError(f"{model_dir}: architectures={archs!r} is not a drafter specpilot can run; use a causal LM "
                          f"of a supported family ({', '.join(sorted(SUPPORTED_ARCHITECTURES))}), ngram or none")
    _check_vocab_size(model_dir, ModelConfig.from_file(model_dir / "config.json"), target.config)
    if target_tokenizer is not None:
        _check_tokenizer(model_dir, load_tokenizer(str(model_dir)), target_tokenizer)
    device = next(target.parameters()).device
    dtype = next(target.parameters()).dtype if dtype == "auto" else dtype
    return DraftLMDrafter(load_model(str(model_dir), device, dtype), runtime)


def _architectures(model_dir: Path) -> list[str]:
    try:
        return json.loads((model_dir / "config.json").read_text()).get("architectures") or []
    except FileNotFoundError:
        raise ConfigError(f"{model_dir}: no config.json; a drafter directory needs one") from None


def _check_vocab_size(model_dir, draft: ModelConfig, target: ModelConfig) -> None:
    # the draft model embeds every token the target emits and proposes ids the target must embed
    if draft.vocab_size != target.vocab_size:
        raise CheckpointError(f"{model_dir}: the draft model's vocab_size {draft.vocab_size} differs from the target's "
                              f"{target.vocab_size}; a draft model must have the target's vocabulary")


def _check_tokenizer(model_dir, draft_tok, target_tok) -> None:
    draft_vocab, target_vocab = draft_tok.get_vocab(), target_tok.get_vocab()
    if draft_vocab != target_vocab:
        differ = sorted(set(draft_vocab.items()) ^ set(target_vocab.items()))[:3]
        raise CheckpointError(f"{model_dir}: the drafter's tokenizer differs from the target's "
                              f"({len(draft_vocab)} vs {len(target_vocab)} tokens; e.g. {differ}); a draft model "
                              "must share the target's vocabulary")
