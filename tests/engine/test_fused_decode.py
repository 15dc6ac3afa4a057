"""The fused decode prologue (EngineConfig.fused_qk_rope_store) in whole models: greedy decode with it on equals
decode with it off, through the op's CPU dispatch (the reference) and through the Triton kernel (interpreted)."""

import pytest
import torch

import specpilot.ops.qk_norm_rope_store as op
from specpilot.config import EngineConfig
from specpilot.engine.runner import ModelRunner
from specpilot.layers import attention
from specpilot.models.loader import load_model


def greedy_decode(runner, prompts, steps: int) -> torch.Tensor:
    """Each prompt prefilled into its own slot, then `steps` batched greedy decode steps -> logits [steps, B, V]."""
    runner.allocate(len(prompts), max(map(len, prompts)) + steps + 1)
    tokens = torch.stack([runner.prefill(i, p) for i, p in enumerate(prompts)]).argmax(-1)
    positions = torch.tensor([len(p) for p in prompts])
    rows = []
    for _ in range(steps):
        rows.append(runner.decode(tokens, positions))
        tokens = rows[-1].argmax(-1)
    return torch.stack(rows)


@pytest.mark.parametrize("kernel,dtype", [("reference", "float32"), ("triton", "bfloat16")])
@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_fused_decode_equals_unfused(name, kernel, dtype, checkpoint_factory, monkeypatch):
    """In bf16 too: the kernel repeats the unfused path's roundings (fp32 kernel runs: tests/ops)."""
    path, _ = checkpoint_factory(name)
    model = load_model(str(path), "cpu", dtype)
    runner = ModelRunner(model)
    assert not runner.fused_rope and not ModelRunner(model, EngineConfig(fused_qk_rope_store=False)).fused_rope
    prompts = [torch.randint(0, 300, (n,)).tolist() for n in (5, 17, 9)]  # ragged: each slot at its own position
    steps = 6
    unfused = greedy_decode(runner, prompts, steps)

    calls = []
    fused_op = attention.qk_norm_rope_store
    monkeypatch.setattr(attention, "qk_norm_rope_store", lambda *a: calls.append(1) or fused_op(*a))
    if kernel == "triton":
        monkeypatch.setattr(op, "use_triton", lambda x: True)  # CPU tensors through the interpreted kernel
    runner.fused_rope = True
    fused = greedy_decode(runner, prompts, steps)
    assert len(calls) == steps * model.config.num_attention_layers, "only decode steps take the fused op"
    assert torch.equal(fused.argmax(-1), unfused.argmax(-1))
    torch.testing.assert_close(fused, unfused, rtol=1e-5, atol=1e-5)
