"""Gated DeltaNet over a draft tree in one shot (the tree-masked WY form), and the batched commit of kept paths.

Per request and value head, with P the inclusive ancestor mask and G = P g the path-summed log-decay:
    D[i,j] = exp(G_i - G_j) for j ancestor-or-self of i, else 0
    (I + A) U = beta * (V - exp(G) * (K S0)),   A[i,j] = beta_i D[i,j] (k_i . k_j) for proper ancestors j
    O = exp(G) * (Q S0) + ((Q K^T) * D) U
(I + A) only links nodes along ancestor chains, so on each root-to-leaf path it is that chain's own system: the
result is exactly the per-path recurrence, with no per-node state. U rows depend only on ancestors, so the state
after a kept path is the fold S* = exp(G_leaf) S0 + sum_{j in path} exp(G_leaf - G_j) k_j u_j^T.

commit_paths folds every layer and every request of a verify batch at once (ragged paths padded to the longest
and masked), and takes each path's last W-1 inputs as its conv window: a fixed number of ops per step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specpilot.ops.gated_delta_rule.reference import prepare_qk
from specpilot.ops.path_index import PathIndex


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


def tree_gated_delta_rule(q, k, v, g, beta, mask, initial_state, scale=None, out=None, state_slots=None):
    """q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV]; mask [B,T,T] inclusive ancestor mask; initial_state
    [B,HV,K,V] fp32, or with state_slots [B] a pool [N,HV,K,V] that request b reads at slot state_slots[b]. Returns (o [B,T,HV,V] in v.dtype, stash) where stash = (k [B,T,H,K] normalised fp32, per
    KEY head, u [B,T,HV,V] fp32, G [B,T,HV] fp32) is what the fold needs, written into `out` if given. Writes no
    state."""
    if state_slots is not None:
        initial_state = initial_state[state_slots]
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
    if out is not None:
        for dst, src in zip(out, stash):
            dst.copy_(src)
        stash = tuple(out)
    return o.transpose(1, 2).to(v.dtype), stash


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
    # dense [B,T,C]: the heads split from it feed kernels that need a dense head dim
    return y.transpose(1, 2).to(x.dtype).contiguous()


def commit_paths(ssm, conv, x, k, u, G, index: PathIndex) -> None:
    """Commit the kept paths of every layer and request in place. ssm [L,N,HV,K,V] fp32 and conv [L,N,C,W-1] are
    the state pools; x [L,R,T,C], k [L,R,T,H,K], u [L,R,T,HV,V], G [L,R,T,HV] the stacked verify stash."""
    _fold_paths(ssm, k, u, G, index)
    _commit_conv_windows(conv, x, index)


def _fold_paths(ssm, k, u, G, index: PathIndex) -> None:
    rows, slots, lens, nodes = index.rows[:, None], index.slots, index.lens, index.nodes
    B, P = nodes.shape
    valid = torch.arange(P, device=nodes.device) < lens[:, None]  # [B,P]
    Gp = G[:, rows, nodes]  # [L,B,P,HV]
    last = (lens - 1).clamp(min=0)
    leaf = torch.where(lens[:, None] > 0, Gp[:, torch.arange(B, device=nodes.device), last], 0.0)  # [L,B,HV]
    # padding repeats a real node, so its terms are finite: the mask alone keeps them out of the sum
    w = torch.where(valid[None, :, :, None], torch.exp(leaf[:, :, None] - Gp), 0.0)  # [L,B,P,HV]
    kp = k[:, rows, nodes].repeat_interleave(u.shape[-2] // k.shape[-2], dim=-2)  # [L,B,P,HV,K]
    added = torch.einsum("lbphk,lbphv->lbhkv", kp * w[..., None], u[:, rows, nodes])
    ssm[:, slots] = leaf.exp()[..., None, None] * ssm[:, slots] + added


def _commit_conv_windows(conv, x, index: PathIndex) -> None:
    width = conv.shape[-1]
    if width == 0:
        return
    rows, slots, lens, nodes = index.rows[:, None], index.slots, index.lens, index.nodes
    L, B, C = conv.shape[0], nodes.shape[0], conv.shape[2]
    # window column c is position len + c of [old window | path inputs]
    pos = lens[:, None] + torch.arange(width, device=nodes.device)  # [B,W-1]
    from_x = pos >= width
    src = nodes.gather(1, (pos - width).clamp(0, nodes.shape[1] - 1))  # [B,W-1]
    new_x = x[:, rows, src].transpose(-1, -2).to(conv.dtype)  # [L,B,C,W-1]
    old = conv[:, slots].gather(-1, pos.clamp(max=width - 1)[None, :, None].expand(L, B, C, width))
    conv[:, slots] = torch.where(from_x[None, :, None], new_x, old)
