"""Gated delta rule: chunk form vs the recurrent reference, the reference vs transformers, and the Triton kernels
(fused decode, chunked prefill) vs their references under the Triton interpreter."""

import os
import sys

# Must precede the first triton import: triton's own library functions are decorated (interpreted or not) then.
_TRITON_IMPORTED_COMPILED = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

from specpilot.ops.gated_delta_rule import (
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_ref,
    gdn_gating,
    recurrent_gated_delta_rule,
)
from specpilot.ops.testing import assert_close, nan_like


def _triton_fused():
    pytest.importorskip("triton")
    if _TRITON_IMPORTED_COMPILED:
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set (e.g. by a conftest importing "
                    "transformers models); export TRITON_INTERPRET=1 or set it before any import")
    from specpilot.ops.gated_delta_rule.triton import fused_recurrent_gated_delta_rule as fused

    return fused


def _triton_chunk():
    _triton_fused()
    from specpilot.ops.gated_delta_rule.triton import chunk_gated_delta_rule as kernel

    return kernel


def _qkv(B, T, H, HV, K, V, dtype=torch.float32):
    q = torch.randn(B, T, H, K).to(dtype)
    k = torch.randn(B, T, H, K).to(dtype)
    v = torch.randn(B, T, HV, V).to(dtype)
    return q, k, v


def _raw_gates(B, T, HV, dtype=torch.float32):
    """a, b, A_log, dt_bias as the layer's projections and parameters would give them."""
    a = torch.randn(B, T, HV).to(dtype)
    b = torch.randn(B, T, HV).to(dtype)
    A_log = torch.empty(HV).uniform_(0.01, 4.0).log()
    dt_bias = torch.randn(HV)
    return a, b, A_log, dt_bias


def _gates(B, T, HV):
    return gdn_gating(*_raw_gates(B, T, HV))


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32)


# ---------------------------------------------------------------- gating


def test_gating_matches_formula():
    a, b, A_log, dt_bias = _raw_gates(3, 5, 6, dtype=torch.bfloat16)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    assert g.dtype == beta.dtype == torch.float32 and g.shape == (3, 5, 6)
    x = a.double() + dt_bias.double()
    softplus = torch.where(x > 20, x, torch.log1p(x.exp()))
    assert_close("g", -A_log.double().exp() * softplus, g)
    assert_close("beta", 1 / (1 + (-b.double()).exp()), beta)
    assert (g < 0).all()


# ---------------------------------------------------------------- chunk form vs recurrent reference

CHUNK_CASES = [
    # B, T, H, HV, K, V, chunk_size
    pytest.param(2, 1, 2, 2, 16, 24, 64, id="T1-gva1"),
    pytest.param(2, 7, 2, 4, 16, 24, 64, id="T7-gva2"),
    pytest.param(1, 63, 1, 3, 32, 40, 64, id="T63-gva3"),
    pytest.param(2, 100, 2, 6, 16, 24, 64, id="T100-gva3"),
    pytest.param(1, 130, 2, 2, 32, 40, 64, id="T130-gva1"),
    pytest.param(2, 37, 1, 2, 16, 24, 16, id="T37-chunk16-gva2"),
]


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("B,T,H,HV,K,V,chunk_size", CHUNK_CASES)
def test_chunk_matches_recurrent(B, T, H, HV, K, V, chunk_size, with_state):
    q, k, v = _qkv(B, T, H, HV, K, V)
    g, beta = _gates(B, T, HV)
    s0 = torch.randn(B, HV, K, V) if with_state else None
    s0_copy = None if s0 is None else s0.clone()
    o_ref, s_ref = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=chunk_size)
    assert o.dtype == v.dtype and s.dtype == torch.float32
    assert_close("o", o_ref, o, ratio=1e-5)
    assert_close("state", s_ref, s, ratio=1e-5)
    if s0 is not None:
        assert torch.equal(s0, s0_copy), "initial_state must not be modified"


