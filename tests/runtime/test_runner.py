"""ModelRunner.prefill_many: prompts prefilled together give the logits, features, KV and recurrent state of one
prefill per slot (dense and hybrid, over several prefill chunks, with the Triton GDN prefill; prompts of different
lengths on the dense model, padded at the end)."""

import pytest
import torch

import specpilot.ops.gated_delta_rule as op
from specpilot.bench.shapes import hf_config, random_model
from specpilot.runtime.runner import ModelRunner
from tests.runtimes import set_paths

LAYERS = (0, 1)


def _state(runner, n):
    """The recurrent state of the first n slots (dim 1: slots); the KV is checked by the decode step after."""
    return [runner.cache.conv[:, :n], runner.cache.ssm[:, :n]]


def _runners(shape, triton_gdn, monkeypatch):
    model = random_model(hf_config(shape, num_hidden_layers=2), device="cpu", dtype=torch.float32, seed=5)
    if triton_gdn:
        monkeypatch.setattr(op, "use_triton", lambda x: True)  # CPU tensors through the interpreted kernel
    one, many = ModelRunner(model, prefill_chunk=16), ModelRunner(model, prefill_chunk=16)  # ragged last chunk
    for r, slots in ((one, 3), (many, 4)):
        set_paths(r, "prefill", gdn_prefill_kernel=triton_gdn)
        r.allocate(slots, 48)
    return one, many


@pytest.mark.parametrize("shape,triton_gdn,lengths", [("tiny-dense", False, (37, 37, 37)),
                                                      ("tiny-dense", False, (37, 5, 16)),
                                                      ("tiny-hybrid", False, (37, 37, 37)),
                                                      ("tiny-hybrid", True, (37, 37, 37))],
                         ids=["dense", "dense-ragged", "hybrid", "hybrid-triton-gdn"])
def test_prefill_many_equals_one_prefill_per_slot(shape, triton_gdn, lengths, monkeypatch):
    one, many = _runners(shape, triton_gdn, monkeypatch)
    prompts = [torch.randint(0, 500, (n,)).tolist() for n in lengths]
    want = [one.prefill_features(i, p, LAYERS) for i, p in enumerate(prompts)]
    logits, features = many.prefill_many(prompts, LAYERS)
    torch.testing.assert_close(logits, torch.stack([w[0] for w in want]), rtol=1e-4, atol=1e-4)
    for (_, wf), gf in zip(want, features):
        torch.testing.assert_close(gf, wf, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(many.prefill_many(prompts), logits)  # without features: the same logits
    if shape == "tiny-hybrid":
        for w, g in zip(_state(one, 3), _state(many, 3)):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    # the next two decode steps continue from the same state (padding rows are overwritten before they are read)
    token = logits.argmax(-1)
    pos_one, pos_many = torch.tensor(lengths), torch.tensor(lengths)
    for _ in range(2):
        want_step = one.decode(token, pos_one)
        torch.testing.assert_close(many.decode(token, pos_many), want_step, rtol=1e-4, atol=1e-4)
        token = want_step.argmax(-1)


def test_prefill_many_refuses_ragged_prompts_on_a_hybrid_model(monkeypatch):
    _, many = _runners("tiny-hybrid", False, monkeypatch)
    with pytest.raises(ValueError, match="one length"):
        many.prefill_many([[1, 2, 3], [4, 5]])
