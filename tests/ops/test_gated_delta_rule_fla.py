"""The prefill dispatch between the torch chunk form, our Triton kernel and fla-core's kernel (prefill_kernel), and
the adapter to fla's calling conventions (ops/gated_delta_rule/fla.py) against a stand-in that follows fla's
documented contract. The real fla kernels are checked on the GPU (tests/gpu/test_fla_gpu.py)."""

import os
import sys

# Must precede the first triton import (see test_gated_delta_rule.py): the dispatch imports our Triton module.
os.environ["TRITON_INTERPRET"] = "1"

import types  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import specpilot.ops.gated_delta_rule as op  # noqa: E402
from specpilot.ops import dispatch  # noqa: E402
from specpilot.ops.gated_delta_rule import fla as op_fla  # noqa: E402
from specpilot.ops.gated_delta_rule.reference import gdn_gating, l2norm, recurrent_gated_delta_rule  # noqa: E402
from specpilot.ops.testing import assert_close  # noqa: E402


def _inputs(B=2, T=37, H=2, HV=4, K=32, V=16, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=gen).to(dtype)
    a, b = torch.randn(B, T, HV, generator=gen), torch.randn(B, T, HV, generator=gen)
    A_log = torch.empty(HV).uniform_(0.01, 4.0, generator=gen).log()
    g, beta = gdn_gating(a, b, A_log, torch.randn(HV, generator=gen))
    s0 = torch.randn(B, HV, K, V, generator=gen) * 0.3
    return q, k, v, g, beta, s0


def _fake_fla(calls: list):
    """fla.ops.gated_delta_rule as fla-core 0.6.0 documents chunk_gated_delta_rule: scale before initial_state,
    GVA inside (value head hv reads key head hv // (HV // H)), q/k normalised only with use_qk_l2norm_in_kernel,
    the final state only with output_final_state, o in q's dtype. Computed by our reference (which also repeats
    the key heads and normalises, so the stand-in undoes nothing: it passes pre-normalised q/k only when asked)."""

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, chunk_size=64, **kwargs):
        calls.append(dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, chunk_size=chunk_size, g=g, beta=beta,
                          **kwargs))
        assert use_qk_l2norm_in_kernel, "the stand-in models only the in-kernel normalisation our layer needs"
        o, final = recurrent_gated_delta_rule(l2norm(q), l2norm(k), v, g, beta, initial_state, scale)
        return o.to(q.dtype), (final if output_final_state else None)

    return types.SimpleNamespace(chunk_gated_delta_rule=chunk_gated_delta_rule)


@pytest.fixture
def on_cuda(monkeypatch):
    """CPU tensors dispatched as if on CUDA, with fla installed (a stand-in) or not; returns the stand-in's calls."""
    pytest.importorskip("triton")  # the dispatch imports our kernel module
    monkeypatch.setattr(op, "use_triton", lambda x: True)
    dispatch.clear_fallbacks()
    calls: list = []

    def install(fla_installed: bool):
        monkeypatch.setattr(op_fla, "_ops", lambda: _fake_fla(calls) if fla_installed else None)
        return calls

    yield install
    dispatch.clear_fallbacks()


@pytest.mark.parametrize("kernel,fla_installed,want", [
    (False, True, "torch"), ("torch", True, "torch"),
    (True, True, "fla"), ("fla", True, "fla"), ("triton", True, "triton"),
    (True, False, "triton"), ("fla", False, "triton"), ("triton", False, "triton"),
])
def test_prefill_kernel_choice(on_cuda, kernel, fla_installed, want):
    on_cuda(fla_installed)
    q, k, v, *_ = _inputs(B=1, T=op.FLA_MIN_TOKENS + 1)
    assert op.prefill_kernel(q, k, v, 64, kernel) == want
    assert dispatch.fallbacks() == {}


def test_true_takes_our_kernel_up_to_the_crossover(on_cuda):
    """At and below FLA_MIN_TOKENS per sequence our kernel was the faster one on the H200: True takes it there,
    while an explicit "fla" still asks for fla."""
    on_cuda(True)
    q, k, v, *_ = _inputs(B=1, T=op.FLA_MIN_TOKENS)
    assert op.prefill_kernel(q, k, v, 64, True) == "triton"
    assert op.prefill_kernel(q, k, v, 64, "fla") == "fla"


@pytest.mark.parametrize("case,kw,want", [
    ("fp32 (fla's dots would run in tf32)", dict(dtype=torch.float32), "triton"),
    ("K not a multiple of 16", dict(K=40), "triton"),
    ("V not a multiple of 16", dict(V=24), "triton"),
    ("K over 256: our kernel cannot either", dict(K=320), "torch"),
])
def test_shapes_fla_does_not_take_go_to_our_kernel(on_cuda, case, kw, want):
    on_cuda(True)
    q, k, v, *_ = _inputs(T=5, **kw)
    assert op.prefill_kernel(q, k, v, 64, True) == want, case
    assert op.prefill_kernel(q, k, v, 32, True) in ("triton", "torch"), "fla takes only its 64-token chunk"
    assert dispatch.fallbacks() == ({"chunk_gated_delta_rule": 2} if want == "torch" else {})


