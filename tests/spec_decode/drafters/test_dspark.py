"""DSpark in the engine: speculative greedy output equals plain greedy output for chains and trees, on a dense and
on a hybrid target; the registry builds it from its architecture name; the engine's adaptive budget cuts its chains
by its confidence head."""

import pytest
import torch

from specpilot.engine.cost_curve import VerifyCostCurve
from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.tree import TreeSpec
from tests.models.test_dspark import H, dspark_tensors, write_dspark
from tests.spec_decode.drafters.test_mtp import SMALL, _prompts, check_greedy, check_sampled


@pytest.mark.parametrize("tree", ["chain:5", "dynamic:3,4,8"])
def test_dense_target(tree, with_target, tmp_path):
    target, drafter = with_target(write_dspark(tmp_path / "d"))
    assert drafter.name == "dspark"
    check_greedy(target, drafter, tree)


@pytest.mark.parametrize("tree", ["chain:4", "static:2,2"])
def test_hybrid_target(tree, with_target, tmp_path):
    d = write_dspark(tmp_path / "d", dspark_tensors(seed=8), num_target_layers=4, mask_token_id=300,
                     target_layer_ids=[1, 3])
    check_greedy(*with_target(d, "qwen3_5", hidden_size=H), tree)


def test_replayed_proposal_graphs_keep_output_exact(with_target, tmp_path, check_replayed):
    """The Markov walk inside the captured chain proposal."""
    check_replayed(*with_target(write_dspark(tmp_path / "d")), "chain:5")


def test_sampled_output_is_plain_sampling(with_target, tmp_path):
    check_sampled(*with_target(write_dspark(tmp_path / "d")), "static:2,1")


def _rated_run(with_target, tmp_path, bias: float):
    """Greedy output and per-step node budgets of a chain:5 engine whose DSpark confidence head rates every draft
    sigmoid(bias) (zero weights), priced by a verify curve of 1 s + 0.02 s per token (calibration off, so the
    curve and no measured CPU time decides)."""
    t = dspark_tensors()
    t["confidence_head.proj.weight"] = torch.zeros_like(t["confidence_head.proj.weight"])
    t["confidence_head.proj.bias"] = torch.full_like(t["confidence_head.proj.bias"], bias)
    target, drafter = with_target(write_dspark(tmp_path / f"d{bias}", t))
    assert drafter.rates_nodes
    curve = VerifyCostCurve((1,), (0,), ((1, 512),), (((1.0, 1.0 + 0.02 * 511),),))
    engine = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse("chain:5"), scheduler=SMALL, cost=curve)
    engine._calibrate = lambda charged: None
    params = SamplingParams(max_new_tokens=16)
    out = engine.generate(_prompts(), params)
    plain = [r.token_ids for r in Generator(ModelRunner(target)).generate(_prompts(), params)]
    assert [r.token_ids for r, _ in out] == plain
    return [s["nodes"] for s in engine.step_log if s["batch"]], [s.tau for _, s in out]


def test_the_budget_cuts_each_chain_by_the_confidence_head(with_target, tmp_path):
    """Rated near 1 every step verifies the whole block, though the random drafter's drafts are mostly rejected
    (its recent acceptance would cut them); rated near 0 no draft pays for its verify time (plain decoding); rated
    1/2 (survival 1/2, 1/4, ...) the chains stop part way. Output is the target's in all three."""
    sure, taus = _rated_run(with_target, tmp_path, 8.0)
    assert all(n == [5] * len(n) for n in sure) and min(taus) < 2.5
    never, _ = _rated_run(with_target, tmp_path, -8.0)
    assert all(not any(n) for n in never)
    half, _ = _rated_run(with_target, tmp_path, 0.0)
    assert all(1 <= max(n) <= 4 for n in half)
