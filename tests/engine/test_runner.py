"""ModelRunner.prefill_many: prompts of one length prefilled together give the logits, KV and recurrent state of
one prefill per slot (dense and hybrid, over several prefill chunks, and with the Triton GDN prefill)."""

import pytest
import torch

import specpilot.ops.gated_delta_rule as op
from specpilot.bench.shapes import hf_config, random_model
from specpilot.engine.runner import ModelRunner


def _state(runner, n):
    """The recurrent state of the first n slots (dim 1: slots); the KV is checked by the decode step after."""
    return [runner.cache.conv[:, :n], runner.cache.ssm[:, :n]]


@pytest.mark.parametrize("shape,triton_gdn", [("tiny-dense", False), ("tiny-hybrid", False), ("tiny-hybrid", True)])
def test_prefill_many_equals_one_prefill_per_slot(shape, triton_gdn, monkeypatch):
    model = random_model(hf_config(shape, num_hidden_layers=2), device="cpu", dtype=torch.float32, seed=5)
    if triton_gdn:
        monkeypatch.setattr(op, "use_triton", lambda x: True)  # CPU tensors through the interpreted kernel
    prompts = [torch.randint(0, 500, (37,)).tolist() for _ in range(3)]
    one = ModelRunner(model, prefill_chunk=16)  # three chunks, the last ragged
    one.gdn_prefill = triton_gdn
    one.allocate(3, 48)
    want = torch.stack([one.prefill(i, p) for i, p in enumerate(prompts)])
    many = ModelRunner(model, prefill_chunk=16)
    many.gdn_prefill = triton_gdn
    many.allocate(4, 48)
    got = many.prefill_many(prompts)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for w, g in zip(_state(one, 3), _state(many, 3)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    # the next decode step continues from the same state
    token = want.argmax(-1)
    pos = torch.full((3,), 37, dtype=torch.long)
    torch.testing.assert_close(many.decode(token, pos.clone()), one.decode(token, pos.clone()), rtol=1e-4, atol=1e-4)
    with pytest.raises(AssertionError, match="one length"):
        many.prefill_many([prompts[0], prompts[1][:5]])
