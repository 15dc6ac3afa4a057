"""fla-core's Gated DeltaNet kernels on the GPU against our references: the chunked prefill (the path
prefill_kernel picks on CUDA where fla-core is installed) at odd lengths, GVA ratios 1/2/3, with and without an
initial state, output and final state; through the dispatcher as the layer calls it (strided head views, inference
mode); a whole hybrid model's prefill; and fla's fused recurrent decode behind our pooled-state contract (the
bench's comparison). Skipped where fla-core is not installed (`python3 -m pip install --no-index --no-deps
.whl/*.whl` on the device).

Tolerances: relative RMS error 2e-2 against our torch chunk form computed in fp32 on the same bf16 inputs. fla
works in the input dtype where ours works in fp32: it rounds the normalised q and k, the WY factors (w, u) and the
per-chunk states to bf16 before the output's own rounding (the state recursion across chunks runs in fp32, so the
errors do not compound with length). Its kernels, run on the CPU under the Triton interpreter (with its one
interpreter-incompatible line patched), gave 2e-6 in fp32 and 3e-4 to 8e-4 in fp16 (2.4 to 4 times the output's
rounding alone); bf16 has 3 fewer mantissa bits, so about 8 times that: 3e-3 to 7e-3. A wrong head mapping, gate
convention or state layout errs by O(1). The decode kernel computes in fp32 from bf16 inputs: 1e-2 (as the bf16
checks of our kernels, tests/gpu/kernel_checks.py).
"""

from __future__ import annotations

import pytest
import torch

from specpilot.ops.testing import assert_close

pytestmark = pytest.mark.gpu
TOL = 2e-2  # fla's chunked prefill in bf16 (see above)
DECODE_TOL = 1e-2


@pytest.fixture(scope="module")
def fla():
    """Our adapter to fla-core (specpilot.ops.gated_delta_rule.fla), skipped where fla-core is not installed."""
    pytest.importorskip("fla.ops.gated_delta_rule", reason="fla-core is not installed (the optional extra `fla`)")
    from specpilot.ops.gated_delta_rule import fla as adapter

    assert adapter.available()
    return adapter


def _inputs(B, T, H, HV, K=128, V=128, with_state=True, seed=0):
    from specpilot.ops.gated_delta_rule import gdn_gating

    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=gen)
    A_log = torch.empty(HV).uniform_(0.01, 16.0, generator=gen).log()  # random_model's decay rates
    g, beta = gdn_gating(torch.randn(B, T, HV, generator=gen), torch.randn(B, T, HV, generator=gen), A_log,
                         torch.ones(HV))
    s0 = torch.randn(B, HV, K, V, generator=gen) * 0.3 if with_state else None
    q, k, v = (t.bfloat16().cuda() for t in (q, k, v))
    return q, k, v, g.cuda(), beta.cuda(), None if s0 is None else s0.cuda()


def _reference(q, k, v, g, beta, s0, scale=None):
    """Our torch chunk form in fp32 on the same (bf16-rounded) inputs."""
    from specpilot.ops.gated_delta_rule.chunk import chunk_gated_delta_rule

    return chunk_gated_delta_rule(q.float(), k.float(), v.float(), g, beta, s0, scale)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("ratio", [1, 2, 3], ids=["gva1", "gva2", "gva3"])
@pytest.mark.parametrize("T", [1, 63, 65, 257, 1000])
def test_fla_chunk_matches_reference(fla, T, ratio, with_state):
    q, k, v, g, beta, s0 = _inputs(2, T, 2, 2 * ratio, with_state=with_state)
    s0_copy = None if s0 is None else s0.clone()
    o, s = fla.chunk_gated_delta_rule(q, k, v, g, beta, s0)
    o_ref, s_ref = _reference(q, k, v, g, beta, s0)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32 and s.shape == s_ref.shape
    assert_close(f"o T={T}", o_ref, o, TOL)
    assert_close(f"final state T={T}", s_ref, s, TOL)
    if s0 is not None:
        assert torch.equal(s0, s0_copy), "initial_state must not be modified"


@pytest.mark.parametrize("T", [65, 1000])
def test_fla_matches_our_triton_kernel(fla, T):
    """The measured alternative as a second reference: our one-launch kernel on the same inputs."""
    from specpilot.ops.gated_delta_rule.triton import chunk_gated_delta_rule as ours

    q, k, v, g, beta, s0 = _inputs(2, T, 2, 6)
    o, s = fla.chunk_gated_delta_rule(q, k, v, g, beta, s0)
    o_ours, s_ours = ours(q, k, v, g, beta, s0)
    assert_close("o vs our kernel", o_ours.float(), o, TOL)
    assert_close("state vs our kernel", s_ours, s, TOL)


def test_fla_at_the_27b_layer_shape(fla):
    """One GDN layer of Qwen3.5-27B (16 key heads, 48 value heads, dims 128), 2,048 tokens after a state."""
    q, k, v, g, beta, s0 = _inputs(1, 2048, 16, 48)
    o, s = fla.chunk_gated_delta_rule(q, k, v, g, beta, s0)
    o_ref, s_ref = _reference(q, k, v, g, beta, s0)
    assert_close("o", o_ref, o, TOL)
    assert_close("final state", s_ref, s, TOL)


