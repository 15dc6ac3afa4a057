"""DSpark in the engine: speculative greedy output equals plain greedy output for chains and trees, on a dense and
on a hybrid target; the registry builds it from its architecture name; after a step every request's proposal has
its per-node confidence."""

import pytest

from specpilot.models.loader import load_model
from specpilot.spec_decode.drafters.registry import build_drafter
from tests.spec_decode.drafters.test_mtp import check_greedy, check_sampled
from specpilot.spec_decode.drafters import dflash
from tests.cuda_graph_fakes import fake_cuda_graphs
from tests.spec_decode.test_dflash_batched import ReplayedProposalGraph
from tests.models.test_dspark import H, dspark_tensors, write_dspark


@pytest.fixture
def replayed_graphs(monkeypatch):
    fake_cuda_graphs(monkeypatch)
    monkeypatch.setattr(dflash, "ProposalGraph", ReplayedProposalGraph)


@pytest.mark.parametrize("tree", ["chain:5", "dynamic:3,4,8"])
def test_dense_target(tree, checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("qwen3")
    target = load_model(str(path), "cpu", "float32")
    drafter = build_drafter(str(write_dspark(tmp_path / "d")), target)
    assert drafter.name == "dspark"
    check_greedy(target, drafter, tree)


@pytest.mark.parametrize("tree", ["chain:4", "static:2,2"])
def test_hybrid_target(tree, checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("qwen3_5", hidden_size=H)
    target = load_model(str(path), "cpu", "float32")
    drafter = build_drafter(str(write_dspark(tmp_path / "d", dspark_tensors(seed=8), num_target_layers=4,
                                             mask_token_id=300, target_layer_ids=[1, 3])), target)
    check_greedy(target, drafter, tree)


def test_replayed_proposal_graphs_keep_output_exact(checkpoint_factory, tmp_path, replayed_graphs):
    """The Markov walk inside the captured chain proposal (CUDA graphs faked on the CPU, replay re-runs)."""
    path, _ = checkpoint_factory("qwen3")
    target = load_model(str(path), "cpu", "float32")
    drafter = build_drafter(str(write_dspark(tmp_path / "d")), target)
    drafter.use_graphs = True
    check_greedy(target, drafter, "chain:5")
    assert drafter.graphs and all(isinstance(g, ReplayedProposalGraph) for g in drafter.graphs.values())


def test_sampled_output_is_plain_sampling(checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("qwen3")
    target = load_model(str(path), "cpu", "float32")
    check_sampled(target, build_drafter(str(write_dspark(tmp_path / "d")), target), "static:2,1")
