"""The DFlash proposal on the GPU, in bf16 with its CUDA graphs and the runtime's draft paths: the drafter as it
is proposes the same tokens as main's proposal tail (fp32 logits before the chain's argmax, one copy per request
of its new context rows: bench/dflash_scaling.py's MainDrafter), at the Qwen3.5-27B widths (a 4-layer target,
a 2-layer drafter), batches of 1, 3 and 8 with ragged contexts, chains and trees, over steps of ragged commits.
SPECPILOT_GPU_DRY_RUN=1 runs it on the CPU at the tiny-hybrid shape (eager, fp32).
"""

from __future__ import annotations

import pytest
import torch

from bench.dflash_scaling import MainDrafter
from specpilot.bench.shapes import hf_config, random_dflash, random_model
from specpilot.config import EngineConfig
from specpilot.runtime.settings import Runtime
from specpilot.spec_decode.tree import TreeSpec

pytestmark = pytest.mark.gpu
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SHAPE = "Qwen3.5-27B" if CUDA else "tiny-hybrid"
CONTEXTS = [1500, 9, 700, 3, 2048, 41, 260, 1024] if CUDA else [30, 9, 17, 3, 50, 11, 26, 5]


@pytest.fixture(scope="module")
def pair():
    """(main, new) drafters over one random drafter model and a random target, each with its own cache."""
    dtype = torch.bfloat16 if CUDA else torch.float32
    target = random_model(hf_config(SHAPE, num_hidden_layers=4), DEVICE, dtype)
    runtime = Runtime.build(EngineConfig(), DEVICE)
    new = random_dflash(target, SHAPE, layers=2, runtime=runtime)
    main = MainDrafter(new.model, target, new.target_layers, new.block_size, new.mask_token_id, runtime=runtime)
    for d in (main, new):
        d.allocate(8, max(CONTEXTS) + 64)
    return main, new


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("tree", ["chain:7", "chain:3", "dynamic:4,7,28"])
@torch.inference_mode()
def test_the_proposal_equals_mains(pair, n, tree):
    main, new = pair
    assert new.use_graphs == CUDA and (new.paths.block_kernel or not CUDA)
    spec, vocab = TreeSpec.parse(tree), new.target.config.vocab_size
    width, dtype = new.model.fc.weight.shape[1], new.model.fc.weight.dtype
    gen = torch.Generator(device=DEVICE).manual_seed(n)
    slots = [5, 0, 7, 2, 1, 6, 3, 4][:n]
    for slot, length in zip(slots, CONTEXTS):
        features = torch.randn(length, width, generator=gen, device=DEVICE).to(dtype)
        for d in (main, new):
            d.start(slot, [0] * length, features)
    for step in range(4):
        roots = torch.randint(0, vocab, (n,), generator=gen, device=DEVICE).tolist()
        assert new.propose(slots, roots, spec) == main.propose(slots, roots, spec), f"step {step}"
        for slot in slots:
            k = int(torch.randint(1, new.block_size + 1, (1,), generator=gen, device=DEVICE))
            rows = torch.randn(k, width, generator=gen, device=DEVICE).to(dtype)
            for d in (main, new):
                d.commit(slot, [1] * (k - 1), rows)
    if CUDA:
        assert (n, spec.capped(new.max_depth).depth, 0 if spec.kind == "chain" else 4) in new.graphs
