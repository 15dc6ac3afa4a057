"""GEMV on W12N-compressed weights: exact (fused in-register decode) and the FP8-view scan.

`w12n_gemv` / `fp8_gemv` run the GPU kernels on CUDA (M <= 16) and the torch references elsewhere. The exact
GEMV of bf16 activations runs the tensor-core kernel (`mma.py`: decode into mma fragments); fp32 activations
and shapes it does not take run the FMA kernel (`triton.py`).
`w12n_linear` is what a layer calls: the fused kernel for decode-sized batches on CUDA, otherwise decode to
bf16 and `F.linear` (on a GPU the decode kernel, `triton.w12n_decode`, then cuBLAS; on CPU the torch decode).
`w12n_swiglu` is what an MLP calls for its packed [gate; up] matrix where `fuses_swiglu`: silu(gate) * up, formed
in the tensor-core kernel's epilogue (elsewhere the MLP runs silu_mul on `w12n_linear`'s product).
"""

import torch
import torch.nn.functional as F

from specpilot.ops.dispatch import takes, use_triton
from specpilot.ops.w12n_gemv.reference import fp8_dequant_ref, fp8_gemv_ref, w12n_gemv_ref
from specpilot.weights.w12n import W12NTensor, decode

__all__ = ["w12n_gemv", "fp8_gemv", "w12n_linear", "w12n_swiglu", "fuses_swiglu", "w12n_gemv_ref", "fp8_gemv_ref",
           "fp8_dequant_ref", "MAX_FUSED_M"]

MAX_FUSED_M = 16  # above this many rows the fused FMA kernel loses to decode + cuBLAS (research-weights §0.7)


def w12n_gemv(x: torch.Tensor, t: W12NTensor) -> torch.Tensor:
    """x [M, K], t = W12N of W [N, K] -> y = x @ W.T [M, N] in x.dtype (fp32 accumulate)."""
    if use_triton(x) and x.shape[0] <= MAX_FUSED_M:
        return _fused(x.contiguous(), t)
    return w12n_gemv_ref(x, t)


def _fused(x: torch.Tensor, t: W12NTensor, pdl: bool = False) -> torch.Tensor:
    """The GPU kernel for x [M <= 16, K]: tensor cores where the shapes allow (launched with programmatic
    dependent launch if pdl, ops/pdl.py), else the FMA kernel, else (a segment the FMA kernel does not take) the
    reference."""
    if x.is_cuda:
        from specpilot.ops.w12n_gemv import mma

        if mma.supports(x, t):
            return mma.w12n_mma_gemv(x, t, pdl=pdl)
    from specpilot.ops.w12n_gemv import triton

    if takes("w12n_gemv", triton.supports(x, t)):
        return triton.w12n_gemv(x, t)
    return w12n_gemv_ref(x, t)


def fp8_gemv(x: torch.Tensor, t: W12NTensor) -> torch.Tensor:
    """x [M, K], t -> y = x @ (fp8_view(t) * scale).T [M, N] in x.dtype: the 8-bit verification scan."""
    if use_triton(x) and x.shape[0] <= MAX_FUSED_M:
        from specpilot.ops.w12n_gemv import triton

        x = x.contiguous()
        if takes("fp8_gemv", triton.fp8_supports(x, t)):
            return triton.fp8_gemv(x, t)
    return fp8_gemv_ref(x, t)


def w12n_linear(x: torch.Tensor, t: W12NTensor, pdl: bool = False) -> torch.Tensor:
    """x [..., K] -> x @ W.T [..., N] in x.dtype, W = decode(t) (no bias).

    M = prod(leading dims) <= 16: the fused decode GEMV on CUDA, its fp32-accumulating reference elsewhere (what
    the bf16 decode GEMV computes too: a CPU bf16 F.linear rounds differently and flipped near-ties between the
    two weight formats). Otherwise W is decoded to bf16 for this call and multiplied by F.linear.
    """
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if 1 <= x2.shape[0] <= MAX_FUSED_M:
        if use_triton(x):
            y = _fused(x2.contiguous(), t, pdl)
        else:
            y = w12n_gemv_ref(x2, t)
    else:
        y = F.linear(x2, _decoded(x, t).to(dtype=x.dtype))
    return y.reshape(*lead, t.n)


def fuses_swiglu(x: torch.Tensor, t: W12NTensor) -> bool:
    """Whether w12n_swiglu takes x [..., K] and t: a decode-sized bf16 batch on CUDA that the tensor-core kernel
    takes, and a [gate; up] matrix of whole 16-row blocks."""
    if not (x.is_cuda and use_triton(x) and 1 <= x.numel() // x.shape[-1] <= MAX_FUSED_M):
        return False
    from specpilot.ops.w12n_gemv import mma

    return mma.supports(x.reshape(-1, x.shape[-1]).contiguous(), t) and mma.glu_supported(t)


def w12n_swiglu(x: torch.Tensor, t: W12NTensor, pdl: bool = False) -> torch.Tensor:
    """x [..., K], t = W12N of a packed [gate; up] matrix [2 I, K] -> silu(x Wg^T) * (x Wu^T) [..., I] in one
    kernel (mma.w12n_swiglu_gemv: no silu_mul kernel between the MLP's two projections) where fuses_swiglu; each
    factor rounded to bf16, the product formed in fp32 and rounded once, as silu_mul forms it."""
    if not fuses_swiglu(x, t):
        raise ValueError(f"w12n_swiglu needs a decode-sized bf16 batch on CUDA and a [gate; up] matrix of whole "
                         f"16-row blocks; got {x.dtype} {list(x.shape)} on {x.device}, {t.n} rows")
    from specpilot.ops.w12n_gemv import mma

    y = mma.w12n_swiglu_gemv(x.reshape(-1, x.shape[-1]).contiguous(), t, pdl=pdl)
    return y.reshape(*x.shape[:-1], t.n // 2)


def _decoded(x: torch.Tensor, t: W12NTensor) -> torch.Tensor:
    """W as bf16 on x's device for one product: the decode kernel on CUDA (one launch, no host sync, so a captured
    graph can hold it), the torch decode elsewhere."""
    if use_triton(x):
        from specpilot.ops.w12n_gemv import triton

        if takes("w12n_decode", triton.decode_supports(t)):
            return triton.w12n_decode(t)
    return decode(t).to(x.device)
