"""The correctness gate on the GPU: on margin targets in the real shapes (Qwen3-8B dense at 4 layers, Qwen3.5-27B
hybrid at 8), in bf16, speculative output equals the same engine's AR output token for token (tolerance 0) for
every drafter x tree family x batch size 1 / 3 / 8 with ragged prompts up to 4,096 tokens, and drafters' contexts
equal a prefill rebuild; AR output itself is the margin circuit's chain; each injected fault of
tests/spec_decode/test_gate_faults.py makes the gate fail. Models are built once per module and target kind.
"""

from __future__ import annotations

import pytest
import torch

from specpilot.bench.probing import ProbingEngine
from specpilot.bench.synthetic import SyntheticDrafter
from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.tree import TreeSpec
from tests.gpu import gate_setup as G
from tests.spec_decode.test_gate_faults import FAULTS, NEEDS, exercised, gate_failures, run_pair

pytestmark = pytest.mark.gpu
PARAMS = SamplingParams(max_new_tokens=G.NEW_TOKENS, ignore_eos=True)


class Setup:
    """A target kind's model, its runners (AR, speculative), the AR outputs per batch size, built drafters."""

    def __init__(self, kind: str, tmp_path):
        self.kind, self.tmp_path = kind, tmp_path
        self.target = G.build_target(kind)
        self.ar_runner, self.spec_runner = ModelRunner(self.target), ModelRunner(self.target)
        self.prompts = {b: G.prompts(self.target, b) for b in G.BATCHES}
        self.ar = {b: [r.token_ids for r in Generator(self.ar_runner).generate(p, PARAMS)]
                   for b, p in self.prompts.items()}
        self.drafters = {}

    def drafter(self, name: str):
        if name not in self.drafters:
            self.drafters[name] = G.make_drafter(name, self.target, self.kind, self.tmp_path)
        return self.drafters[name]

    def speculative(self, name: str, tree: str, batch: int, seed: int = 0):
        drafter, oracle = self.drafter(name)
        ar = self.ar[batch]
        if oracle:
            drafter = SyntheticDrafter(drafter, dict(enumerate(ar)), G.ORACLE, self.target.config.vocab_size, seed)
        engine = (ProbingEngine if oracle else SpecEngine)(self.spec_runner, drafter, TreeSpec.parse(tree))
        out = engine.generate(self.prompts[batch], PARAMS)
        return [r.token_ids for r, _ in out], engine, [s for _, s in out]


@pytest.fixture(scope="module")
def setups(tmp_path_factory):
    made = {}

    def get(kind: str) -> Setup:
        if kind not in made:
            made[kind] = Setup(kind, tmp_path_factory.mktemp(kind))
        return made[kind]

    yield get
    made.clear()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@pytest.mark.parametrize("batch", G.BATCHES)
@pytest.mark.parametrize("kind", list(G.SWEEP))
def test_ar_output_is_the_margin_chain(kind, batch, setups):
    """The circuit survives the real kernels in bf16: greedy AR output is the codebook's chain, token for token."""
    s = setups(kind)
    memory = s.target.config.is_hybrid
    want = [s.target.margin_codes.chain(p, G.NEW_TOKENS, memory) for p in s.prompts[batch]]
    assert s.ar[batch] == want


@pytest.mark.parametrize("kind", list(G.SWEEP))
def test_margin_gap_clears_the_path_noise(kind, setups):
    """bench/margin_check.py's criterion on the sweep targets: the forced logits' top-2 gap exceeds 20 x the
    largest |AR decode - teacher-forced| logit difference at >= 99.9% of 8 x 64 generated positions."""
    from bench.margin_check import path_stats, prompts_for

    s = setups(kind)
    stats = path_stats(s.target, prompts_for(s.target.config.vocab_size, 8, 48), 64, 8)
    assert stats["passed"], {k: v for k, v in stats.items() if k != "gaps"}


@pytest.mark.parametrize("tree", G.TREES)
@pytest.mark.parametrize("drafter", G.DRAFTERS)
@pytest.mark.parametrize("kind", list(G.SWEEP))
def test_speculative_equals_ar_exactly(kind, drafter, tree, setups):
    s = setups(kind)
    accepted, fails = 0, []
    for batch in G.BATCHES:
        spec, engine, stats = s.speculative(drafter, tree, batch, seed=batch)
        accepted += sum(sum(st.accepted_per_depth) for st in stats)
        fails += [f"batch {batch}: {f}" for f in gate_failures(s.ar[batch], spec, engine, s.target, G.CONTEXT_TOL)]
    assert fails == []
    assert accepted > 0  # drafts were accepted: the commit of kept paths ran


@pytest.mark.parametrize("case", ["second_choice", "skip_kv_keep", "fold_short", "feature_row"])
def test_each_injected_fault_fails_the_gate(case, setups, monkeypatch):
    """Fresh runners (a captured verify graph keeps the code it traced), a random DFlash drafter inside the
    synthetic oracle, a dynamic tree, batch 3; the faulted path must run, the clean run pass, the faulted one
    fail."""
    s = setups("hybrid" if case == "fold_short" else "dense")
    drafter, _ = s.drafter("random-dflash")
    prompts = s.prompts[3]
    with exercised({}) as counts:
        ar, spec, engine = run_pair(s.target, lambda: drafter, "dynamic:4,5,16", prompts, PARAMS, oracle=G.ORACLE)
    assert gate_failures(ar, spec, engine, s.target, G.CONTEXT_TOL) == []
    assert counts.get(NEEDS[case], 0) > 0, counts
    FAULTS[case](monkeypatch)
    ar, spec, engine = run_pair(s.target, lambda: drafter, "dynamic:4,5,16", prompts, PARAMS, oracle=G.ORACLE)
    assert gate_failures(ar, spec, engine, s.target, G.CONTEXT_TOL), f"{case}: the gate passed a faulty run"
