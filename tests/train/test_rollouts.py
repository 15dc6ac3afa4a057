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


def test_sampled_rows_are_draws_from_the_target(checkpoint_factory, tmp_path, monkeypatch):
    """At temperature T the continuation is sampled from softmax(logits / T): with every prompt alike, the first
    new token's frequencies over 3,000 rows match the target's distribution (chi-square); the same seed gives the
    same rows, each temperature is its own cache entry, and a negative temperature is refused."""
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    path, _ = checkpoint_factory("qwen3")
    target = load_model(str(path), "cpu", "float32")
    tokens = torch.full((50,), 7)  # every prompt is [7] * 4
    temperature = 0.5
    stream = rollout_stream(target, path, tokens, count=3000, seq_len=6, prompt_len=4, batch=1000, seed=1,
                            temperature=temperature)
    rows = stream.reshape(3000, 6)
    assert (rows[:, :4] == 7).all()
    runner = ModelRunner(target)
    runner.allocate(1, 8)
    with torch.inference_mode():
        p = torch.softmax(runner.prefill(0, [7] * 4).float() / temperature, -1)
    top = p.argsort(descending=True)[:6]  # the likely tokens one by one, the rest in one bin
    counts = torch.stack([(rows[:, 4] == t).sum() for t in top.tolist()]).double()
    probs = p[top].double()
    observed = torch.cat([counts, (3000 - counts.sum())[None]])
    expected = torch.cat([probs, (1 - probs.sum()).clamp(min=0)[None]]) * 3000
    stat = float(((observed - expected) ** 2 / expected).sum())
    assert stat < 22.46  # chi-square, 6 degrees of freedom: p = 0.001
    greedy = rollout_stream(target, path, tokens, count=3000, seq_len=6, prompt_len=4, batch=1000, seed=1)
    assert not torch.equal(greedy, stream)  # another cache entry: greedy rows all follow the argmax
    assert (greedy.reshape(3000, 6)[:, 4] == p.argmax()).all()
    monkeypatch.setattr("specpilot.train.rollouts._sampled", None)  # a second call must come from the cache
    assert torch.equal(rollout_stream(target, path, tokens, count=3000, seq_len=6, prompt_len=4, batch=1000, seed=1,
                                      temperature=temperature), stream)
    with pytest.raises(ValueError, match="must be >= 0"):
        rollout_stream(target, path, tokens, count=4, seq_len=6, prompt_len=4, batch=4, seed=1, temperature=-1.0)


def test_sampled_rows_repeat_with_the_seed(checkpoint_factory, tmp_path, monkeypatch):
    """Sampled rows are a function of the seed (generated twice, no cache between), and the rows of one batch are
    independent draws (not one noise row shared by every row)."""
    path, _ = checkpoint_factory("qwen3_5")
    target = load_model(str(path), "cpu", "float32")
    tokens = torch.full((50,), 7)
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "a"))
    a = rollout_stream(target, path, tokens, count=64, seq_len=10, prompt_len=4, batch=64, seed=2, temperature=1.0)
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "b"))
    b = rollout_stream(target, path, tokens, count=64, seq_len=10, prompt_len=4, batch=64, seed=2, temperature=1.0)
    assert torch.equal(a, b)
    assert len({tuple(r) for r in a.reshape(64, 10).tolist()}) > 32
