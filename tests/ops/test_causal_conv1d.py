"""Causal conv1d (+ SiLU): prefill vs F.conv1d, pooled-state update (reference and Triton under the interpreter)
vs prefill over the concatenated sequence, and short-input state handling."""

import os
import sys

# Must precede the first triton import: triton's own library functions are decorated (interpreted or not) then.
_TRITON_IMPORTED_COMPILED = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
import torch.nn.functional as F

from specpilot.ops.causal_conv1d import (causal_conv1d_prefill, causal_conv1d_prefill_ref, causal_conv1d_update,
                                         causal_conv1d_update_ref)
from specpilot.ops.testing import assert_close, nan_like


def _triton_update():
    pytest.importorskip("triton")
    if _TRITON_IMPORTED_COMPILED:
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set (e.g. by a conftest importing "
                    "transformers models); export TRITON_INTERPRET=1 or set it before any import")
    from specpilot.ops.causal_conv1d.triton import causal_conv1d_update as update

    return update


def _prefill_impl(name):
    """The prefill under test: the dispatcher (the reference on CPU) or the Triton kernel (interpreted), with small
    tiles so that the cases span several token and channel blocks."""
    if name == "dispatch":
        return causal_conv1d_prefill
    _triton_update()  # the same interpreter checks
    from specpilot.ops.causal_conv1d.triton import causal_conv1d_prefill as prefill

    return lambda x, w, s=None: prefill(x, w, s, block_t=4, block_c=16)


def _conv1d_silu(x: torch.Tensor, weight: torch.Tensor, initial_state: torch.Tensor) -> torch.Tensor:
    """Independent formulation: F.conv1d over [initial_state | x] with no padding, in fp64."""
    seq = torch.cat([initial_state.double(), x.double().transpose(1, 2)], dim=-1)
    y = F.conv1d(seq, weight.double()[:, None, :], groups=x.shape[-1])
    return F.silu(y).transpose(1, 2)


def _pool_problem(B, C, W, N, dtype=torch.float32):
    """Weight and a pool whose unused slots are NaN, so reading or writing them shows."""
    weight = torch.randn(C, W).to(dtype)
    state_idx = torch.randperm(N)[:B]
    pool = nan_like(torch.empty(N, C, W - 1, dtype=dtype))
    pool[state_idx] = torch.randn(B, C, W - 1).to(dtype)
    return weight, pool, state_idx


def _unused(pool, state_idx):
    keep = torch.ones(pool.shape[0], dtype=torch.bool)
    keep[state_idx] = False
    return pool[keep]


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16) if x.element_size() == 2 else x.view(torch.int32)


# ---------------------------------------------------------------- prefill

PREFILL_CASES = [
    # B, T, C, W
    pytest.param(2, 9, 37, 4, id="T9-C37-W4"),
    pytest.param(1, 1, 16, 4, id="T1-W4"),
    pytest.param(3, 2, 20, 4, id="T2-shorter-than-state"),
    pytest.param(2, 13, 11, 2, id="W2"),
    pytest.param(2, 6, 11, 5, id="W5"),
    pytest.param(2, 19, 37, 8, id="T19-C37-W8"),
]


