"""The fused decode prologue (KernelPaths.fused_qk_rope_store) in whole models: greedy decode with it on equals
decode with it off, through the op's CPU dispatch (the reference) and through the Triton kernel (interpreted)."""

import pytest
import torch

import specpilot.ops.qk_norm_rope_store as op
from specpilot.layers import attention
from specpilot.models.loader import load_model
from specpilot.runtime.runner import ModelRunner
from tests.runtimes import cpu_runtime, set_paths


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


def fuse(runner, kernel: str, monkeypatch) -> list:
    """Turns the fused prologue on (through the reference, or the interpreted kernel on CPU tensors); returns
    the list that gets one entry per call of the fused op."""
    calls = []
    fused_op = attention.qk_norm_rope_store
    monkeypatch.setattr(attention, "qk_norm_rope_store", lambda *a, **k: calls.append(1) or fused_op(*a, **k))
    if kernel == "triton":
        monkeypatch.setattr(op, "use_triton", lambda x: True)
    set_paths(runner, "decode", "verify", fused_qk_rope_store=True)
    return calls


@pytest.mark.parametrize("kernel,dtype", [("reference", "float32"), ("triton", "bfloat16")])
@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_fused_decode_equals_unfused(name, kernel, dtype, checkpoint_factory, monkeypatch):
    """In bf16 too: the kernel repeats the unfused path's roundings (fp32 kernel runs: tests/ops)."""
    path, _ = checkpoint_factory(name)
    model = load_model(str(path), "cpu", dtype)
    runner = ModelRunner(model)
    assert not runner.runtime.decode.fused_qk_rope_store, "GPU only"
    prompts = [torch.randint(0, 300, (n,)).tolist() for n in (5, 17, 9)]  # ragged: each slot at its own position
    steps = 6
    unfused = greedy_decode(runner, prompts, steps)

    calls = fuse(runner, kernel, monkeypatch)
    fused = greedy_decode(runner, prompts, steps)
    assert len(calls) == steps * model.config.num_attention_layers, "only decode steps take the fused op"
    assert torch.equal(fused.argmax(-1), unfused.argmax(-1))
    torch.testing.assert_close(fused, unfused, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel,dtype", [("reference", "float32"), ("triton", "float32")])
@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_fused_prologue_in_verify_blocks(name, kernel, dtype, checkpoint_factory, monkeypatch):
    """A tree verify block on the tree-attention path through the fused prologue: the same greedy tokens and the
    same K/V in the cache as the unfused path (rope by depth, K/V at the nodes' storage positions)."""
    from specpilot.spec_decode.tree import DraftTree
    from specpilot.spec_decode.verify import tree_metadata

    path, _ = checkpoint_factory(name)
    model = load_model(str(path), "cpu", dtype)
    runner = ModelRunner(model, cpu_runtime(block_attention="tree"))
    prompts = [torch.randint(0, 300, (n,)).tolist() for n in (7, 12)]
    trees = [DraftTree((5, 9, 11, 13, 2), (-1, 0, 0, 1, 3)), DraftTree((4, 8, 6), (-1, 0, 1))]

    def verify():
        runner.allocate(2, 32)
        for i, p in enumerate(prompts):
            runner.prefill(i, p)
        meta = tree_metadata(trees, [len(p) for p in prompts], [0, 1], "cpu", chains_as_trees=True)
        tokens, _ = runner.verify(meta)
        return tokens, runner.cache.k.clone(), runner.cache.v.clone()

    want = verify()
    calls = fuse(runner, kernel, monkeypatch)
    got = verify()
    assert len(calls) == model.config.num_attention_layers, "one fused call per attention layer of the verify pass"
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-5)
