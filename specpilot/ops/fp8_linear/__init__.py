"""FP8 linear: y = x W^T with W stored as FP8 E4M3 and one scale, x quantized to E4M3 with one scale per call.

An approximate product for the places where an approximation is free to be wrong: a drafter's LM head (every
drafted token is verified by the full-precision target, so the head's error changes acceptance, never the
output). It halves the bytes a bf16 head reads. On CUDA GPUs with FP8 tensor cores (compute capability 8.9+) the
product is cuBLASLt's FP8 GEMM (`torch._scaled_mm`, per-tensor scales, rows padded to 16); elsewhere, and for
shapes it does not take, the torch reference computes the same quantized product in fp32.
"""

import torch

from specpilot.ops.dispatch import takes, use_triton
from specpilot.ops.fp8_linear.reference import FP8, fp8_linear_ref, quantize, quantize_weight

__all__ = ["FP8", "fp8_linear", "fp8_linear_ref", "quantize", "quantize_weight", "supports"]


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The FP8 GEMM's shape and device rules: K and N multiples of 16, a GPU with FP8 tensor cores."""
    n, k = weight.shape
    return x.is_cuda and k % 16 == 0 and n % 16 == 0 and torch.cuda.get_device_capability(x.device) >= (8, 9)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] (bf16 / fp16 / fp32), weight [N, K] float8_e4m3fn, scale: W = weight * scale (fp32 scalar tensor)
    -> y [M, N] in x.dtype."""
    if use_triton(x) and takes("fp8_linear", supports(x, weight)):
        from specpilot.ops.fp8_linear.scaled_mm import fp8_linear_cuda

        return fp8_linear_cuda(x, weight, scale)
    return fp8_linear_ref(x, weight, scale)