def test_chunk_bf16_inputs_and_custom_scale():
    B, T, H, HV, K, V = 2, 45, 2, 4, 16, 24
    q, k, v = _qkv(B, T, H, HV, K, V, dtype=torch.bfloat16)
    g, beta = _gates(B, T, HV)
    s0 = torch.randn(B, HV, K, V)
    o_ref, s_ref = recurrent_gated_delta_rule(q, k, v, g, beta, s0, scale=0.3)
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, s0, scale=0.3, chunk_size=16)
    assert o.dtype == torch.bfloat16
    assert_close("o", o_ref, o, ratio=1e-2)
    assert_close("state", s_ref, s, ratio=1e-5)


@pytest.mark.parametrize("split", [1, 20, 64], ids=lambda s: f"split{s}")
def test_chunk_split_in_two_calls(split):
    B, T, H, HV, K, V = 2, 90, 1, 3, 16, 24
    q, k, v = _qkv(B, T, H, HV, K, V)
    g, beta = _gates(B, T, HV)
    s0 = torch.randn(B, HV, K, V)
    o_all, s_all = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    first = [x[:, :split] for x in (q, k, v, g, beta)]
    rest = [x[:, split:] for x in (q, k, v, g, beta)]
    o1, s1 = chunk_gated_delta_rule(*first, s0)
    o2, s2 = chunk_gated_delta_rule(*rest, s1)
    assert_close("o", o_all, torch.cat([o1, o2], dim=1))
    assert_close("state", s_all, s2)


# ---------------------------------------------------------------- anchor: transformers' torch fallbacks

HF_CASES = [
    pytest.param(2, 1, 2, 2, 16, 24, id="T1-gva1"),
    pytest.param(2, 9, 2, 6, 16, 24, id="T9-gva3"),
    pytest.param(1, 70, 1, 2, 32, 40, id="T70-gva2"),
]


@pytest.mark.parametrize("B,T,H,HV,K,V", HF_CASES)
def test_reference_matches_transformers(B, T, H, HV, K, V):
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    q, k, v = _qkv(B, T, H, HV, K, V)
    g, beta = _gates(B, T, HV)
    s0 = torch.randn(B, HV, K, V)
    o_hf, s_hf = hf.torch_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    o, s = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    assert_close("o vs hf recurrent", o_hf, o)
    assert_close("state vs hf recurrent", s_hf, s)
    o_hf, s_hf = hf.torch_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    assert_close("o vs hf chunk", o_hf, o)
    assert_close("state vs hf chunk", s_hf, s)


# ---------------------------------------------------------------- pooled-state op: reference and Triton kernel


def _pool_problem(B, T, H, HV, K, V, N, dtype=torch.float32):
    """Inputs plus a pool whose unused slots are NaN, so reading or writing them shows."""
    q, k, v = _qkv(B, T, H, HV, K, V, dtype)
    a, b, A_log, dt_bias = _raw_gates(B, T, HV, dtype)
    state_idx = torch.randperm(N)[:B]
    pool = nan_like(torch.empty(N, HV, K, V))
    pool[state_idx] = torch.randn(B, HV, K, V)
    return (q, k, v, a, b, A_log, dt_bias), pool, state_idx


def _unused(pool, state_idx):
    keep = torch.ones(pool.shape[0], dtype=torch.bool)
    keep[state_idx] = False
    return pool[keep]


def test_fused_ref_matches_recurrent_and_updates_pool():
    B, T, H, HV, K, V, N = 3, 5, 2, 4, 16, 24, 7
    args, pool, state_idx = _pool_problem(B, T, H, HV, K, V, N)
    before = pool.clone()
    g, beta = gdn_gating(*args[3:])
    o_want, s_want = recurrent_gated_delta_rule(*args[:3], g, beta, before[state_idx])
    o = fused_recurrent_gated_delta_rule_ref(*args, pool, state_idx)
    assert torch.equal(o, o_want)
    assert torch.equal(pool[state_idx], s_want)
    assert torch.equal(_bits(_unused(pool, state_idx)), _bits(_unused(before, state_idx)))


def test_dispatch_on_cpu_is_reference():
    args, pool, state_idx = _pool_problem(2, 3, 1, 2, 16, 24, 4)
    pool_ref = pool.clone()
    o = fused_recurrent_gated_delta_rule(*args, pool, state_idx)
    o_ref = fused_recurrent_gated_delta_rule_ref(*args, pool_ref, state_idx)
    assert torch.equal(o, o_ref)
    assert torch.equal(_bits(pool), _bits(pool_ref))


