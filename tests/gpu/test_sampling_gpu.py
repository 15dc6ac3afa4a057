"""Speculative sampling on the GPU: on the gate's margin targets (tests/gpu/gate_setup.py) in bf16, sampled
speculative output at temperature 0.7 equals plain sampling (Generator, same seed) token for token, for a drafter
that drafts for real (the draft LM) and one inside the synthetic oracle (random DFlash), chains and trees, batch 1
and 3; and the sampled verify replays a CUDA graph of its logits (the runner captured one), so the fast path is the
one checked.
"""

from __future__ import annotations

import pytest

from specpilot.bench.probing import ProbingEngine
from specpilot.bench.synthetic import SyntheticDrafter
from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.tree import TreeSpec
from tests.gpu import gate_setup as G

pytestmark = pytest.mark.gpu
PARAMS = SamplingParams(max_new_tokens=G.NEW_TOKENS, ignore_eos=True, temperature=0.7, seed=11)


@pytest.fixture(scope="module")
def targets():
    made = {}

    def get(kind: str):
        if kind not in made:
            target = G.build_target(kind)
            made[kind] = (target, {b: G.prompts(target, b) for b in (1, 3)}, {})
        return made[kind]

    yield get
    made.clear()


@pytest.mark.parametrize("tree", ["chain:5", "dynamic:4,5,16"])
@pytest.mark.parametrize("drafter", ["draft-lm", "random-dflash"])
@pytest.mark.parametrize("kind", list(G.SWEEP))
def test_sampled_speculation_equals_plain_sampling(kind, drafter, tree, targets, tmp_path):
    target, prompts, ar = targets(kind)
    d, oracle = G.make_drafter(drafter, target, kind, tmp_path)
    for batch, group in prompts.items():
        if batch not in ar:
            ar[batch] = [r.token_ids for r in Generator(ModelRunner(target)).generate(group, PARAMS)]
        runner = ModelRunner(target)
        inner = SyntheticDrafter(d, dict(enumerate(ar[batch])), G.ORACLE, target.config.vocab_size, batch) \
            if oracle else d
        engine = (ProbingEngine if oracle else SpecEngine)(runner, inner, TreeSpec.parse(tree))
        out = [r.token_ids for r, _ in engine.generate(group, PARAMS)]
        assert out == ar[batch], f"batch {batch}"
        if runner.runtime.verify_graphs:
            assert any(key[-1] is True for key in runner.verify_graphs), "no sampled verify graph was replayed"


@pytest.mark.parametrize("head_format", ["bf16", "fp8"])
def test_sampled_mtp_chain_replays_its_coupled_graph(head_format, targets):
    """The target's MTP layer (random weights, inside the oracle; its LM head in bf16 or an FP8 copy) drafts coupled
    at T 0.7: sampled chains equal plain sampling at batch 1 and 3, and the chain steps replayed coupled CUDA graphs
    (their keys carry the rows' sampling settings)."""
    from specpilot.bench.shapes import random_mtp

    target, prompts, ar = targets("hybrid")
    for batch, group in prompts.items():
        if batch not in ar:
            ar[batch] = [r.token_ids for r in Generator(ModelRunner(target)).generate(group, PARAMS)]
        runner = ModelRunner(target)
        mtp = random_mtp(target, runtime=runner.runtime, head_format=head_format)
        inner = SyntheticDrafter(mtp, dict(enumerate(ar[batch])), G.ORACLE, target.config.vocab_size, batch)
        out = [r.token_ids for r, _ in ProbingEngine(runner, inner, TreeSpec.parse("chain:3")).generate(group, PARAMS)]
        assert out == ar[batch], f"batch {batch}"
        if runner.runtime.cuda_graphs:
            assert any(len(key) > 3 for key in mtp.graphs), f"no coupled chain graph at batch {batch}"
