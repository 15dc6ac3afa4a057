"""Gated DeltaNet over a draft tree in one shot (the tree-masked WY form), and the fold that commits a path.

Per request and value head, with P the inclusive ancestor mask and G = P g the path-summed log-decay:
    D[i,j] = exp(G_i - G_j) for j ancestor-or-self of i, else 0
    (I + A) U = beta * (V - exp(G) * (K S0)),   A[i,j] = beta_i D[i,j] (k_i . k_j) for proper ancestors j
    O = exp(G) * (Q S0) + ((Q K^T) * D) U
(I + A) only links nodes along ancestor chains, so on each root-to-leaf path it is that chain's own system: the
result is exactly the per-path recurrence, with no per-node state. U rows depend only on ancestors, so the state
after a kept path is the fold S* = exp(G_leaf) S0 + sum_{j in path} exp(G_leaf - G_j) k_j u_j^T.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specpilot.ops.gated_delta_rule.reference import prepare_qk


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """parents [B,T] (topological, -1 = none) -> inclusive ancestor mask [B,T,T] bool."""
    B, T = parents.shape
    mask = torch.eye(T, dtype=torch.bool, device=parents.device).repeat(B, 1, 1)
    rows = torch.arange(B, device=parents.device)
    for i in range(1, T):
        p = parents[:, i]
        has = p >= 0
        mask[has, i] |= mask[rows[has], p[has]]
    return mask


def tree_gated_delta_rule(q, k, v, g, beta, mask, initial_state, scale=None):
    """q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV]; mask [B,T,T] inclusive ancestor mask; initial_state
    [B,HV,K,V] fp32. Returns (o [B,T,HV,V] in v.dtype, stash) where stash = (k [B,T,H,K] normalised fp32, per
    KEY head, u [B,T,HV,V] fp32, G [B,T,HV] fp32) is what fold_path needs. Writes no state."""
    HV = v.shape[2]
    qn, kn = prepare_qk(q, k, HV, scale)
    qh, kh = qn.transpose(1, 2), kn.transpose(1, 2)  # [B,HV,T,K]
    vh, gh, bh = v.float().transpose(1, 2), g.float().transpose(1, 2), beta.float().transpose(1, 2)  # [B,HV,T,*]
    P = mask[:, None].float()  # [B,1,T,T]
    G = (P @ gh[..., None])[..., 0]  # [B,HV,T]
    D = torch.exp((G[..., :, None] - G[..., None, :]).masked_fill(~mask[:, None], float("-inf")))
    strict = D * (1 - torch.eye(D.shape[-1], device=D.device))
    A = bh[..., None] * strict * (kh @ kh.transpose(-1, -2))
    S0 = initial_state.float()
    rhs = bh[..., None] * (vh - G.exp()[..., None] * (kh @ S0))
    eye = torch.eye(A.shape[-1], device=A.device)
    U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    o = G.exp()[..., None] * (qh @ S0) + ((qh @ kh.transpose(-1, -2)) * D) @ U
    group = HV // k.shape[2]
    stash = (kn[:, :, ::group].contiguous(), U.transpose(1, 2), G.transpose(1, 2))  # k once per key head
    return o.transpose(1, 2).to(v.dtype), stash


def fold_path(initial_state, k, u, G, path: list[int]) -> torch.Tensor:
    """State after keeping `path` (root first) of one request: initial_state [HV,K,V]; k [T,H,K] (per key head);
    u [T,HV,V]; G [T,HV] (tree_gated_delta_rule's stash) -> [HV,K,V] fp32. One [K,L] x [L,V] product per head."""
    idx = torch.tensor(path, device=k.device)
    k = k.repeat_interleave(u.shape[1] // k.shape[1], dim=1)  # value head hv reads key head hv // group
    Gp = G[idx]  # [L,HV]
    leaf = Gp[-1]  # [HV]
    w = torch.exp(leaf[None] - Gp)  # [L,HV]
    kw = (k[idx] * w[..., None]).permute(1, 2, 0)  # [HV,K,L]
    return leaf.exp()[:, None, None] * initial_state.float() + kw @ u[idx].transpose(0, 1)


def tree_causal_conv1d(x, parents, conv_state, weight) -> torch.Tensor:
    """Vectorised tree conv: gather each node's W-1 ancestors (parent walk, continuing into conv_state).

    x [B,T,C]; parents [B,T]; conv_state [B,C,W-1]; weight [C,W] -> y [B,T,C] in x.dtype."""
    B, T, C = x.shape
    W = weight.shape[1]
    # sources index a combined sequence [conv_state (W-1 cols) | x (T cols)]; a node at depth d below the
    # committed state reaches conv column W-1-m once m steps pass the root
    seq = torch.cat([conv_state.float(), x.float().transpose(1, 2)], dim=-1)  # [B,C,W-1+T]
    cur = torch.arange(T, device=x.device).expand(B, T) + (W - 1)  # position of node i in seq
    cols = [cur]
    for _ in range(W - 1):
        node = cur - (W - 1)
        is_node = node >= 0
        par = torch.where(is_node, parents.gather(1, node.clamp(min=0)), torch.full_like(node, -1))
        # above the root the walk continues leftwards through the conv state
        cur = torch.where(is_node & (par >= 0), par + (W - 1), torch.where(is_node, torch.full_like(cur, W - 2),
                                                                            cur - 1))
        cols.append(cur)
    idx = torch.stack(cols[::-1], dim=-1)  # [B,T,W] oldest first
    windows = seq.gather(2, idx.reshape(B, 1, T * W).expand(B, C, T * W)).view(B, C, T, W)
    y = F.silu((windows * weight.float()[:, None, :]).sum(-1))
    return y.transpose(1, 2).to(x.dtype)


def commit_conv(conv_state, x, path: list[int]) -> torch.Tensor:
    """New conv window [C,W-1] of one request: the last W-1 pre-conv inputs along the kept path."""
    width = conv_state.shape[-1]
    idx = torch.tensor(path, device=x.device)
    return torch.cat([conv_state, x[idx].T.to(conv_state.dtype)], dim=-1)[:, -width:]
