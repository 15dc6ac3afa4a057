"""The gate at full depth, one case per target kind: Qwen3-8B (36 layers) and Qwen3.5-27B (64 layers) margin
targets in bf16, a random DFlash drafter of the shape's size inside the synthetic oracle, a dynamic tree, batch 3
with prompts up to 1,200 tokens: AR output is the margin chain and speculative output equals it exactly. Each
model is built and freed inside its test (the 27B alone holds about 54 GB)."""

from __future__ import annotations

import gc

import pytest
import torch

from specpilot.bench.shapes import random_dflash
from specpilot.runtime.sampling import SamplingParams
from tests.gpu import gate_setup as G
from tests.spec_decode.test_gate_faults import gate_failures, run_pair

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kind", list(G.SWEEP))
def test_full_depth_speculative_equals_ar(kind):
    target = G.build_target(kind, full=True)
    try:
        params = SamplingParams(max_new_tokens=G.NEW_TOKENS, ignore_eos=True)
        prompts = G.prompts(target, 3)
        ar, spec, engine = run_pair(target, lambda: random_dflash(target, G.SWEEP[kind][0]), "dynamic:4,5,16",
                                    prompts, params, oracle=G.ORACLE)
        memory = target.config.is_hybrid
        assert ar == [target.margin_codes.chain(p, G.NEW_TOKENS, memory) for p in prompts]
        assert gate_failures(ar, spec, engine, target, G.CONTEXT_TOL) == []
        del engine
    finally:
        del target
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
