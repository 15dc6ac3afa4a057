"""Self-distillation data for drafters: the target's own greedy continuations of corpus prompts.

A drafter is judged on the text the target generates, which (for a small model above all) is far more regular
than the corpus. So drafters train on rollouts: `count` prompts of `prompt_len` tokens drawn from the corpus
stream (seeded), each continued greedily by the target to `seq_len` tokens, joined into one stream. With a long
prompt (real text) and a short continuation, a window looks like a served request: a prompt, then what the
target itself generates after it. The labels still come from the target's forward over each training window,
so they are exact wherever the window falls. Rollouts are cached beside the token streams, keyed by the target's
weights and the recipe.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specpilot.train.tokens import cache_dir


def rollout_stream(target, target_dir: str | Path, tokens: torch.Tensor, count: int, seq_len: int,
                   prompt_len: int = 32, batch: int = 256, seed: int = 0) -> torch.Tensor:
    """int64 [count * seq_len]: greedy rollouts of `target` (a loaded CausalLM) from prompts cut out of `tokens`."""
    device = next(target.parameters()).device.type
    key = _key(target_dir, tokens, count, seq_len, prompt_len, seed, batch, device)
    path = cache_dir() / f"rollouts-{key}.safetensors"
    if path.exists():
        return load_file(str(path))["tokens"].long()
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - prompt_len, (count,), generator=gen).tolist()
    rows = []
    for i in range(0, count, batch):
        prompts = [tokens[s:s + prompt_len].tolist() for s in starts[i:i + batch]]
        rows.extend(p + out for p, out in zip(prompts, _greedy(target, prompts, seq_len - prompt_len)))
    stream = torch.tensor(rows, dtype=torch.int32).reshape(-1)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    save_file({"tokens": stream}, tmp)
    os.replace(tmp, path)
    return stream.long()


def _greedy(target, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    from specpilot.config import Ablations, EngineConfig
    from specpilot.engine.generator import Generator
    from specpilot.runtime.runner import ModelRunner
    from specpilot.runtime.sampling import SamplingParams
    from specpilot.runtime.settings import Runtime

    # plain eager kernels under CUDA graphs: data generation should not depend on the newest fast paths; the
    # prompts (all of one length) prefill together
    engine = EngineConfig(ablations=Ablations(compile_pointwise=False, decode_gemv=False, fused_qk_rope_store=False))
    runner = ModelRunner(target, Runtime.build(engine, next(target.parameters()).device))
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    with torch.inference_mode():
        return [r.token_ids for r in Generator(runner, (), prefill_together=True).generate(prompts, params)]


def _key(target_dir, tokens: torch.Tensor, count: int, seq_len: int, prompt_len: int, seed: int, batch: int,
         device: str) -> str:
    # the batch and the device are in the key: batched greedy decoding on another batch size or device can round
    # a near-tie the other way, and the cache must not hand one run's rollouts to a different recipe
    h = hashlib.sha256(f"{count} {seq_len} {prompt_len} {seed} {batch} {device}".encode())
    h.update(tokens.to(torch.int32).numpy().tobytes())  # the prompts' source
    for f in sorted(Path(target_dir).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:24]
