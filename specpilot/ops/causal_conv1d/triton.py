"""Triton causal conv1d (+ SiLU): the update for decode and short verify runs, reading and writing each request's
conv state in place in a slot pool, and the prefill of long blocks (tiles of tokens x channels in parallel)."""

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


@triton.jit
def _causal_conv1d_prefill_kernel(
    x_ptr, s_ptr, w_ptr, y_ptr,
    T, C,
    sx_b, sx_t, sx_c,
    ss_b, ss_c, ss_w,
    sw_c, sw_w,
    W: tl.constexpr,
    HAS_STATE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program (b, t-block, c-block): y[b, t, c] = silu(sum_j w[c, j] z[c, t + j]) over z = [state | x^T], each
    tap a [BLOCK_T, BLOCK_C] tile of x (its rows before 0 from the state), accumulated in fp32 in tap order."""
    i_b = tl.program_id(0).to(tl.int64)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_t, mask_c = offs_t < T, offs_c < C
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(W):
        p = offs_t + (j - (W - 1))  # the tap's input position; p < 0 is state column p + W - 1
        m = mask_t[:, None] & mask_c[None, :]
        val = tl.load(x_ptr + i_b * sx_b + tl.maximum(p, 0)[:, None] * sx_t + offs_c[None, :] * sx_c,
                      mask=m & (p >= 0)[:, None], other=0.0).to(tl.float32)
        if HAS_STATE:
            col = tl.maximum(p + (W - 1), 0)
            val += tl.load(s_ptr + i_b * ss_b + offs_c[None, :] * ss_c + col[:, None] * ss_w,
                           mask=m & (p < 0)[:, None], other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs_c * sw_c + j * sw_w, mask=mask_c, other=0.0).to(tl.float32)
        acc += val * w[None, :]
    y = acc / (1.0 + tl.exp(-acc))
    tl.store(y_ptr + i_b * T * C + offs_t[:, None] * C + offs_c[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mask_t[:, None] & mask_c[None, :])


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


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    block_t: int = 64,
    block_c: int = 128,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as reference.causal_conv1d_prefill_ref: x [B,T,C], weight [C,W] (2 <= W <= MAX_WIDTH),
    initial_state [B,C,W-1] or None -> (y [B,T,C], final_state [B,C,W-1]), both in x.dtype."""
    B, T, C = x.shape
    W = weight.shape[1]
    assert supports(weight), f"conv width {W} must be in [2, {MAX_WIDTH}] (see supports)"
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    state = initial_state if initial_state is not None else x.new_zeros(1, 1, 1)
    grid = (B, triton.cdiv(T, block_t), triton.cdiv(C, block_c))
    _causal_conv1d_prefill_kernel[grid](
        x, state, weight, y,
        T, C,
        x.stride(0), x.stride(1), x.stride(2),
        state.stride(0), state.stride(1), state.stride(2),
        weight.stride(0), weight.stride(1),
        W=W, HAS_STATE=initial_state is not None, BLOCK_T=block_t, BLOCK_C=block_c,
        num_warps=num_warps,
    )
    return y, _final_state(x, initial_state, W)


def _final_state(x: torch.Tensor, initial_state: torch.Tensor | None, W: int) -> torch.Tensor:
    """The last W-1 inputs of [state | x^T] (zeros for a missing state), in x.dtype: a slice, no kernel."""
    B, T, C = x.shape
    tail = x[:, max(T - (W - 1), 0):].transpose(1, 2)
    if T >= W - 1:
        return tail.to(x.dtype).contiguous()
    state = initial_state if initial_state is not None else x.new_zeros(B, C, W - 1)
    return torch.cat([state[..., T:].to(x.dtype), tail.to(x.dtype)], dim=-1)
