"""Self-distillation data for drafters: the target's own continuations of corpus prompts, greedy or sampled.

A drafter is judged on the text the target generates, which (for a small model above all) is far more regular
than the corpus. So drafters train on rollouts: `count` prompts of `prompt_len` tokens drawn from the corpus
stream (seeded), each continued by the target to `seq_len` tokens, joined into one stream. At temperature 0 the
continuation is the target's greedy one; at temperature T > 0 it is sampled from softmax(logits / T) (one seeded
generator per batch of rows), the text a sampling request sees. With a long
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
                   prompt_len: int = 32, batch: int = 256, seed: int = 0, temperature: float = 0.0) -> torch.Tensor:
    """int64 [count * seq_len]: rollouts of `target` (a loaded CausalLM) from prompts cut out of `tokens`, greedy
    (temperature 0) or sampled at `temperature`."""
    if temperature < 0:
        raise ValueError(f"rollout temperature {temperature}: must be >= 0 (0: greedy)")
    device = next(target.parameters()).device.type
    key = _key(target_dir, tokens, count, seq_len, prompt_len, seed, batch, device, temperature)
    path = cache_dir() / f"rollouts-{key}.safetensors"
    if path.exists():
        return load_file(str(path))["tokens"].long()
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - prompt_len, (count,), generator=gen).tolist()
    rows = []
    for i in range(0, count, batch):
        prompts = [tokens[s:s + prompt_len].tolist() for s in starts[i:i + batch]]
        new = seq_len - prompt_len
        outs = (_greedy(target, prompts, new) if temperature == 0 else
                _sampled(target, prompts, new, temperature, seed * 1_000_003 + i))
        rows.extend(p + out for p, out in zip(prompts, outs))
    stream = torch.tensor(rows, dtype=torch.int32).reshape(-1)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    save_file({"tokens": stream}, tmp)
    os.replace(tmp, path)
    return stream.long()


def _runner(target):
    from specpilot.config import Ablations, EngineConfig
    from specpilot.runtime.runner import ModelRunner
    from specpilot.runtime.settings import Runtime

    # plain eager kernels under CUDA graphs: data generation should not depend on the newest fast paths
    engine = EngineConfig(ablations=Ablations(compile_pointwise=False, decode_gemv=False, fused_qk_rope_store=False))
    return ModelRunner(target, Runtime.build(engine, next(target.parameters()).device))


def _greedy(target, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    from specpilot.engine.generator import Generator
    from specpilot.runtime.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    with torch.inference_mode():  # the prompts (all of one length) prefill together
        return [r.token_ids for r in Generator(_runner(target), (), prefill_together=True).generate(prompts, params)]


def _sampled(target, prompts: list[list[int]], new_tokens: int, temperature: float, seed: int) -> list[list[int]]:
    """Each prompt continued by plain sampling at `temperature` (no top-k / top-p), every draw from one generator
    seeded `seed`: the batch's rows are independent draws, and the same seed gives the same rows."""
    from specpilot.runtime.sampling import SamplingParams, filtered_probs, race

    runner = _runner(target)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=temperature, ignore_eos=True)
    gen = torch.Generator(device=runner.device).manual_seed(seed)
    with torch.inference_mode():
        runner.allocate(len(prompts), len(prompts[0]) + new_tokens + 1)
        logits = runner.prefill_many(prompts)
        positions = torch.full((len(prompts),), len(prompts[0]), dtype=torch.long, device=runner.device)
        out = []
        for step in range(new_tokens):
            out.append(race(filtered_probs(logits, params), gen))
            if step + 1 < new_tokens:
                logits = runner.decode(out[-1], positions)
        return torch.stack(out, dim=1).tolist()


def _key(target_dir, tokens: torch.Tensor, count: int, seq_len: int, prompt_len: int, seed: int, batch: int,
         device: str, temperature: float = 0.0) -> str:
    # the batch and the device are in the key: batched greedy decoding on another batch size or device can round
    # a near-tie the other way, and the cache must not hand one run's rollouts to a different recipe
    recipe = f"{count} {seq_len} {prompt_len} {seed} {batch} {device}" + (f" T={temperature!r}" if temperature else "")
    h = hashlib.sha256(recipe.encode())
    h.update(tokens.to(torch.int32).numpy().tobytes())  # the prompts' source
    for f in sorted(Path(target_dir).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:24]