def test_dispatch_takes_fla_as_the_layer_calls_it(fla):
    """kernel=True on CUDA with bf16 strided head views (the layer splits one conv output) under inference mode,
    past FLA_MIN_TOKENS: the fla path, with our contract; a custom scale; fp32 inputs, odd head dims and sequences
    up to FLA_MIN_TOKENS go to our kernel."""
    import specpilot.ops.gated_delta_rule as op

    B, T, H, HV, K, V = 2, op.FLA_MIN_TOKENS + 37, 2, 4, 128, 128  # True takes fla above FLA_MIN_TOKENS
    mixed = torch.randn(B, T, 2 * H * K + HV * V, device="cuda").bfloat16()
    q, k, v = mixed.split([H * K, H * K, HV * V], dim=-1)
    q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, HV, V)
    *_, g, beta, s0 = _inputs(B, T, H, HV)
    assert op.prefill_kernel(q, k, v, 64, True) == "fla"
    with torch.inference_mode():
        o, s = op.chunk_gated_delta_rule(q, k, v, g, beta, s0, scale=0.1, kernel=True)
    o_ref, s_ref = _reference(q, k, v, g, beta, s0, scale=0.1)
    assert_close("o", o_ref, o, TOL)
    assert_close("final state", s_ref, s, TOL)
    assert op.prefill_kernel(q.float(), k.float(), v.float(), 64, True) == "triton"
    q48, k48, v48, *_ = _inputs(1, 20, 1, 2, K=48, V=40)
    assert op.prefill_kernel(q48, k48, v48, 64, True) == "triton"
    assert op.prefill_kernel(q[:, :op.FLA_MIN_TOKENS], k[:, :op.FLA_MIN_TOKENS], v[:, :op.FLA_MIN_TOKENS], 64,
                             True) == "triton"


def test_hybrid_model_prefill_through_fla(fla):
    """A 4-layer model of the Qwen3.5-27B widths in bf16: prefill and an extension through fla (gdn_prefill_kernel
    "fla") against the torch chunk form and our kernel; logits and recurrent state."""
    import dataclasses

    from specpilot.bench.shapes import hf_config, random_model
    from specpilot.runtime.runner import ModelRunner

    model = random_model(hf_config("Qwen3.5-27B", num_hidden_layers=4, vocab_size=4096), "cuda", torch.bfloat16)
    runner = ModelRunner(model)
    prompt = torch.randint(0, 4096, (1000,)).tolist()
    extra = torch.randint(0, 4096, (70,)).tolist()
    runner.allocate(1, len(prompt) + len(extra))
    out = {}
    for form in ("torch", "triton", "fla"):
        prefill = dataclasses.replace(runner.runtime.prefill, gdn_prefill_kernel=form)
        runner.runtime = dataclasses.replace(runner.runtime, prefill=prefill)
        logits = torch.stack([runner.prefill(0, prompt), runner.extend(0, extra, len(prompt))])
        out[form] = logits, runner.cache.ssm.clone()
    # twice the kernel tolerance: the layers' bf16 outputs differ between the paths and feed the next layers
    for form in ("triton", "fla"):
        assert_close(f"logits {form}", out["torch"][0], out[form][0], 2 * TOL)
        assert_close(f"ssm state {form}", out["torch"][1], out[form][1], 2 * TOL)


@pytest.mark.parametrize("B,T,ratio", [(1, 1, 3), (3, 1, 2), (2, 4, 1)])
def test_fla_fused_recurrent_behind_our_pool_contract(fla, B, T, ratio):
    """fla's fused recurrent decode (gating and L2 norms in its kernel) through our adapter: output and the pool's
    slots as our reference leaves them, other slots untouched."""
    from specpilot.ops.gated_delta_rule import fused_recurrent_gated_delta_rule_ref

    H, K, V, N = 2, 128, 128, 5
    HV = H * ratio
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(B, T, H, K, generator=gen).bfloat16().cuda() for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=gen).bfloat16().cuda()
    a, b = (torch.randn(B, T, HV, generator=gen).bfloat16().cuda() for _ in range(2))
    A_log = torch.empty(HV).uniform_(0.01, 16.0, generator=gen).log().cuda()
    dt_bias = torch.ones(HV, device="cuda")
    pool = (torch.randn(N, HV, K, V, generator=gen) * 0.3).cuda()
    idx = torch.tensor([4, 1, 2][:B], device="cuda")
    ref_pool, out_pool = pool.clone(), pool.clone()
    o_ref = fused_recurrent_gated_delta_rule_ref(q, k, v, a, b, A_log, dt_bias, ref_pool, idx)
    o = fla.fused_recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, out_pool, idx)
    assert_close("o", o_ref.float(), o, DECODE_TOL)
    assert_close("pool", ref_pool, out_pool, DECODE_TOL)
    untouched = torch.ones(N, dtype=torch.bool)
    untouched[idx.cpu()] = False
    assert torch.equal(out_pool[untouched.cuda()], pool[untouched.cuda()])
