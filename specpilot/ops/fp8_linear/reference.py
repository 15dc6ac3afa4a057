"""The torch truth of the FP8 linear: the same quantization as the GPU path, the product in fp32."""

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite E4M3 value
TINY = 1e-12  # the least amax a scale is taken from (an all-zero input would give scale 0)


def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """t -> (q, scale): q = E4M3(t / scale), scale = amax(|t|) / 448 (fp32 scalar tensor), so t ~= q * scale."""
    scale = (t.detach().abs().amax().float().clamp(min=TINY) / FP8_MAX).reshape(())
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A [N, K] weight -> (E4M3 [N, K] contiguous, its fp32 scale)."""
    q, scale = quantize(weight)
    return q.contiguous(), scale


def fp8_linear_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """y = (E4M3(x / sx) sx) (weight scale)^T in fp32, returned in x.dtype; sx = amax(|x|) / 448 over the call."""
    xq, sx = quantize(x)
    return ((xq.float() @ weight.float().t()) * (sx * scale)).to(x.dtype)
