"""Fixtures of the drafter tests: a random target with the drafter that build_drafter reads from a directory, and
the check of a drafter's captured proposals (CUDA graphs faked on the CPU, replay re-runs)."""

import pytest

from specpilot.models.loader import load_model
from specpilot.spec_decode.drafters import dflash
from specpilot.spec_decode.drafters.registry import build_drafter
from tests.cuda_graph_fakes import fake_cuda_graphs
from tests.spec_decode.drafters.test_mtp import check_greedy
from tests.spec_decode.test_dflash_batched import ReplayedProposalGraph


@pytest.fixture
def with_target(checkpoint_factory):
    """with_target(drafter_dir, name="qwen3", **overrides) -> (target, drafter): the checkpoint factory's target
    `name` and the drafter build_drafter reads from drafter_dir for it."""
    def load(drafter_dir, name: str = "qwen3", **overrides):
        path, _ = checkpoint_factory(name, **overrides)
        target = load_model(str(path), "cpu", "float32")
        return target, build_drafter(str(drafter_dir), target)

    return load


@pytest.fixture
def check_replayed(monkeypatch):
    """check_replayed(target, drafter, tree): greedy output stays exact with the drafter's proposals captured and
    replayed as CUDA graphs (faked), and the proposals did go through the graphs."""
    fake_cuda_graphs(monkeypatch)
    monkeypatch.setattr(dflash, "ProposalGraph", ReplayedProposalGraph)

    def check(target, drafter, tree: str) -> None:
        drafter.use_graphs = True
        check_greedy(target, drafter, tree)
        assert drafter.graphs and all(isinstance(g, ReplayedProposalGraph) for g in drafter.graphs.values())

    return check
