"""The DFlash drafter's batched proposal: one forward over every request's block equals each request drafted on
its own (and the independent reference forward), through the SDPA path, the tree-attention kernel (interpreted)
and a replayed proposal graph."""

import dataclasses

import pytest
import torch

import specpilot.ops.tree_attention as tree_attention_op
from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.layers import attention
from specpilot.spec_decode import coupling
from specpilot.spec_decode.drafters import dflash
from specpilot.spec_decode.drafters.dflash import load_dflash
from specpilot.spec_decode.tree import TreeSpec
from tests.cuda_graph_fakes import fake_cuda_graphs
from tests.spec_decode.test_dflash import TARGET_LAYERS, _prompts, dflash_tensors, reference_block_logits, target, write_dflash

__all__ = ["target"]  # the fixture, shared with test_dflash

SPECS = ["chain:5", "chain:3", "static:2,2,1", "dynamic:3,4,8"]
SLOTS, ROOTS = [2, 0, 1], [42, 7, 199]  # not in slot order, so the batch's rows index slots for real


def _drafter(target, tmp_path, tensors):
    """A drafter holding three requests of different context lengths (11, 16, 9 + a 3-token commit)."""
    drafter = load_dflash(write_dflash(tmp_path / "d", tensors), target)
    runner = ModelRunner(target)
    runner.allocate(3, 40)
    drafter.allocate(3, 40)
    contexts = {}
    gen = torch.Generator().manual_seed(11)
    for slot, n in zip(SLOTS, (11, 16, 9)):
        prompt = torch.randint(0, 300, (n,), generator=gen).tolist()
        _, contexts[slot] = runner.prefill_features(slot, prompt, tuple(TARGET_LAYERS))
        drafter.start(slot, prompt, contexts[slot])
    extra = torch.randn(3, contexts[1].shape[1], generator=gen)
    drafter.commit(1, [5, 6], extra)  # pending with the prompts: one flush writes both
    contexts[1] = torch.cat([contexts[1], extra])
    return drafter, contexts


