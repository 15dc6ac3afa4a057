"""Qwen3.5 Gated DeltaNet core: gating, the chunked prefill form (torch; on CUDA, when asked, fla-core's kernel or
our one-launch Triton kernel, chosen by prefill_kernel), and the fused recurrent decode op (Triton on CUDA, torch
reference elsewhere)."""

import torch

from ..dispatch import takes, use_triton
from . import chunk as _chunk
from . import fla as _fla
from .reference import fused_recurrent_gated_delta_rule_ref, gdn_gating, recurrent_gated_delta_rule

__all__ = [
    "PREFILL_KERNELS",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_ref",
    "gdn_gating",
    "prefill_kernel",
    "recurrent_gated_delta_rule",
]

# what `kernel` may name: the torch chunk form, our Triton kernel (triton.py), fla-core's kernel (fla.py); True asks
# for the fastest one that runs here, False for the torch form
PREFILL_KERNELS = ("torch", "triton", "fla")
# True takes fla above this many tokens per sequence and ours up to it: on the H200 (27B GDN layer, one sequence)
# ours took 0.82 ms against fla's 1.02 at 512 tokens, fla 1.00 against ours 3.26 at 2,048 (prefill_gdn_h200.json)
FLA_MIN_TOKENS = 512


def prefill_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int = 64,
                   kernel: bool | str = False) -> str:
    """Which form chunk_gated_delta_rule runs for these inputs: "fla", "triton" or "torch".

    kernel: False or "torch": the torch form. "triton": our kernel on CUDA. "fla": fla-core's on CUDA where it is
    installed and takes the shapes (fla.supports), else ours. True: as "fla" for sequences longer than
    FLA_MIN_TOKENS, else ours (the faster of the two on each side). Off CUDA (or under
    autograd, or SPECPILOT_FORCE_REFERENCE_OPS=1) always the torch form; a shape our kernel cannot take falls back
    to it too (counted in dispatch.fallbacks()).
    """
    if kernel not in (True, False) and kernel not in PREFILL_KERNELS:
        raise ValueError(f"prefill kernel {kernel!r}: use one of {', '.join(PREFILL_KERNELS)}, True or False")
    if kernel in (False, "torch") or not use_triton(v):
        return "torch"
    wants_fla = kernel == "fla" or (kernel is True and v.shape[1] > FLA_MIN_TOKENS)
    if wants_fla and _fla.supports(q, k, v, chunk_size) and _fla.available():
        return "fla"
    from . import triton  # only here: CPU-only installs have no triton and never take this branch

    return "triton" if takes("chunk_gated_delta_rule", triton.supports(q)) else "torch"


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
    *,
    kernel: bool | str = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule -> (o [B,T,HV,V] in v.dtype, final state [B,HV,K,V] fp32); see chunk.py for shapes.

    kernel: which form runs on CUDA (prefill_kernel; KernelPaths.gdn_prefill_kernel, from
    EngineConfig.ablations.triton_gdn_prefill): fla-core's parallel chunked kernel or our one-launch Triton kernel
    instead of the torch form's dozens of small ops per chunk.
    """
    form = prefill_kernel(q, k, v, chunk_size, kernel)
    if form == "fla":
        return _fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, scale, chunk_size)
    if form == "triton":
        from . import triton

        return triton.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, scale, chunk_size)
    return _chunk.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, scale, chunk_size)


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_pool: torch.Tensor,
    state_idx: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Gating + recurrence from state_pool[state_idx], final state written back in place; o [B,T,HV,V].

    See reference.fused_recurrent_gated_delta_rule_ref for shapes.
    """
    if use_triton(q):
        from . import triton

        if takes("fused_recurrent_gated_delta_rule", triton.supports(q)):
            return triton.fused_recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, state_pool, state_idx, scale)
    return fused_recurrent_gated_delta_rule_ref(q, k, v, a, b, A_log, dt_bias, state_pool, state_idx, scale)
