"""Plain-torch truth for Gated DeltaNet over a draft tree: every node runs the chain recurrence along its own
root-to-node path from the committed state; the conv window follows parent pointers into the committed conv
state. Slow (each node replays its path) and obviously right. Also the commit of a kept path one request and
one layer at a time (fold_path, commit_conv, commit_paths_ref), which the batched commit is tested against.

Trees come as parent indices [B, T] in topological order (parent < index; -1 for nodes whose parent is the
committed state: the root, and padding).
"""

import torch
import torch.nn.functional as F

from specpilot.ops.gated_delta_rule.reference import prepare_qk


def path_of(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def tree_gated_delta_rule_ref(q, k, v, g, beta, parents, initial_state, scale=None) -> torch.Tensor:
    """q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV] fp32; parents [B,T]; initial_state [B,HV,K,V] fp32.
    Returns o [B,T,HV,V] in v.dtype (no state is written)."""
    B, T, HV, V = v.shape
    qn, kn = prepare_qk(q, k, HV, scale)
    o = torch.empty(B, T, HV, V, dtype=torch.float32, device=v.device)
    for b in range(B):
        par = parents[b].tolist()
        for i in range(T):
            S = initial_state[b].float().clone()
            for t in path_of(par, i):
                S = S * g[b, t].float().exp()[:, None, None]
                u = beta[b, t].float()[:, None] * (v[b, t].float() - torch.einsum("hkv,hk->hv", S, kn[b, t]))
                S = S + kn[b, t][:, :, None] * u[:, None, :]
            o[b, i] = torch.einsum("hkv,hk->hv", S, qn[b, i])
    return o.to(v.dtype)


def tree_causal_conv1d_ref(x, parents, conv_state, weight) -> torch.Tensor:
    """x [B,T,C] pre-conv inputs; parents [B,T]; conv_state [B,C,W-1] (oldest first); weight [C,W].
    y[i] = silu(conv of the W inputs ending at node i along its path, continued into conv_state)."""
    B, T, C = x.shape
    W = weight.shape[1]
    y = torch.empty(B, T, C, dtype=torch.float32, device=x.device)
    for b in range(B):
        par = parents[b].tolist()
        for i in range(T):
            seq = torch.cat([conv_state[b].float(), x[b, path_of(par, i)].float().T], dim=-1)  # [C, W-1+len]
            y[b, i] = F.silu((seq[:, -W:] * weight.float()).sum(-1))
    return y.to(x.dtype)


def commit_path_ref(initial_state, conv_state, q, k, v, g, beta, x, path: list[int], scale=None):
    """The state after the kept path (one request): the recurrence replayed over the path's nodes, and the
    last W-1 pre-conv inputs along it. Shapes as above without B; returns (state [HV,K,V] fp32, conv [C,W-1])."""
    HV = v.shape[-2]
    _, kn = prepare_qk(q[None], k[None], HV, scale)
    S = initial_state.float().clone()
    for t in path:
        S = S * g[t].float().exp()[:, None, None]
        u = beta[t].float()[:, None] * (v[t].float() - torch.einsum("hkv,hk->hv", S, kn[0, t]))
        S = S + kn[0, t][:, :, None] * u[:, None, :]
    width = conv_state.shape[-1]
    window = torch.cat([conv_state, x[path].T.to(conv_state.dtype)], dim=-1)[:, -width:]
    return S, window


def fold_path(initial_state, k, u, G, path: list[int]) -> torch.Tensor:
    """State after keeping `path` (root first) of one request: initial_state [HV,K,V]; k [T,H,K] (per key head);
    u [T,HV,V]; G [T,HV] (tree_gated_delta_rule's stash) -> [HV,K,V] fp32. One [K,L] x [L,V] product per head:
    S* = exp(G_leaf) S0 + sum_{j in path} exp(G_leaf - G_j) k_j u_j^T."""
    idx = torch.tensor(path, dtype=torch.long, device=k.device)
    k = k.repeat_interleave(u.shape[1] // k.shape[1], dim=1)  # value head hv reads key head hv // group
    Gp = G[idx]  # [L,HV]
    leaf = Gp[-1] if path else torch.zeros_like(G[0])  # [HV]
    w = torch.exp(leaf[None] - Gp)  # [L,HV]
    kw = (k[idx] * w[..., None]).permute(1, 2, 0)  # [HV,K,L]
    return leaf.exp()[:, None, None] * initial_state.float() + kw @ u[idx].transpose(0, 1)


def commit_conv(conv_state, x, path: list[int]) -> torch.Tensor:
    """New conv window [C,W-1] of one request: the last W-1 pre-conv inputs along the kept path."""
    idx = torch.tensor(path, dtype=torch.long, device=x.device)
    window = torch.cat([conv_state, x[idx].T.to(conv_state.dtype)], dim=-1)
    return window[:, window.shape[-1] - conv_state.shape[-1]:]


def commit_paths_ref(ssm, conv, x, k, u, G, rows: list[int], slots: list[int], paths: list[list[int]]) -> None:
    """Commit kept paths in place, one layer and one request at a time. ssm [L,N,HV,K,V] fp32 and conv [L,N,C,W-1]
    are the state pools; x [L,R,T,C], k [L,R,T,H,K], u [L,R,T,HV,V], G [L,R,T,HV] the stacked stash of a verify
    batch of R rows; request i is stash row rows[i], state slot slots[i] and keeps paths[i] (root first)."""
    for layer in range(ssm.shape[0]):
        for row, slot, path in zip(rows, slots, paths):
            ssm[layer, slot] = fold_path(ssm[layer, slot], k[layer, row], u[layer, row], G[layer, row], path)
            conv[layer, slot] = commit_conv(conv[layer, slot], x[layer, row], path)
