"""flash-linear-attention's chunked gated delta rule (`fla-core`, the optional extra `fla`) behind chunk.py's
contract: the CUDA prefill path where it is installed and takes the shapes.

fla imports triton at import time, and CPU-only installs have neither, so nothing here imports it before a CUDA
prefill asks (`available()`); without fla-core the dispatcher takes our Triton kernel instead, with no error.
Conventions checked against fla-core 0.6.0: [B,T,H,K] heads last; GVA (HV a multiple of H, value head hv reads
key head hv // (HV // H), as ours); g in natural-log space; beta after the sigmoid; q/k L2-normalised in fla's
kernel (eps 1e-6 inside the root, as ours, but the normalised q/k rounded to the input dtype); per-chunk states
kept in the input dtype, initial and final state fp32 [B,HV,K,V].
"""

from __future__ import annotations

import functools
import importlib

import torch

# fla's dots run in the input dtype (tf32 for fp32 inputs): fp32 models keep our fp32-accurate kernel
DTYPES = (torch.bfloat16, torch.float16)
CHUNK_SIZE = 64  # fla's default chunk, the one its kernels are tuned for
MAX_HEAD_DIM = 256  # fla's state kernel holds K in at most four 64-wide slices


@functools.cache
def _ops():
    """fla.ops.gated_delta_rule, or None where fla-core (or triton, which it imports) is not installed. Cached:
    the import takes seconds (fla.ops imports every op), and whether a package is installed does not change."""
    try:
        return importlib.import_module("fla.ops.gated_delta_rule")
    except ImportError:
        return None


def available() -> bool:
    """Whether fla-core imports here (import it on first call; only a CUDA prefill should ask)."""
    return _ops() is not None


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int) -> bool:
    """The shapes and dtypes this path takes: q, k, v of one 16-bit dtype, HV a multiple of H, K up to 256, K and V
    multiples of 16 (odd head dims take our kernel, which pads them), fla's 64-token chunk."""
    H, K = q.shape[-2:]
    HV, V = v.shape[-2:]
    return (q.dtype == k.dtype == v.dtype and q.dtype in DTYPES and chunk_size == CHUNK_SIZE
            and HV % H == 0 and K <= MAX_HEAD_DIM and K % 16 == 0 and V % 16 == 0)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as chunk.chunk_gated_delta_rule: q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV] fp32;
    initial_state [B,HV,K,V] fp32 or None (zeros) -> (o [B,T,HV,V] in v.dtype, final state [B,HV,K,V] fp32).
    The initial state is not modified. Needs available() and supports(q, k, v, chunk_size)."""
    h0 = None if initial_state is None else initial_state.float().contiguous()
    o, final = _ops().chunk_gated_delta_rule(
        q, k, v, g.float(), beta.float(), scale=scale, initial_state=h0, output_final_state=True,
        use_qk_l2norm_in_kernel=True, chunk_size=chunk_size)
    return o.to(v.dtype), final.float()


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
    """fla's fused recurrent kernel (gating, L2 norms and the recurrence in one launch) behind
    reference.fused_recurrent_gated_delta_rule_ref's contract: fla reads an [B,HV,K,V] initial state and writes a
    new final state, so the pool's slots are gathered before and scattered back after. For the decode comparison
    (bench/prefill.py); the engine decodes with our kernel, which updates the pool in place."""
    idx = state_idx.long()
    o, final = _ops().fused_recurrent_gated_delta_rule(
        q, k, v, g=a, beta=b, scale=scale, initial_state=state_pool[idx], output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
        use_beta_sigmoid_in_kernel=True)
    state_pool[idx] = final.to(state_pool.dtype)
    return o.to(v.dtype)
