"""Plain-torch truth for the short depthwise causal conv (+ SiLU) of Gated DeltaNet layers: prefill from an
optional state, and the pooled-state update that the Triton kernel implements.

The conv state of a request is its last W-1 pre-conv inputs, oldest first: [C, W-1]."""

import torch
import torch.nn.functional as F


def causal_conv1d_prefill_ref(
    x: torch.Tensor, weight: torch.Tensor, initial_state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """y = silu(depthwise causal conv of [initial_state | x]), computed in fp32.

    x [B,T,C]; weight [C,W]; initial_state [B,C,W-1] or None (zeros).
    Returns y [B,T,C] in x.dtype and final_state [B,C,W-1] in x.dtype (the last W-1 inputs, even when T < W-1).
    """
    B, T, C = x.shape
    W = weight.shape[1]
    if initial_state is None:
        initial_state = torch.zeros(B, C, W - 1, dtype=x.dtype, device=x.device)
    seq = torch.cat([initial_state.float(), x.float().transpose(1, 2)], dim=-1)  # [B,C,W-1+T]
    windows = seq.unfold(-1, W, 1)  # [B,C,T,W]
    y = F.silu((windows * weight.float()[:, None, :]).sum(-1))
    final_state = seq[..., seq.shape[-1] - (W - 1) :]
    return y.transpose(1, 2).to(x.dtype), final_state.to(x.dtype)


def causal_conv1d_update_ref(
    x: torch.Tensor, conv_state_pool: torch.Tensor, state_idx: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """Prefill math starting from conv_state_pool[state_idx[i]]; the new state is written back in place.

    x [B,T,C] (T >= 1); conv_state_pool [N,C,W-1]; state_idx [B] int (distinct slots); weight [C,W].
    Returns y [B,T,C] in x.dtype.
    """
    idx = state_idx.long()
    y, final_state = causal_conv1d_prefill_ref(x, weight, conv_state_pool[idx])
    conv_state_pool[idx] = final_state.to(conv_state_pool.dtype)
    return y
