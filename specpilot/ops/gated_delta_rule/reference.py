"""Plain-torch truth for the Qwen3.5 gated delta rule: gating, the per-token recurrence, and the pooled-state op
that the fused Triton decode kernel implements."""

import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6


def gdn_gating(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-decay g = -exp(A_log) * softplus(a + dt_bias) and write strength beta = sigmoid(b).

    a, b [B,T,HV] any dtype; A_log, dt_bias [HV]. Returns fp32 g, beta [B,T,HV].
    """
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b.float())
    return g, beta


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + eps) over the last dim, in fp32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2NORM_EPS)


def prepare_qk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalised fp32 q (times scale) and k, repeated from H key heads to HV value heads.

    q, k [B,T,H,K] -> [B,T,HV,K]; value head hv reads key head hv // (HV // H).
    """
    H, K = q.shape[-2:]
    assert num_v_heads % H == 0, f"value heads {num_v_heads} not a multiple of key heads {H}"
    scale = K**-0.5 if scale is None else scale
    group = num_v_heads // H
    q = (l2norm(q) * scale).repeat_interleave(group, dim=2)
    k = l2norm(k).repeat_interleave(group, dim=2)
    return q, k


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule.

    q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV] fp32; initial_state [B,HV,K,V] fp32 or None (zeros).
    Returns o [B,T,HV,V] in v.dtype and a new final_state [B,HV,K,V] fp32.
    """
    B, T, HV, V = v.shape
    q, k = prepare_qk(q, k, HV, scale)
    K = q.shape[-1]
    if initial_state is None:
        S = torch.zeros(B, HV, K, V, dtype=torch.float32, device=v.device)
    else:
        S = initial_state.float().clone()
    o = torch.empty(B, T, HV, V, dtype=torch.float32, device=v.device)
    for t in range(T):
        S = S * g[:, t].float().exp()[..., None, None]
        u = beta[:, t].float()[..., None] * (v[:, t].float() - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o.to(v.dtype), S


def fused_recurrent_gated_delta_rule_ref(
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
    """Gating + recurrence from state_pool[state_idx[i]], final state written back in place.

    q, k [B,T,H,K]; v [B,T,HV,V]; a, b [B,T,HV]; A_log, dt_bias [HV]; state_pool [N,HV,K,V] fp32;
    state_idx [B] int (distinct slots). Returns o [B,T,HV,V] in v.dtype.
    """
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    idx = state_idx.long()
    o, final_state = recurrent_gated_delta_rule(q, k, v, g, beta, state_pool[idx], scale)
    state_pool[idx] = final_state.to(state_pool.dtype)
    return o
