"""Reference GEMVs on W12N weights (plain torch, the truth the Triton kernels are tested against).

`w12n_gemv_ref` decodes the exact bf16 matrix (`specpilot.weights.w12n.decode`) and multiplies in fp32.
`fp8_gemv_ref` multiplies by the FP8 view nested in the A plane (`fp8_view`): the 8-bit scan the two-level
verifier uses. Escaped weights (code 0, verbatim segments included) contribute what the view holds there:
the E4M3 subnormal sign * (m6m5m4 / 8) * 2^-6 times the scale, i.e. |w_view| < 2^(base-126). That is within
the window's smallest binade of the true weight for escapes below the window (every finite weight under the
default 'max' base; zeros read as signed zeros) and meaningless for outliers above it ('coverage' base) and
for inf/NaN, which the view never reproduces.
"""

import torch

from specpilot.weights.w12n import W12NTensor, decode, fp8_view


def _check(x: torch.Tensor, t: W12NTensor) -> None:
    if x.dim() != 2 or x.shape[1] != t.k:
        raise ValueError(f"x must be [M, K={t.k}] for a {t.n}x{t.k} W12N weight, got {list(x.shape)}")


def w12n_gemv_ref(x: torch.Tensor, t: W12NTensor) -> torch.Tensor:
    """x [M, K] (bf16 or fp32), t = W12N of W [N, K] -> y = x @ decode(t).T [M, N], fp32 accumulate, x.dtype."""
    _check(x, t)
    w = decode(t).to(x.device)
    return (x.float() @ w.float().t()).to(x.dtype)


def fp8_dequant_ref(t: W12NTensor) -> torch.Tensor:
    """fp32 [N, K]: the FP8 view times its scale (exact in fp32: E4M3 value times a power of two)."""
    view, scale = fp8_view(t)
    return view.float() * scale


def fp8_gemv_ref(x: torch.Tensor, t: W12NTensor) -> torch.Tensor:
    """x [M, K], t -> y = x @ (fp8_view(t) * scale).T [M, N], fp32 accumulate, in x.dtype (see module doc)."""
    _check(x, t)
    return (x.float() @ fp8_dequant_ref(t).to(x.device).t()).to(x.dtype)
