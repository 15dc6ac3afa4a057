"""A single request's causal prefill block through one fused SDPA call (attention.causal_block_attention) gives what
the masked reference (attention.block_attention) gives, and attend takes it only where KernelPaths.causal_sdpa says
and the block is one request's causal block."""

import pytest
import torch
from torch.nn.attention import SDPBackend

import specpilot.layers.attention as attention
from specpilot.config import EngineConfig
from specpilot.layers.metadata import BatchMetadata
from specpilot.layers.paths import KernelPaths
from specpilot.ops.store_kv import store_kv
from specpilot.runtime.settings import Runtime

MATH = [SDPBackend.MATH]  # the CPU has neither FlashAttention nor the memory-efficient kernel


def block(B, T, H, KVH, D, prefix, slots, paths=KernelPaths(), seed=0, num_slots=3, room=64, equal_prefix=False):
    """(q, k, v, kv cache, metadata) of a causal block of T tokens after `prefix` committed ones per slot; every cache
    row holds random values, so a read past a request's rows shows in the output."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, n, D, generator=g) for n in (H, KVH, KVH))
    kv = tuple(torch.randn(num_slots, KVH, room, D, generator=g) for _ in range(2))
    ids = torch.zeros(B, T, dtype=torch.long)
    meta = BatchMetadata.contiguous(ids, torch.tensor(prefix), torch.tensor(slots), max(prefix), paths, equal_prefix)
    return q, k, v, kv, meta


@pytest.mark.parametrize("D", [16, 32])
@pytest.mark.parametrize("H,KVH", [(3, 3), (4, 2), (8, 2)])
@pytest.mark.parametrize("T", [1, 3, 17])
@pytest.mark.parametrize("P", [0, 5, 37])
def test_causal_block_matches_the_masked_reference(P, T, H, KVH, D):
    q, k, v, kv, meta = block(1, T, H, KVH, D, [P], [2], seed=P * 1000 + T * 10 + H)
    scale = D**-0.5
    store_kv(k, v, kv[0], kv[1], meta.slots, meta.cache_loc)
    want = attention.block_attention(q, k, v, kv, meta, scale)
    got = attention.causal_block_attention(q, kv, meta, scale, backends=MATH)
    assert got.shape == (1, T, H, D)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_whole_block_sees_the_prefix():
    """Bottom-right alignment: block token t sees cache rows up to P + t (top-left would hide most of the prefix)."""
    P, T, H, KVH, D = 37, 3, 4, 2, 16
    q, k, v, kv, meta = block(1, T, H, KVH, D, [P], [0])
    store_kv(k, v, kv[0], kv[1], meta.slots, meta.cache_loc)
    got = attention.causal_block_attention(q, kv, meta, D**-0.5, backends=MATH)
    # the first block token alone: attention over rows [0, P] of the slot
    keys, values = (c[0, :, :P + 1].repeat_interleave(H // KVH, dim=0) for c in kv)  # [H, P+1, D]
    weights = torch.softmax((q[0, 0, :, None] @ keys.transpose(1, 2)) * D**-0.5, dim=-1)  # [H, 1, P+1]
    torch.testing.assert_close(got[0, 0], (weights @ values)[:, 0], atol=1e-5, rtol=1e-5)


class Spy:
    def __init__(self):
        self.calls = 0

    def __call__(self, q, kv, meta, scale):
        self.calls += 1
        return attention.block_attention(q, *stored(meta, kv), kv, meta, scale)


def stored(meta, kv):
    """The block's K/V as attend stored them, [B, T, KVH, D] each."""
    return (c[meta.slots[:, None], :, meta.cache_loc] for c in kv)


@pytest.mark.parametrize("paths,B,tree,equal,taken", [
    (KernelPaths(causal_sdpa=True), 1, False, False, True),
    (KernelPaths(causal_sdpa=True, block_kernel=True), 1, False, False, True),
    (KernelPaths(), 1, False, False, False),
    (KernelPaths(block_kernel=True), 1, False, False, False),
    (KernelPaths(causal_sdpa=True), 1, True, False, False),  # a tree block
    (KernelPaths(causal_sdpa=True), 2, False, False, False),  # two requests: their prefixes are not known on the host
    (KernelPaths(causal_sdpa=True), 2, False, True, True),  # ... unless the caller says they are equal
])
def test_attend_takes_the_causal_path_only_for_one_causal_block(monkeypatch, paths, B, tree, equal, taken):
    spy = Spy()
    monkeypatch.setattr(attention, "causal_block_attention", spy)
    monkeypatch.setattr(attention, "fused_sdpa_fits", lambda q, kv: True)
    T, H, KVH, D = 4, 4, 2, 16
    prefix = [5, 5] if equal else [5, 3]
    q, k, v, kv, meta = block(B, T, H, KVH, D, prefix[:B], [1, 0][:B], paths, equal_prefix=equal)
    if tree:
        mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
        meta = BatchMetadata(meta.input_ids, meta.positions, meta.cache_loc, meta.slots, meta.prefix_len,
                             meta.max_prefix_len, mask[None].expand(B, T, T), parents=torch.tensor([[-1, 0, 0, 2]]),
                             paths=paths)
    out = attention.attend(q, k, v, kv, meta, D**-0.5)
    assert spy.calls == int(taken) and out.shape == (B, T, H, D)


@pytest.mark.parametrize("P", [0, 7])
def test_equal_prefixes_of_several_requests_match_the_masked_reference(P):
    """prefill_many's chunks: three requests, every prefix P (equal_prefix), one fused call over all of them."""
    q, k, v, kv, meta = block(3, 5, 4, 2, 16, [P] * 3, [2, 0, 1], equal_prefix=True)
    store_kv(k, v, kv[0], kv[1], meta.slots, meta.cache_loc)
    want = attention.block_attention(q, k, v, kv, meta, 0.25)
    torch.testing.assert_close(attention.causal_block_attention(q, kv, meta, 0.25, backends=MATH), want,
                               rtol=1e-5, atol=1e-5)


def test_attend_falls_back_where_the_fused_kernels_cannot_take_the_block(monkeypatch):
    spy = Spy()
    monkeypatch.setattr(attention, "causal_block_attention", spy)
    q, k, v, kv, meta = block(1, 4, 4, 2, 16, [5], [1], KernelPaths(causal_sdpa=True))
    assert not attention.fused_sdpa_fits(q, kv), "no FlashAttention or memory-efficient SDPA on CPU tensors"
    want = attention.block_attention(q, k, v, kv, meta, 0.25)
    torch.testing.assert_close(attention.attend(q, k, v, kv, meta, 0.25), want)
    assert spy.calls == 0
    q3 = torch.randn(1, 4, 3, 16)
    assert not attention.fused_sdpa_fits(q3, kv), "3 query heads over 2 K/V heads"


def test_the_prefill_paths_take_it_on_a_gpu_only():
    cpu, gpu = Runtime.build(EngineConfig(), "cpu"), Runtime.build(EngineConfig(), "cuda")
    assert not cpu.prefill.causal_sdpa and gpu.prefill.causal_sdpa
    assert not (gpu.decode.causal_sdpa or gpu.verify.causal_sdpa or gpu.draft.causal_sdpa)