@pytest.mark.parametrize("impl", ["dispatch", "triton"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("B,T,C,W", PREFILL_CASES)
def test_prefill_matches_conv1d(B, T, C, W, with_state, impl):
    x = torch.randn(B, T, C)
    weight = torch.randn(C, W)
    s0 = torch.randn(B, C, W - 1) if with_state else torch.zeros(B, C, W - 1)
    y, state = _prefill_impl(impl)(x, weight, s0 if with_state else None)
    assert y.dtype == x.dtype and state.shape == (B, C, W - 1)
    assert_close("y", _conv1d_silu(x, weight, s0), y)
    assert torch.equal(state, torch.cat([s0, x.transpose(1, 2)], dim=-1)[..., -(W - 1) :])


@pytest.mark.parametrize("impl", ["dispatch", "triton"])
@pytest.mark.parametrize("T", [1, 2], ids=lambda t: f"T{t}")
def test_prefill_short_input_keeps_old_state_tail(T, impl):
    """T < W-1: the new state is the newest W-1-T old columns followed by the T inputs."""
    B, C, W = 2, 7, 4
    x = torch.randn(B, T, C)
    s0 = torch.randn(B, C, W - 1)
    _, state = _prefill_impl(impl)(x, torch.randn(C, W), s0)
    assert torch.equal(state[..., : W - 1 - T], s0[..., T:])
    assert torch.equal(state[..., W - 1 - T :], x.transpose(1, 2))


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
def test_triton_prefill_matches_the_reference_in_bf16_on_a_strided_input(with_state):
    """bf16 x as a channel slice of the packed projections (the layer's case), a state in the pool's dtype."""
    B, T, C, W = 2, 11, 24, 4
    x = torch.randn(B, T, C + 8).bfloat16()[..., 4:4 + C]
    weight = torch.randn(C, W).bfloat16()
    s0 = torch.randn(B, C, W - 1).bfloat16() if with_state else None
    y_ref, state_ref = causal_conv1d_prefill_ref(x, weight, s0)
    y, state = _prefill_impl("triton")(x, weight, s0)
    assert y.dtype == state.dtype == torch.bfloat16
    assert_close("y", y_ref, y, ratio=1e-2)
    assert torch.equal(_bits(state), _bits(state_ref))


def test_prefill_bf16():
    B, T, C, W = 2, 10, 24, 4
    x = torch.randn(B, T, C).bfloat16()
    weight = torch.randn(C, W).bfloat16()
    s0 = torch.randn(B, C, W - 1).bfloat16()
    y, state = causal_conv1d_prefill(x, weight, s0)
    assert y.dtype == state.dtype == torch.bfloat16
    assert_close("y", _conv1d_silu(x, weight, s0), y, ratio=1e-2)


# ---------------------------------------------------------------- pooled-state update vs prefill


def _impl(name):
    return {"ref": causal_conv1d_update_ref, "dispatch": causal_conv1d_update}.get(name) or _triton_update()


UPDATE_CASES = [
    # B, T_prefill, T_update, C, W, N
    pytest.param(1, 5, 1, 37, 4, 1, id="decode-single-slot"),
    pytest.param(3, 6, 1, 37, 4, 8, id="decode-B3-pool8"),
    pytest.param(2, 4, 2, 40, 4, 5, id="T2-shorter-than-state"),
    pytest.param(2, 1, 5, 300, 4, 3, id="T5-C300-two-blocks"),
    pytest.param(2, 3, 3, 13, 3, 4, id="W3"),
    pytest.param(2, 2, 4, 13, 2, 4, id="W2"),
]


@pytest.mark.parametrize("impl", ["ref", "dispatch", "triton"])
@pytest.mark.parametrize("B,T0,T1,C,W,N", UPDATE_CASES)
def test_update_matches_prefill_on_concatenation(B, T0, T1, C, W, N, impl):
    update = _impl(impl)
    x = torch.randn(B, T0 + T1, C)
    weight, pool, state_idx = _pool_problem(B, C, W, N)
    before = pool.clone()
    s0 = pool[state_idx]
    y_all, s_all = causal_conv1d_prefill(x, weight, s0)
    _, s_mid = causal_conv1d_prefill(x[:, :T0], weight, s0)
    pool[state_idx] = s_mid
    y = update(x[:, T0:], pool, state_idx, weight)
    assert_close("y", y_all[:, T0:], y)
    assert torch.equal(pool[state_idx], s_all)
    assert torch.equal(_bits(_unused(pool, state_idx)), _bits(_unused(before, state_idx)))


TRITON_CASES = [
    # B, T, C, W, N, dtype
    pytest.param(1, 1, 37, 4, 1, torch.float32, id="decode-fp32"),
    pytest.param(3, 1, 100, 4, 6, torch.bfloat16, id="decode-bf16-pool6"),
    pytest.param(2, 3, 70, 4, 3, torch.bfloat16, id="T3-bf16"),
    pytest.param(2, 7, 33, 8, 4, torch.float32, id="T7-W8"),
]


@pytest.mark.parametrize("B,T,C,W,N,dtype", TRITON_CASES)
def test_triton_update_matches_ref(B, T, C, W, N, dtype):
    update = _triton_update()
    x = torch.randn(B, T, C).to(dtype)
    weight, pool, state_idx = _pool_problem(B, C, W, N, dtype)
    before = pool.clone()
    pool_ref = pool.clone()
    y_ref = causal_conv1d_update_ref(x, pool_ref, state_idx, weight)
    y = update(x, pool, state_idx, weight, block_c=32)  # block_c < C: several masked channel blocks
    assert y.dtype == dtype
    assert_close("y", y_ref, y, ratio=1e-5 if dtype == torch.float32 else 1e-2)
    assert torch.equal(_bits(pool[state_idx]), _bits(pool_ref[state_idx]))
    assert torch.equal(_bits(_unused(pool, state_idx)), _bits(_unused(before, state_idx)))


def test_triton_update_strided_input_int32_idx():
    """x as a channel slice of a wider tensor, weight as a squeezed [C,1,W] conv parameter, int32 slots."""
    update = _triton_update()
    B, T, C, W, N = 2, 2, 24, 4, 5
    x = torch.randn(B, T, C + 8)[..., 4 : 4 + C]
    weight = torch.randn(C, 1, W).squeeze(1)
    pool = torch.randn(N, C, W - 1)
    pool_ref = pool.clone()
    state_idx = torch.tensor([3, 0], dtype=torch.int32)
    y_ref = causal_conv1d_update_ref(x, pool_ref, state_idx, weight)
    y = update(x, pool, state_idx, weight)
    assert_close("y", y_ref, y)
    assert torch.equal(pool, pool_ref)