TRITON_CASES = [
    # B, T, H, HV, K, V, N
    pytest.param(1, 1, 1, 1, 16, 24, 1, id="decode-B1-single-slot"),
    pytest.param(3, 1, 2, 4, 16, 24, 8, id="decode-B3-gva2-pool8"),
    pytest.param(2, 3, 1, 3, 32, 40, 5, id="T3-gva3-V40"),
    pytest.param(2, 7, 2, 2, 16, 40, 4, id="T7-gva1-V40"),
]


@pytest.mark.parametrize("B,T,H,HV,K,V,N", TRITON_CASES)
def test_triton_fused_matches_ref(B, T, H, HV, K, V, N):
    fused = _triton_fused()
    args, pool, state_idx = _pool_problem(B, T, H, HV, K, V, N)
    before = pool.clone()
    pool_ref = pool.clone()
    o_ref = fused_recurrent_gated_delta_rule_ref(*args, pool_ref, state_idx)
    o = fused(*args, pool, state_idx, block_v=16)  # block_v < V: several masked V tiles
    assert o.dtype == args[2].dtype
    assert_close("o", o_ref, o)
    assert_close("updated slots", pool_ref[state_idx], pool[state_idx])
    assert torch.equal(_bits(_unused(pool, state_idx)), _bits(_unused(before, state_idx)))


def test_triton_fused_bf16_strided_views_int32_idx():
    """q, k, v as head views into one projection output (as the layer splits them), bf16, int32 slots."""
    fused = _triton_fused()
    B, T, H, HV, K, V, N = 2, 3, 2, 4, 16, 24, 6
    mixed = torch.randn(B, T, 2 * H * K + HV * V).bfloat16()
    q, k, v = torch.split(mixed, [H * K, H * K, HV * V], dim=-1)
    q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, HV, V)
    assert not q.is_contiguous()
    ab = torch.randn(B, T, 2 * HV).bfloat16()
    a, b = ab[..., :HV], ab[..., HV:]
    _, _, A_log, dt_bias = _raw_gates(B, T, HV)
    state_idx = torch.tensor([4, 1], dtype=torch.int32)
    pool = torch.randn(N, HV, K, V)
    pool_ref = pool.clone()
    args = (q, k, v, a, b, A_log, dt_bias)
    o_ref = fused_recurrent_gated_delta_rule_ref(*args, pool_ref, state_idx)
    o = fused(*args, pool, state_idx)
    assert o.dtype == torch.bfloat16
    assert_close("o", o_ref, o, ratio=1e-2)
    assert_close("pool", pool_ref, pool)
    assert torch.equal(_bits(_unused(pool, state_idx.long())), _bits(_unused(pool_ref, state_idx.long())))


def test_triton_fused_softplus_saturation():
    """a + dt_bias far above 20 (softplus == x) and far below 0 (decay ~ 1)."""
    fused = _triton_fused()
    B, T, H, HV, K, V, N = 2, 3, 1, 2, 16, 24, 2
    args, pool, state_idx = _pool_problem(B, T, H, HV, K, V, N)
    a = torch.randn(B, T, HV) * 40.0
    args = args[:3] + (a,) + args[4:]
    pool_ref = pool.clone()
    o_ref = fused_recurrent_gated_delta_rule_ref(*args, pool_ref, state_idx)
    o = fused(*args, pool, state_idx)
    assert_close("o", o_ref, o)
    assert_close("pool", pool_ref, pool)


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_fused_split_in_two_calls(impl):
    fn = fused_recurrent_gated_delta_rule_ref if impl == "ref" else _triton_fused()
    B, T, H, HV, K, V, N, split = 2, 5, 1, 2, 16, 24, 3, 2
    args, pool, state_idx = _pool_problem(B, T, H, HV, K, V, N)
    pool_split = pool.clone()
    o_all = fn(*args, pool, state_idx)
    per_token, shared = args[:5], args[5:]
    o1 = fn(*[x[:, :split] for x in per_token], *shared, pool_split, state_idx)
    o2 = fn(*[x[:, split:] for x in per_token], *shared, pool_split, state_idx)
    assert_close("o", o_all, torch.cat([o1, o2], dim=1))
    assert_close("state", pool[state_idx], pool_split[state_idx])


# ---------------------------------------------------------------- chunked prefill: Triton kernel vs the torch form

