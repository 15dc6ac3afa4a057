"""The Triton prefill of Gated DeltaNet layers (KernelPaths.gdn_prefill_kernel) in a whole hybrid model: prefill
and extension with it on (the interpreted kernel on CPU tensors) give the logits and recurrent state of the torch
chunk form."""

import torch

import specpilot.ops.gated_delta_rule as op
import specpilot.ops.gated_delta_rule.triton as op_triton
from specpilot.bench.shapes import hf_config, random_model
from specpilot.runtime.runner import ModelRunner
from tests.runtimes import cpu_runtime, set_paths


def prefill_and_extend(runner, prompts, extra):
    """Each prompt prefilled into its own slot, then `extra` more tokens run after it as one causal block ->
    (last-token logits [B, 2, vocab], conv state, delta-rule state)."""
    runner.allocate(len(prompts), max(map(len, prompts)) + len(extra))
    logits = []
    for i, p in enumerate(prompts):
        logits.append(torch.stack([runner.prefill(i, p), runner.extend(i, extra, len(p))]))
    return torch.stack(logits), runner.cache.conv.clone(), runner.cache.ssm.clone()


def test_triton_gdn_prefill_equals_torch_chunk_form(monkeypatch):
    model = random_model(hf_config("tiny-hybrid", num_hidden_layers=2), device="cpu", dtype=torch.float32, seed=3)
    assert not cpu_runtime(triton_gdn_prefill=True).prefill.gdn_prefill_kernel, "GPU only"
    runner = ModelRunner(model)
    prompts = [torch.randint(0, 500, (n,)).tolist() for n in (70, 23)]  # two 64-token chunks; one ragged chunk
    extra = torch.randint(0, 500, (20,)).tolist()  # continues from the prefilled state
    want = prefill_and_extend(runner, prompts, extra)

    calls = []
    kernel = op_triton.chunk_gated_delta_rule
    monkeypatch.setattr(op_triton, "chunk_gated_delta_rule", lambda *a: calls.append(1) or kernel(*a))
    monkeypatch.setattr(op, "use_triton", lambda x: True)  # CPU tensors through the interpreted kernel
    set_paths(runner, "prefill", gdn_prefill_kernel=True)
    got = prefill_and_extend(runner, prompts, extra)
    assert len(calls) == 2 * len(prompts) * model.config.num_linear_layers
    for name, w, g in zip(("logits", "conv", "ssm"), want, got):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=name)