def test_off_cuda_always_the_torch_form(monkeypatch):
    monkeypatch.setattr(op_fla, "_ops", lambda: pytest.fail("fla must not be imported off CUDA"))
    q, k, v, *_ = _inputs()
    for kernel in (True, "fla", "triton"):
        assert op.prefill_kernel(q, k, v, 64, kernel) == "torch"


@pytest.mark.parametrize("bad", ["flash", "Triton", 2, None])
def test_unknown_kernel_is_refused(bad):
    q, k, v, *_ = _inputs()
    with pytest.raises(ValueError, match="prefill kernel .*: use one of torch, triton, fla, True or False"):
        op.prefill_kernel(q, k, v, 64, bad)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("H,HV", [(2, 2), (2, 4), (1, 3)], ids=["gva1", "gva2", "gva3"])
def test_fla_path_keeps_our_contract(on_cuda, H, HV, with_state):
    """Through the fla path the call returns what the torch chunk form returns: o in v's dtype, the fp32 final
    state, the initial state untouched; fla gets raw q/k with in-kernel normalisation, the final state asked for,
    fp32 gates and an fp32 contiguous initial state."""
    calls = on_cuda(True)
    q, k, v, g, beta, s0 = _inputs(H=H, HV=HV)
    s0 = s0 if with_state else None
    s0_copy = None if s0 is None else s0.clone()
    o, s = op.chunk_gated_delta_rule(q, k, v, g, beta, s0, scale=0.2, kernel="fla")
    o_ref, s_ref = op._chunk.chunk_gated_delta_rule(q, k, v, g, beta, s0, scale=0.2)
    (call,) = calls
    assert call["use_qk_l2norm_in_kernel"] and call["output_final_state"] and call["scale"] == 0.2
    assert call["chunk_size"] == 64 and call["g"].dtype == call["beta"].dtype == torch.float32
    if with_state:
        assert call["initial_state"].dtype == torch.float32 and call["initial_state"].is_contiguous()
        assert torch.equal(s0, s0_copy), "initial_state must not be modified"
    else:
        assert call["initial_state"] is None
    assert o.dtype == v.dtype and s.dtype == torch.float32 and s.shape == s_ref.shape
    assert_close("o", o_ref, o, ratio=1e-2)  # bf16 outputs
    assert_close("state", s_ref, s, ratio=1e-4)


def test_without_fla_installed_the_dispatch_takes_our_kernel(monkeypatch):
    """fla-core missing (an import that fails, as without the `fla` extra): available() says so, no error."""
    monkeypatch.setitem(sys.modules, "fla", None)  # `import fla...` now raises ImportError
    op_fla._ops.cache_clear()
    try:
        assert not op_fla.available()
        pytest.importorskip("triton")
        monkeypatch.setattr(op, "use_triton", lambda x: True)
        q, k, v, *_ = _inputs()
        assert op.prefill_kernel(q, k, v, 64, True) == "triton"
    finally:
        op_fla._ops.cache_clear()


def test_fla_kernels_under_the_triton_interpreter():
    pytest.importorskip("fla.ops.gated_delta_rule", reason="fla-core is not installed (the optional extra `fla`)")
    pytest.skip("fla-core 0.6.0's chunk kernels do not run under TRITON_INTERPRET=1 (chunk_delta_h.py calls .to() on "
                "a Python loop index, and its autotuner asks for a GPU driver): tests/gpu/test_fla_gpu.py checks them")


def test_cpu_prefill_never_imports_fla(tmp_path):
    """A CPU run (CI's, without triton) must not import fla, even where it is installed: an `fla` package that
    fails on import sits first on the path while a CPU prefill asks for the fastest kernel."""
    import subprocess

    (tmp_path / "fla").mkdir()
    (tmp_path / "fla" / "__init__.py").write_text("raise RuntimeError('fla was imported')\n")
    code = ("import sys, torch\n"
            "import specpilot.ops.gated_delta_rule as op\n"
            "q = k = torch.randn(1, 20, 1, 16).bfloat16(); v = torch.randn(1, 20, 2, 16).bfloat16()\n"
            "g = -torch.rand(1, 20, 2); beta = torch.rand(1, 20, 2)\n"
            "op.chunk_gated_delta_rule(q, k, v, g, beta, kernel=True)\n"
            "assert 'fla' not in sys.modules\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
