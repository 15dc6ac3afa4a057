"""RMSNorm (+ residual add) for decode rows: one program per row, launched with PDL when the step uses it.

Under programmatic dependent launch a norm signals its dependents first, so the GEMV after it is scheduled while
the norm still runs and streams its first weight tile early (ops/gemv); the compiled pointwise helper it replaces
cannot signal. Same rounding as reference.py: the residual sum in the activation dtype, normalisation in fp32.
"""

import torch
import triton
import triton.language as tl

from specpilot.ops.pdl import launch_kwargs, usable


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, H, eps, stride_x, stride_r, stride_o, stride_s,
                         HAS_RESIDUAL: tl.constexpr, ZERO_CENTERED: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)  # parameters: independent of the previous kernel
    if PDL:
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    sf = x.to(tl.float32)
    if HAS_RESIDUAL:
        # the sum rounded to the activation dtype, as eager `x + residual` is (fp32 add, one rounding)
        s = (sf + tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * stride_s + cols, s, mask=mask)
        sf = s.to(tl.float32)
    n = sf * tl.rsqrt(tl.sum(sf * sf, axis=0) / H + eps)
    if ZERO_CENTERED:
        out = n * (1.0 + w.to(tl.float32))
    else:
        out = w.to(tl.float32) * n.to(x.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 zero_centered: bool, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as add_rms_norm_ref; pdl: launch with programmatic dependent launch (ops/pdl.py)."""
    H = x.shape[-1]
    assert weight.shape == (H,) and x.stride(-1) == 1, "weight [H], rows with a dense last dim"
    x2 = x.reshape(-1, H)
    r2 = x2 if residual is None else residual.reshape(-1, H)
    out = torch.empty_like(x2)
    s = x2 if residual is None else torch.empty_like(x2)
    on = usable(x, pdl)
    _add_rms_norm_kernel[(x2.shape[0],)](
        x2, r2, weight, out, s, H, eps, x2.stride(0), r2.stride(0), out.stride(0), s.stride(0),
        HAS_RESIDUAL=residual is not None, ZERO_CENTERED=zero_centered, BLOCK=triton.next_power_of_2(H), PDL=on,
        num_warps=4, **launch_kwargs(on))
    return out.view(x.shape), (x if residual is None else s.view(x.shape))
