"""Linear: nn.Linear whose product takes the kernel its KernelPaths (layers/paths.py) choose.

- `paths.w12n`: a layer that carries W12N planes (attach_w12n) multiplies up to 16 rows (decode steps, small
  trees) through the fused register-decoding GEMV, where reading fewer bytes pays; larger products stay on
  cuBLAS with the bf16 weight, which is kept (for them and every other reader), so one model serves both formats
  side by side. A layer whose bf16 weight was dropped (attach_w12n(drop_bf16=True), weight_format "w12n_only")
  sends every product through its planes, under any paths: larger ones decode W and call cuBLAS.
- `paths.gemv`: products of up to ops.gemv.MAX_M rows (decode steps, verify blocks) run the Triton GEMVs instead
  of cuBLAS; with `paths.gated_down` a single-row SwiGLU down projection reads [gate | up] itself (Linear.gated).
Everything else is a plain F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specpilot.layers import pointwise as pw
from specpilot.layers.paths import PLAIN, KernelPaths
from specpilot.ops.gemv import MAX_M, gated_gemv, gemv
from specpilot.ops.silu_mul import silu_mul
from specpilot.ops.w12n_gemv import fuses_swiglu, w12n_linear, w12n_swiglu
from specpilot.weights import w12n


class Linear(nn.Linear):
    w12n: w12n.W12NTensor | None = None
    glu: bool = False  # the rows are an MLP's [gate | up]: attach_w12n prepares the SwiGLU GEMV's planes

    def _takes_w12n(self, x: torch.Tensor, paths: KernelPaths) -> bool:
        return (self.w12n is not None and self.bias is None
                and (self.weight is None or (paths.w12n and x.numel() <= 16 * x.shape[-1])))

    def forward(self, x: torch.Tensor, paths: KernelPaths = PLAIN) -> torch.Tensor:
        if self._takes_w12n(x, paths):
            return w12n_linear(x, self.w12n, pdl=paths.pdl)
        if paths.gemv and self.bias is None and x.numel() <= MAX_M * x.shape[-1]:
            y = gemv(x.reshape(-1, x.shape[-1]), self.weight, pdl=paths.pdl)
            return y.view(*x.shape[:-1], self.out_features)
        # always 2-D: a non-contiguous [B, T, K] input (a slice of a block's rows) would go to a batched matmul
        # that reads the whole weight once per B (docs/decisions/2026-12-02-dflash-batched-proposal.md)
        y = F.linear(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def gated(self, gate_up: torch.Tensor, paths: KernelPaths = PLAIN) -> torch.Tensor:
        """self(silu(gate) * up) for gate_up = [gate | up]. The fused form takes single rows only: formed in the
        skinny kernel it made verify blocks slower (docs/decisions/2026-12-01-engine-config-defaults.md)."""
        if (paths.gated_down and self.bias is None and gate_up.numel() == gate_up.shape[-1]
                and self.weight is not None and not (paths.w12n and self.w12n is not None)):
            y = gated_gemv(gate_up.reshape(1, -1), self.weight, pdl=paths.pdl)
            return y.view(*gate_up.shape[:-1], self.out_features)
        act = silu_mul(gate_up) if paths.row_kernels else pw.silu_mul(gate_up, compiled=paths.compiled)
        return self(act, paths)

    def swiglu(self, x: torch.Tensor, paths: KernelPaths = PLAIN) -> torch.Tensor | None:
        """silu(gate) * up of this [gate | up] projection where the W12N GEMV forms it in its epilogue (one kernel,
        no silu_mul); None elsewhere (the caller then runs the product and silu_mul, or a gated GEMV)."""
        if paths.w12n_swiglu and self._takes_w12n(x, paths) and fuses_swiglu(x, self.w12n):
            return w12n_swiglu(x, self.w12n, pdl=paths.pdl)
        return None


def attach_w12n(model: nn.Module, skip: tuple[str, ...] = ("embed_tokens",), drop_bf16: bool = False) -> dict:
    """Encodes every bf16 Linear weight that pays (W12N policy) and attaches the planes on the weight's device;
    tied weights (an LM head sharing the embedding) and layers with a bias are skipped. drop_bf16: each encoded
    layer's bf16 weight is released as soon as its planes exist, so the model never holds both in full (a
    Qwen3.5-27B: 54 GB of bf16 against 41 GB of planes and their 41 GB tile-major copy on a GPU). Returns
    {name: stats} of the encoded ones."""
    tied = {id(p) for n, p in model.named_parameters() if any(s in n for s in skip)}
    report = {}
    for name, module in model.named_modules():
        if (not isinstance(module, Linear) or module.weight is None or module.weight.dtype != torch.bfloat16
                or id(module.weight) in tied or module.bias is not None):
            continue
        encoded = w12n.maybe_encode(module.weight.detach())
        if encoded is not None:
            if encoded.a.is_cuda:  # the tensor-core GEMV's tile-major planes, before any graph capture
                from specpilot.ops.w12n_gemv import mma

                mma.prepare(encoded, swiglu=module.glu)
            module.w12n = encoded
            report[name] = w12n.stats(encoded)
            if drop_bf16:  # the caching allocator hands the freed bytes to the next layer's planes
                module.weight = None
    return report