TRITON_CHUNK_CASES = [
    # B, T, H, HV, K, V, block_v
    pytest.param(1, 1, 1, 1, 16, 16, 16, id="T1"),
    pytest.param(3, 17, 2, 4, 16, 24, 16, id="T17-B3-gva2-V24"),
    pytest.param(1, 63, 2, 2, 32, 16, 32, id="T63-K32"),
    pytest.param(2, 64, 1, 2, 16, 32, 16, id="T64-gva2-2tiles"),
    pytest.param(1, 65, 1, 3, 16, 16, 16, id="T65-gva3"),
    pytest.param(3, 130, 1, 2, 16, 16, 16, id="T130-B3-gva2"),
    pytest.param(1, 200, 2, 2, 32, 32, 32, id="T200-K32"),
]


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("B,T,H,HV,K,V,block_v", TRITON_CHUNK_CASES)
def test_triton_chunk_matches_torch_chunk(B, T, H, HV, K, V, block_v, with_state, monkeypatch):
    kernel = _triton_chunk()
    q, k, v = _qkv(B, T, H, HV, K, V)
    g, beta = _gates(B, T, HV)
    s0 = torch.randn(B, HV, K, V) if with_state else None  # per request: a different state
    s0_copy = None if s0 is None else s0.clone()
    o_ref, s_ref = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    empty = torch.empty
    # the kernel's outputs and workspace start as NaN: an element it forgets to write (or reads unwritten) shows
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    o, s = kernel(q, k, v, g, beta, s0, block_v=block_v)
    monkeypatch.undo()
    assert o.dtype == v.dtype and s.dtype == torch.float32 and s.shape == (B, HV, K, V)
    assert_close("o", o_ref, o, ratio=1e-4)
    assert_close("state", s_ref, s, ratio=1e-4)
    if T <= 64:
        o_rec, s_rec = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
        assert_close("o vs recurrent", o_rec, o, ratio=1e-4)
        assert_close("state vs recurrent", s_rec, s, ratio=1e-4)
    if s0 is not None:
        assert torch.equal(s0, s0_copy), "initial_state must not be modified"


@pytest.mark.parametrize("layout", ["tokens-major", "channels-major"])
def test_triton_chunk_bf16_strided_views_and_scale(layout):
    """q, k, v as head views into one conv output (as the layer splits them; the torch prefill conv leaves its
    channels strided), bf16, a custom scale, 16-token chunks."""
    kernel = _triton_chunk()
    B, T, H, HV, K, V = 2, 40, 1, 2, 16, 16
    C = 2 * H * K + HV * V
    mixed = torch.randn(B, T, C).bfloat16() if layout == "tokens-major" else torch.randn(B, C, T).bfloat16().mT
    q, k, v = torch.split(mixed, [H * K, H * K, HV * V], dim=-1)
    q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, HV, V)
    g, beta = _gates(B, T, HV)
    s0 = torch.randn(B, HV, K, V)
    o_ref, s_ref = chunk_gated_delta_rule(q, k, v, g, beta, s0, scale=0.3)
    o, s = kernel(q, k, v, g, beta, s0, scale=0.3, chunk_size=16)
    assert o.dtype == torch.bfloat16
    assert_close("o", o_ref, o, ratio=1e-2)
    assert_close("state", s_ref, s, ratio=1e-4)


def test_chunk_dispatch_takes_the_kernel_only_when_asked(monkeypatch):
    import specpilot.ops.gated_delta_rule as op
    import specpilot.ops.gated_delta_rule.triton as op_triton

    calls = []
    monkeypatch.setattr(op_triton, "chunk_gated_delta_rule",
                        lambda *a: calls.append(1) or op._chunk.chunk_gated_delta_rule(*a))
    q, k, v = _qkv(1, 20, 1, 1, 16, 16)
    g, beta = _gates(1, 20, 1)
    chunk_gated_delta_rule(q, k, v, g, beta, kernel=True)  # CPU tensors: the torch form
    monkeypatch.setattr(op, "use_triton", lambda x: True)
    chunk_gated_delta_rule(q, k, v, g, beta)
    assert not calls
    chunk_gated_delta_rule(q, k, v, g, beta, kernel=True)
    assert calls == [1]
