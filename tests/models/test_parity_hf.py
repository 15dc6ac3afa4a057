"""Our models against transformers' reference implementations on tiny random checkpoints (fp32, CPU)."""

import pytest
import torch

from specpilot.runtime.cache import ModelCache
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.loader import load_model

CASES = {
    "llama-gqa2": ("llama", {}),
    "llama3-rope-1kv-tied": ("llama3", {}),
    "qwen3-tied": ("qwen3", {}),
    "qwen3-untied-mha": ("qwen3_untied", {}),
    "qwen3-1kv": ("qwen3", {"num_key_value_heads": 1}),
    "qwen3_5-int2-ratio2": ("qwen3_5", {}),
    "qwen3_5-int3-ratio1": ("qwen3_5", {"full_attention_interval": 3, "num_hidden_layers": 3,
                                        "linear_num_value_heads": 2}),
    "qwen3_5-int4-ratio3": ("qwen3_5", {"full_attention_interval": 4, "linear_num_value_heads": 6,
                                        "tie_word_embeddings": True}),
}


def _logits(model, ids):
    cache = ModelCache(model.config, 1, ids.shape[1] + 1, "cpu", torch.float32)
    meta = BatchMetadata.contiguous(ids, torch.tensor([0]), torch.tensor([0]), 0)
    return model.logits(model(meta, cache))


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(case, checkpoint_factory):
    name, overrides = CASES[case]
    path, hf = checkpoint_factory(name, **overrides)
    ours = load_model(str(path), "cpu", "float32")
    ids = torch.randint(0, hf.config.vocab_size, (1, 70))
    with torch.no_grad():
        ref = hf(ids).logits
        out = _logits(ours, ids)
    rel = (out - ref).abs().max() / ref.abs().max()
    assert rel < 1e-4, f"{case}: max relative error {rel:.2e}"


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_continuation_matches_transformers(case, checkpoint_factory):
    name, overrides = CASES[case]
    path, hf = checkpoint_factory(name, **overrides)
    gen = Generator(ModelRunner(load_model(str(path), "cpu", "float32")))
    prompt = torch.randint(0, hf.config.vocab_size, (23,)).tolist()
    ours = gen.generate([prompt], SamplingParams(max_new_tokens=64))[0].token_ids
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref
