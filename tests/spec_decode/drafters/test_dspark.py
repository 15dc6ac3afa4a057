"""DSpark in the engine: speculative greedy output equals plain greedy output for chains and trees, on a dense and
on a hybrid target; the registry builds it from its architecture name."""

import pytest

from tests.models.test_dspark import H, dspark_tensors, write_dspark
from tests.spec_decode.drafters.test_mtp import check_greedy, check_sampled


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
