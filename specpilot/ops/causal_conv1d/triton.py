"""Triton causal conv1d (+ SiLU) update for decode and short verify runs, reading and writing each request's
conv state in place in a slot pool."""

import torch
import triton
import triton.language as tl


@triton.jit
def _load_window(
    x_row, state_row, p, valid, offs_c, mask_c,
    sx_t, sx_c, ss_c, ss_w,
    STATE_LEN: tl.constexpr,
):
    """Inputs at positions p [BW] of the sequence [state | x] (p < 0 lives in the state) -> [BLOCK_C, BW] fp32."""
    from_state = p < 0
    col = tl.where(from_state, p + STATE_LEN, 0)
    t = tl.where(from_state, 0, p)
    m = mask_c[:, None] & valid[None, :]
    old = tl.load(state_row + offs_c[:, None] * ss_c + col[None, :] * ss_w, mask=m & from_state[None, :], other=0.0)
    new = tl.load(x_row + t[None, :] * sx_t + offs_c[:, None] * sx_c, mask=m & ~from_state[None, :], other=0.0)
    return old.to(tl.float32) + new.to(tl.float32)


@triton.jit
def _causal_conv1d_update_kernel(
    x_ptr, pool_ptr, idx_ptr, w_ptr, y_ptr,
    T, C,
    sx_b, sx_t, sx_c,
    ss_n, ss_c, ss_w,
    sw_c, sw_w,
    W: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program (b, c-block): loops over the T new tokens of request b, then writes its last W-1 inputs back."""
    i_b = tl.program_id(0).to(tl.int64)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    offs_w = tl.arange(0, BLOCK_W)

    slot = tl.load(idx_ptr + i_b).to(tl.int64)
    x_row = x_ptr + i_b * sx_b
    state_row = pool_ptr + slot * ss_n
    y_row = y_ptr + i_b * T * C
    w_mask = mask_c[:, None] & (offs_w < W)[None, :]
    w = tl.load(w_ptr + offs_c[:, None] * sw_c + offs_w[None, :] * sw_w, mask=w_mask, other=0.0).to(tl.float32)

    for t in range(T):
        win = _load_window(x_row, state_row, t - (W - 1) + offs_w, offs_w < W, offs_c, mask_c,
                           sx_t, sx_c, ss_c, ss_w, W - 1)
        acc = tl.sum(win * w, axis=1)
        y = acc / (1.0 + tl.exp(-acc))
        tl.store(y_row + t * C + offs_c, y.to(y_ptr.dtype.element_ty), mask=mask_c)

    keep = offs_w < W - 1
    new_state = _load_window(x_row, state_row, T - (W - 1) + offs_w, keep, offs_c, mask_c,
                             sx_t, sx_c, ss_c, ss_w, W - 1)
    # Other threads of this program may still be reading the old state columns that these stores overwrite.
    tl.debug_barrier()
    tl.store(state_row + offs_c[:, None] * ss_c + offs_w[None, :] * ss_w,
             new_state.to(pool_ptr.dtype.element_ty), mask=mask_c[:, None] & keep[None, :])


MAX_WIDTH = 8  # the window a program holds per channel tile


def supports(weight: torch.Tensor) -> bool:
    """The kernel takes conv widths 2..MAX_WIDTH (a width of 1 keeps no state columns to update)."""
    return 2 <= weight.shape[1] <= MAX_WIDTH


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state_pool: torch.Tensor,
    state_idx: torch.Tensor,
    weight: torch.Tensor,
    *,
    block_c: int = 256,
    num_warps: int = 4,
) -> torch.Tensor:
    """Same contract as reference.causal_conv1d_update_ref.

    x [B,T,C]; conv_state_pool [N,C,W-1] updated in place; state_idx [B] int (distinct slots); weight [C,W],
    2 <= W <= MAX_WIDTH.
    Returns y [B,T,C] in x.dtype.
    """
    B, T, C = x.shape
    W = weight.shape[1]
    assert supports(weight), f"conv width {W} must be in [2, {MAX_WIDTH}] (see supports)"
    assert weight.shape == (C, W), f"weight must be [C,W]={C, W}"
    assert conv_state_pool.shape[1:] == (C, W - 1), f"conv_state_pool must be [N,C,W-1]=[N,{C},{W - 1}]"
    assert state_idx.shape == (B,), "state_idx must be [B]"
    state_idx = state_idx.contiguous()  # the kernel reads slot b at offset b
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    grid = (B, triton.cdiv(C, block_c))
    _causal_conv1d_update_kernel[grid](
        x, conv_state_pool, state_idx, weight, y,
        T, C,
        x.stride(0), x.stride(1), x.stride(2),
        conv_state_pool.stride(0), conv_state_pool.stride(1), conv_state_pool.stride(2),
        weight.stride(0), weight.stride(1),
        W=W, BLOCK_W=triton.next_power_of_2(W), BLOCK_C=block_c,
        num_warps=num_warps,
    )
    return y
