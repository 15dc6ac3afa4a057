"""DFlash2 in the engine: speculative greedy output equals plain greedy output for chains and trees, on a dense
and on a hybrid target, and the registry builds it from its architecture name."""

import pytest
import torch

from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.models.loader import load_model
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.drafters.registry import build_drafter
from specpilot.spec_decode.tree import TreeSpec
from tests.models.test_dflash2 import H, dflash2_tensors, write_dflash2


def _prompts():
    gen = torch.Generator().manual_seed(9)
    return [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (5, 16, 9)]


def _check(target, drafter, tree):
    params = SamplingParams(max_new_tokens=20)
    ref = [r.token_ids for r in Generator(ModelRunner(target)).generate(_prompts(), params)]
    out = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(tree)).generate(_prompts(), params)
    assert [r.token_ids for r, _ in out] == ref


@pytest.mark.parametrize("tree", ["chain:5", "dynamic:3,4,8"])
def test_dense_target(tree, checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("qwen3")
    target = load_model(str(path), "cpu", "float32")
    drafter = build_drafter(str(write_dflash2(tmp_path / "d")), target)
    assert drafter.name == "dflash2"
    _check(target, drafter, tree)


@pytest.mark.parametrize("tree", ["chain:4", "dynamic:2,3,5"])
def test_hybrid_target(tree, checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("qwen3_5", hidden_size=H)
    target = load_model(str(path), "cpu", "float32")
    drafter = build_drafter(str(write_dflash2(tmp_path / "d", dflash2_tensors(seed=8), num_target_layers=4,
                                              dflash_config={"mask_token_id": 300, "target_layer_ids": [1, 3]})),
                            target)
    _check(target, drafter, tree)
