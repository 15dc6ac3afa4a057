"""Small pointwise helpers (norms, activations, RoPE), each run eagerly or as one torch.compiled kernel.

On CUDA, eager PyTorch would launch half a dozen kernels per norm; torch.compile fuses each helper into one. A
caller passes `compiled=paths.compiled` (layers/paths.py): on for decode steps and captured graphs, whose
shapes are fixed per graph, off for prefill, whose shapes vary (and which is not bound by launch overhead).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specpilot.ops.gated_delta_rule.reference import gdn_gating as _gdn_gating


def pointwise(fn):
    """fn(*args, compiled=False): eagerly, or with compiled=True on CUDA as one compiled fused kernel."""
    compiled_fn = None

    @functools.wraps(fn)
    def wrapper(*args, compiled: bool = False):
        nonlocal compiled_fn
        if compiled and args[0].is_cuda:
            if compiled_fn is None:
                # dynamo's automatic dynamic shapes: the first shape (the decode step) compiles static, a second
                # one compiles a shape-generic kernel that every later verify width reuses instead of compiling
                # anew; the limit only guards against dynamo silently falling back to eager
                torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
                compiled_fn = torch.compile(fn, fullgraph=True)
            return compiled_fn(*args)
        return fn(*args)

    return wrapper


def _normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


@pointwise
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Llama / Qwen3 rounding: normalise in fp32, cast, then scale in the model dtype
    return weight * _normalize(x, eps).to(x.dtype)


@pointwise
def rms_norm_zero_centered(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Qwen3.5 rounding: the (1 + w) scale is applied in fp32 before the cast
    return (_normalize(x, eps) * (1.0 + weight.float())).to(x.dtype)


@pointwise
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    s = x + residual
    return weight * _normalize(s, eps).to(s.dtype), s


@pointwise
def add_rms_norm_zero_centered(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    s = x + residual
    return (_normalize(s, eps) * (1.0 + weight.float())).to(s.dtype), s


@pointwise
def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gated DeltaNet output norm: weight * norm(x), then * silu(z) in fp32."""
    y = weight * _normalize(x, eps).to(x.dtype)
    return (y * F.silu(z.float())).to(x.dtype)


@pointwise
def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    # formed in fp32 and rounded once, eager or compiled (the compiled kernel upcasts anyway): the gated GEMVs
    # (ops/gemv GATED) form the same product, so every path rounds the SwiGLU activation alike
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gate_up.dtype)


@pointwise
def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(gate)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@pointwise
def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, D]; cos, sin [B, T, R] (R <= D rotary dims, rotate-half layout); rest passes through."""
    r = cos.shape[-1]
    cos, sin = cos.to(x.dtype)[:, :, None, :], sin.to(x.dtype)[:, :, None, :]
    rot = x[..., :r] * cos + _rotate_half(x[..., :r]) * sin
    return rot if r == x.shape[-1] else torch.cat((rot, x[..., r:]), dim=-1)


@pointwise
def qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps: float, zero_centered: bool):
    """Per-head RMSNorm of q [B, T, H, D] and k [B, T, KVH, D] (skipped when the weights are None), then RoPE:
    one fused kernel at decode instead of six."""
    if q_weight is not None:
        norm = rms_norm_zero_centered.__wrapped__ if zero_centered else rms_norm.__wrapped__
        q, k = norm(q, q_weight, eps), norm(k, k_weight, eps)
    return apply_rotary.__wrapped__(q, cos, sin), apply_rotary.__wrapped__(k, cos, sin)


@pointwise
def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """Gated DeltaNet log-decay and write strength (ops/gated_delta_rule/reference.py::gdn_gating), one fused
    kernel in a captured verify graph instead of eight."""
    return _gdn_gating(a, b, A_log, dt_bias)
