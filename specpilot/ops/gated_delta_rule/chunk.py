"""Chunked (WY/UT) form of the gated delta rule in plain torch, used for prefill: matmuls inside each chunk,
a sequential scan over chunks that carries the [K,V] state. Same results as the recurrent reference."""

import torch
import torch.nn.functional as F

from .reference import prepare_qk


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV] fp32; initial_state [B,HV,K,V] fp32 or None (zeros).

    Returns o [B,T,HV,V] in v.dtype and a new final_state [B,HV,K,V] fp32.
    """
    B, T, HV, V = v.shape
    qn, kn = prepare_qk(q, k, HV, scale)
    K = qn.shape[-1]
    qc, kc, vc, gc, bc = _to_chunks([qn, kn, v.float(), g.float(), beta.float()], chunk_size)
    G = gc.cumsum(-1)
    decay = _decay_matrix(G)
    w_v, w_k = _solve_ut(kc, vc, G, bc, decay)
    if initial_state is None:
        S = torch.zeros(B, HV, K, V, dtype=torch.float32, device=v.device)
    else:
        S = initial_state.float().clone()
    o, S = _scan_chunks(qc, kc, G, decay, w_v, w_k, S)
    o = o.reshape(B, HV, -1, V)[:, :, :T].transpose(1, 2)
    return o.to(v.dtype), S


def _to_chunks(xs: list[torch.Tensor], chunk_size: int) -> list[torch.Tensor]:
    """[B,T,HV,*] -> [B,HV,NC,L,*] and [B,T,HV] -> [B,HV,NC,L], T zero-padded to a multiple of L.

    Padded tokens have beta = 0 and g = 0, so they leave the state untouched.
    """
    out = []
    for x in xs:
        x = x.transpose(1, 2)
        T = x.shape[2]
        pad = (-T) % chunk_size
        if x.dim() == 4:
            x = F.pad(x, (0, 0, 0, pad))
            out.append(x.reshape(x.shape[0], x.shape[1], -1, chunk_size, x.shape[-1]))
        else:
            x = F.pad(x, (0, pad))
            out.append(x.reshape(x.shape[0], x.shape[1], -1, chunk_size))
    return out


def _decay_matrix(G: torch.Tensor) -> torch.Tensor:
    """exp(G_i - G_j) for j <= i, else 0. G [...,L] within-chunk cumulative log-decay -> [...,L,L]."""
    L = G.shape[-1]
    future = torch.ones(L, L, dtype=torch.bool, device=G.device).triu(1)
    # Mask before exp: G_i - G_j > 0 above the diagonal and could overflow to inf (inf * 0 = NaN).
    return (G[..., :, None] - G[..., None, :]).masked_fill(future, float("-inf")).exp()


def _solve_ut(
    k: torch.Tensor, v: torch.Tensor, G: torch.Tensor, beta: torch.Tensor, decay: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Within a chunk the delta-rule writes satisfy (I + A) u = beta v - beta exp(G) k S0 with
    A_ij = beta_i exp(G_i - G_j) k_i.k_j (j < i). Returns w_v = (I+A)^-1 beta v and w_k = (I+A)^-1 beta exp(G) k,
    so that u = w_v - w_k S0. k [...,L,K], v [...,L,V], G, beta [...,L], decay [...,L,L]."""
    A = (beta[..., None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    M = A + torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    w_v = torch.linalg.solve_triangular(M, beta[..., None] * v, upper=False, unitriangular=True)
    w_k = torch.linalg.solve_triangular(M, (beta * G.exp())[..., None] * k, upper=False, unitriangular=True)
    return w_v, w_k


def _scan_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    G: torch.Tensor,
    decay: torch.Tensor,
    w_v: torch.Tensor,
    w_k: torch.Tensor,
    S: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequential pass over chunks. q, k [B,HV,NC,L,K]; w_v [B,HV,NC,L,V]; w_k [B,HV,NC,L,K]; S [B,HV,K,V].

    Returns o [B,HV,NC,L,V] and the final state.
    """
    G_last = G[..., -1:]
    q_from_state = q * G.exp()[..., None]
    k_to_state = k * (G_last - G).exp()[..., None]
    intra = (q @ k.transpose(-1, -2)) * decay
    chunk_decay = G_last.exp()[..., None]
    o = torch.empty_like(w_v)
    for c in range(q.shape[2]):
        u = w_v[:, :, c] - w_k[:, :, c] @ S
        o[:, :, c] = q_from_state[:, :, c] @ S + intra[:, :, c] @ u
        S = S * chunk_decay[:, :, c] + k_to_state[:, :, c].transpose(-1, -2) @ u
    return o, S