def test_batched_logits_match_the_reference_per_request(target, tmp_path):
    tensors = dflash_tensors(torch.Generator().manual_seed(4))
    drafter, contexts = _drafter(target, tmp_path, tensors)
    ours = drafter.block_logits(SLOTS, ROOTS)
    assert drafter.cache.max_seq_len == 40 + drafter.block_size  # scratch room for a block past any context
    for row, (slot, root) in enumerate(zip(SLOTS, ROOTS)):
        ref = reference_block_logits(tensors, target, contexts[slot], root, 317)
        torch.testing.assert_close(ours[row], ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(drafter.block_logits([slot], [root])[0], ours[row], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tree", SPECS)
def test_batched_proposal_equals_per_request(tree, target, tmp_path):
    drafter, _ = _drafter(target, tmp_path, dflash_tensors(torch.Generator().manual_seed(4)))
    spec = TreeSpec.parse(tree)
    batched = drafter.propose(SLOTS, ROOTS, spec)
    alone = [drafter.propose([slot], [root], spec)[0] for slot, root in zip(SLOTS, ROOTS)]
    assert batched == alone
    assert [t.tokens[0] for t in batched] == ROOTS and len({t.tokens for t in batched}) == 3


@pytest.mark.parametrize("tree", ["chain:5", "dynamic:3,4,8"])
def test_tree_attention_kernel_gives_the_same_trees(tree, target, tmp_path, monkeypatch):
    drafter, _ = _drafter(target, tmp_path, dflash_tensors(torch.Generator().manual_seed(4)))
    spec = TreeSpec.parse(tree)
    sdpa = drafter.propose(SLOTS, ROOTS, spec)
    calls = []
    op = attention.tree_attention
    monkeypatch.setattr(attention, "tree_attention", lambda *a, **k: calls.append(1) or op(*a, **k))
    monkeypatch.setattr(tree_attention_op, "use_triton", lambda x: True)  # CPU tensors through the interpreted kernel
    drafter.paths = dataclasses.replace(drafter.paths, block_kernel=True)
    assert drafter.propose(SLOTS, ROOTS, spec) == sdpa
    assert len(calls) == len(drafter.model.layers), "one tree-attention call per layer for the whole batch"


@pytest.mark.parametrize("tree", ["chain:5", "dynamic:3,4,8"])
def test_context_extension_inside_the_proposal_equals_an_eager_one(tree, target, tmp_path):
    """Accepted tokens' features (at most a block per request) extend the context inside the proposal forward,
    all B rows written and the ones past the new rows overwritten by the block: the same trees as an eager
    extension first. A request with two pending extensions, or one longer than a block, takes the eager path."""
    spec = TreeSpec.parse(tree)
    tensors = dflash_tensors(torch.Generator().manual_seed(4))
    gen = torch.Generator().manual_seed(5)
    trees = []
    for eager in (False, True):
        drafter, contexts = _drafter(target, tmp_path / str(eager), tensors)
        drafter.propose(SLOTS, ROOTS, spec)  # flushes the prompts (longer than a block): eager
        gen.manual_seed(5)
        for slot, n in zip(SLOTS, (3, 1, 6)):
            drafter.commit(slot, [9] * (n - 1), torch.randn(n, contexts[slot].shape[1], generator=gen))
        if eager:
            drafter._flush()
        assert bool(drafter._pending) != eager
        trees.append(drafter.propose(SLOTS, ROOTS, spec))
        assert not drafter._pending
    assert trees[0] == trees[1]


class ReplayedProposalGraph(dflash.ProposalGraph):
    """Replay re-runs the forward on the static input and writes the captured output in place, as a real replay
    does: what is checked is that the one input copy refreshes everything the step reads."""

    def __init__(self, run, inputs, features, warmup: int = 2, noise=None):
        super().__init__(run, inputs, features, warmup, noise=noise)
        self.graph.graphs[-1].rerun = lambda: self.output.copy_(run(self.inputs, self.features))


@pytest.fixture
def replayed_graphs(monkeypatch):
    fake_cuda_graphs(monkeypatch)
    monkeypatch.setattr(dflash, "ProposalGraph", ReplayedProposalGraph)


@pytest.mark.parametrize("tree", ["chain:5", "dynamic:3,4,8"])
def test_replayed_proposal_graphs_keep_output_exact(tree, target, tmp_path, replayed_graphs):
    drafter = load_dflash(write_dflash(tmp_path / "d"), target)
    drafter.use_graphs = True
    params = SamplingParams(max_new_tokens=16)
    ref = [r.token_ids for r in Generator(ModelRunner(target)).generate(_prompts(), params)]
    out = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(tree)).generate(_prompts(), params)
    assert [r.token_ids for r, _ in out] == ref
    assert drafter.graphs and all(isinstance(g, ReplayedProposalGraph) for g in drafter.graphs.values())


@pytest.mark.parametrize("tree", ["chain:4", "dynamic:3,4,8"])
def test_coupled_proposals_replayed_from_graphs_equal_eager_ones(tree, target, tmp_path, replayed_graphs):
    """Sampling rows' race noise reaches a replayed proposal graph through its static rows, refilled every step:
    step after step (fresh noise, commits between), a batch of a greedy row and two sampling rows with different
    filters proposes what the eager coupled proposal does; the graphs are keyed by the rows' filter settings."""
    spec = TreeSpec.parse(tree)
    tensors = dflash_tensors(torch.Generator().manual_seed(4))
    eager, _ = _drafter(target, tmp_path / "eager", tensors)
    graphed, contexts = _drafter(target, tmp_path / "graphed", tensors)
    graphed.use_graphs = True
    params = [SamplingParams(temperature=0.7, seed=1), None, SamplingParams(temperature=1.0, top_k=20, top_p=0.9)]
    gen = torch.Generator().manual_seed(8)
    for step in range(3):
        noise = [None if p is None else (p, torch.empty(8, 320).exponential_(generator=gen)) for p in params]
        trees = [d.propose(SLOTS, ROOTS, spec, noise=noise) for d in (eager, graphed)]
        assert trees[0] == trees[1], f"step {step}"
        rows = torch.randn(2, contexts[1].shape[1], generator=gen)
        for d in (eager, graphed):
            for slot in SLOTS:
                d.commit(slot, [9], rows)
    keys = [k for k in graphed.graphs if len(k) > 3]
    assert keys and keys[0][3:] == ((0.7, 0, 1.0), None, (1.0, 20, 0.9))
    assert not eager.graphs


def test_coupled_graphs_are_capped_and_greedy_ones_are_not(target, tmp_path, replayed_graphs, monkeypatch):
    """Past coupling.MAX_GRAPH_NOISE_BYTES of static noise rows a coupled proposal of a new sampling setting runs eagerly
    (same proposals), while greedy proposals keep capturing graphs."""
    monkeypatch.setattr(coupling, "MAX_GRAPH_NOISE_BYTES", 4 * 3 * 3 * 320)  # one batch-3 chain:3 graph's rows
    spec = TreeSpec.parse("chain:3")
    graphed, _ = _drafter(target, tmp_path / "g", dflash_tensors(torch.Generator().manual_seed(4)))
    eager, _ = _drafter(target, tmp_path / "e", dflash_tensors(torch.Generator().manual_seed(4)))
    graphed.use_graphs = True
    gen = torch.Generator().manual_seed(3)
    for t in (0.5, 0.9):  # two settings: the second is past the cap
        noise = [(SamplingParams(temperature=t), torch.empty(8, 320).exponential_(generator=gen))] * 3
        assert graphed.propose(SLOTS, ROOTS, spec, noise=noise) == eager.propose(SLOTS, ROOTS, spec, noise=noise)
    assert sum(len(k) > 3 for k in graphed.graphs) == 1
    graphed.propose(SLOTS, ROOTS, spec)
    graphed.propose(SLOTS[:2], ROOTS[:2], spec)
    assert sum(len(k) == 3 for k in graphed.graphs) == 2
