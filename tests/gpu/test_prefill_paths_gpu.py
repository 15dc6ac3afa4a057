"""The prefill's fast paths on the GPU (FlashAttention for causal chunks, the conv and row kernels, fla-core's GDN
where installed) against plain torch: on the gate's margin targets in bf16, a prompt of three chunks (the later
ones after a committed prefix), and prefill_many's equal-prefix chunks, give the same greedy next token and logits
within bf16 rounding of the plain paths' (KernelPaths()), and the attention chunks took the fused SDPA path."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specpilot.layers import attention
from specpilot.layers.paths import KernelPaths
from specpilot.runtime.runner import ModelRunner
from tests.gpu import gate_setup as G

pytestmark = pytest.mark.gpu


def _check(target, prefill, chunk: int, slots: int, rows: int, monkeypatch) -> None:
    """prefill(runner) under the runtime's prefill paths and under plain torch: same argmax, logits within 3e-2 of
    their scale, and (on a GPU) the fused attention taken by the fast runner only."""
    fast, plain = ModelRunner(target, prefill_chunk=chunk), ModelRunner(target, prefill_chunk=chunk)
    plain.runtime = dataclasses.replace(plain.runtime, prefill=KernelPaths())
    calls = []
    inner = attention.causal_block_attention
    monkeypatch.setattr(attention, "causal_block_attention", lambda *a, **k: calls.append(1) or inner(*a, **k))
    for r in (fast, plain):
        r.allocate(slots, rows)
    got = prefill(fast).float()
    took = len(calls)
    want = prefill(plain).float()
    assert len(calls) == took, "the plain paths took the fused attention"
    if not G.DRY:
        assert took > 0, "no prefill chunk took the fused SDPA attention"
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err < 3e-2, err
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("kind", list(G.SWEEP))
def test_prefill_paths_match_plain_torch(kind, monkeypatch):
    target = G.build_target(kind)
    prompt = G.prompts(target, 3)[2][:1100]  # 1,100 tokens (200 on a dry run): three chunks of 512
    _check(target, lambda r: r.prefill(0, prompt), 512, 1, len(prompt) + 1, monkeypatch)


@pytest.mark.parametrize("kind", list(G.SWEEP))
def test_prefill_many_paths_match_plain_torch(kind, monkeypatch):
    """prefill_many's chunks (three requests, equal prefixes) take the fused attention too, with the same result."""
    target = G.build_target(kind)
    prompts = [p[:600] for p in (G.prompts(target, 3, seed=s)[2] for s in range(3))]
    _check(target, lambda r: r.prefill_many(prompts), 256, 3, 601, monkeypatch)
