"""The SwiGLU MLP's routes: the W12N SwiGLU GEMV (silu(gate) * up in the kernel's epilogue) where it applies,
otherwise the product and silu_mul (or the bf16 gated GEMV)."""

import torch

from specpilot.layers import linear
from specpilot.layers import pointwise as pw
from specpilot.layers.mlp import MLP
from specpilot.layers.paths import PLAIN, KernelPaths
from specpilot.ops.w12n_gemv import w12n_linear

W12N = KernelPaths(w12n=True, w12n_swiglu=True)


def test_mlp_takes_the_swiglu_gemv_where_it_applies(monkeypatch):
    torch.manual_seed(0)
    mlp = MLP(256, 48).bfloat16()
    for p in mlp.parameters():
        torch.nn.init.normal_(p, std=0.02)
    x = torch.randn(3, 256).bfloat16()
    report = linear.attach_w12n(mlp)
    assert "gate_up_proj" in report and mlp.gate_up_proj.glu and not mlp.down_proj.glu
    want = mlp(x, W12N)
    assert mlp.gate_up_proj.swiglu(x, W12N) is None  # on a CPU the fused kernel never applies
    calls = []

    def fused(x, t, pdl=False):  # what the kernel forms, by the reference path
        calls.append(t)
        return pw.silu_mul(w12n_linear(x, t))

    monkeypatch.setattr(linear, "fuses_swiglu", lambda x, t: True)
    monkeypatch.setattr(linear, "w12n_swiglu", fused)
    got = mlp(x, W12N)
    assert calls == [mlp.gate_up_proj.w12n] and torch.equal(got, want)
    assert mlp(torch.randn(17, 256).bfloat16(), W12N).shape == (17, 256) and len(calls) == 1  # past 16 rows: bf16
    assert mlp.gate_up_proj.swiglu(x, PLAIN) is None  # without the W12N path: the bf16 weight
    assert mlp.gate_up_proj.swiglu(x, KernelPaths(w12n=True)) is None  # w12n_swiglu off: product, then silu_mul
