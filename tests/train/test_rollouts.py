"""Self-distillation rollouts: each row is the prompt cut from the corpus stream plus the target's own greedy
continuation, the stream is cached by the target's weights, and drafters train on it."""

import pytest
import torch

from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_model
from specpilot.train.rollouts import rollout_stream


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_rows_are_greedy_continuations_and_cached(name, checkpoint_factory, monkeypatch):
    """Rows are made by one batched prefill and batched decode steps; each equals the plain generator's
    continuation of its prompt alone (dense, and hybrid with its recurrent state)."""
    path, _ = checkpoint_factory(name)
    target = load_model(str(path), "cpu", "float32")
    tokens = torch.randint(0, target.config.vocab_size, (400,))
    stream = rollout_stream(target, path, tokens, count=5, seq_len=20, prompt_len=6, batch=2, seed=3)
    rows = stream.reshape(5, 20)
    gen = torch.Generator().manual_seed(3)
    starts = torch.randint(0, len(tokens) - 6, (5,), generator=gen).tolist()
    for row, s in zip(rows.tolist(), starts):
        prompt = tokens[s:s + 6].tolist()
        greedy = Generator(ModelRunner(target)).generate([prompt], SamplingParams(max_new_tokens=14, ignore_eos=True))
        assert row == prompt + greedy[0].token_ids
    monkeypatch.setattr("specpilot.train.rollouts._greedy", None)  # a second call must come from the cache
    assert torch.equal(rollout_stream(target, path, tokens, count=5, seq_len=20, prompt_len=6, batch=2, seed=3),
                       stream)
    with pytest.raises(TypeError):  # another batch size is another cache entry: it must generate (and cannot here)
        rollout_stream(target, path, tokens, count=5, seq_len=20, prompt_len=6, batch=3, seed=3)
