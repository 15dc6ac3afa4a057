"""DSpark in the engine: speculative greedy output equals plain greedy output for chains and trees, on a dense and
on a hybrid target; the registry builds it from its architecture name; after a step every request's proposal has
its per-node confidence."""

import pytest
import torch

from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.models.loader import load_model
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.drafters.registry import build_drafter
from specpilot.spec_decode.tree import TreeSpec
from tests.models.test_dspark import H, dspark_tensors, write_dspark


def _prompts():
    gen = torch.Generator().manual_seed(9)
    return [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (5, 16, 9)]


def _check(target, drafter, tree):
    params = SamplingParams(max_new_tokens=20)
    ref = [r.token_ids for r in Generator(ModelRunner(target)).generate(_prompts(), params)]
    engine = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(tree))
    out = engine.generate(_prompts(), params)
    assert [r.token_ids for r, _ in out] == ref
    assert all(len(c) >= 1 and 0 <= min(c) <= max(c) <= 1 for c in drafter.confidence.values())


@pytest.mark.parametrize("tree", ["chain:5", "dynamic:3,4,8"])
def test_dense_target(tree, checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("qwen3")
    target = load_model(str(path), "cpu", "float32")
    drafter = build_drafter(str(write_dspark(tmp_path / "d")), target)
    assert drafter.name == "dspark"
    _check(target, drafter, tree)


@pytest.mark.parametrize("tree", ["chain:4", "static:2,2"])
def test_hybrid_target(tree, checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("qwen3_5", hidden_size=H)
    target = load_model(str(path), "cpu", "float32")
    drafter = build_drafter(str(write_dspark(tmp_path / "d", dspark_tensors(seed=8), num_target_layers=4,
                                             mask_token_id=300, target_layer_ids=[1, 3])), target)
    _check(target, drafter, tree)
