"""Tree attention over a slotted KV cache: the committed prefix read once per block of query rows, then the block.

One program per (block of query rows, prefix chunk, request * kv head). Its query tile holds all G = H // KVH
query heads of one kv head for TOK = BLOCK_M // G block tokens, so each K/V tile of the prefix is read once
for G * TOK query rows (a masked SDPA over [prefix | block] reads it once per query). Online softmax in fp32.
The last chunk's program then gathers the block's own K/V rows by cache_loc and applies block_mask.

With num_splits > 1 (few programs for the SMs: small batch, short block) the prefix is split across programs
that write fp32 partials and their log2-sum-exp, and combine_kernel (ops/split_softmax.py) merges them, as in decode_attention.
The grid depends only on shapes, so the op is CUDA-graph safe. A head dim that is not a power of two is padded
to one (BLOCK_D, masked); the combine then runs on padded partials (supports: what the kernel takes).
"""

import math

import torch
import triton
import triton.language as tl

from specpilot.ops.decode_attention.triton import head_mask
from specpilot.ops.dispatch import fits_tile, tile_width
from specpilot.ops.split_softmax import combine_kernel, dot, interpreter_lacks_bf16_dot, sm_count

_LOG2E = math.log2(math.e)  # kernels work in base 2: exp2 is the native instruction
_MAX_SPLITS = 64


@triton.jit
def _attend_tile(q, k, v, visible, m_i, l_i, acc, scale_log2, UPCAST_DOT: tl.constexpr):
    """One online-softmax step of the [BLOCK_M, D] query tile over a [BLOCK_N, D] K/V tile; visible [M, N]."""
    s = dot(q, tl.trans(k), UPCAST_DOT) * scale_log2  # [BLOCK_M, BLOCK_N], log2 units
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row that has seen nothing yet (block tiles past its ancestors, padding rows) keeps m = -inf; shifting
    # by 0 instead makes every exp2 exp2(-inf) = 0 rather than exp2(-inf - -inf) = NaN.
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_shift)
    p = tl.exp2(s - m_shift[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, UPCAST_DOT)
    return m_new, l_i, acc


@triton.jit
def _tree_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    slots_ptr,
    prefix_len_ptr,
    loc_ptr,
    mask_ptr,
    o_ptr,
    part_o_ptr,
    part_lse_ptr,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_lb,
    stride_lt,
    stride_mb,
    stride_mi,
    stride_mj,
    scale_log2,
    T,
    cache_len,
    num_splits,
    H: tl.constexpr,
    KVH: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TOK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """Query rows of block tokens [tb*TOK, tb*TOK+TOK) x heads [kvh*G, kvh*G+G) over prefix chunk `split`
    (and, in the last chunk's program, over the block)."""
    tb = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2) // KVH
    kvh = tl.program_id(2) % KVH

    # Row r of the tile is block token tb*TOK + r // G, query head kvh*G + r % G; rows past TOK*G are padding.
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    t = tb * TOK + offs_m // G
    h = kvh * G + offs_m % G
    row_ok = (offs_m < TOK * G) & (t < T)
    q_rows = b.to(tl.int64) * stride_qb + t.to(tl.int64) * stride_qt + h.to(tl.int64) * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=head_mask(row_ok, offs_d, D, BLOCK_D), other=0.0)

    slot = tl.load(slots_ptr + b).to(tl.int64)
    kv_base = (slot * KVH + kvh) * cache_len * D
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Prefix: every row sees positions 0..prefix_len-1. Chunks are sized from prefix_len, not S, so a short
    # prefix in a long cache still uses every split; a chunk starting at or past prefix_len is empty.
    n_prefix = tl.load(prefix_len_ptr + b).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(n_prefix, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n_prefix)
    for start in range(lo, hi, BLOCK_N):
        pos = start + offs_n
        n_ok = pos < hi
        kv_offs = kv_base + pos.to(tl.int64)[:, None] * D + offs_d[None, :]
        # Masked loads: positions past prefix_len may hold NaN and must never reach an FMA.
        k = tl.load(k_ptr + kv_offs, mask=head_mask(n_ok, offs_d, D, BLOCK_D), other=0.0)
        v = tl.load(v_ptr + kv_offs, mask=head_mask(n_ok, offs_d, D, BLOCK_D), other=0.0)
        m_i, l_i, acc = _attend_tile(q, k, v, n_ok[None, :], m_i, l_i, acc, scale_log2, UPCAST_DOT)

    # Block: token j's K/V sits at cache_loc[b, j]. Causal rows never see past the tile's last token; an
    # explicit mask may point anywhere in the block. Only the last chunk's program does this part.
    if HAS_MASK:
        j_hi = T
    else:
        j_hi = tl.minimum(T, tb * TOK + TOK)
    j_hi = tl.where(split == num_splits - 1, j_hi, 0)
    for j0 in range(0, j_hi, BLOCK_N):
        j = j0 + offs_n
        j_ok = j < j_hi
        loc = tl.load(loc_ptr + b.to(tl.int64) * stride_lb + j.to(tl.int64) * stride_lt, mask=j_ok, other=0)
        kv_offs = kv_base + loc.to(tl.int64)[:, None] * D + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=head_mask(j_ok, offs_d, D, BLOCK_D), other=0.0)
        v = tl.load(v_ptr + kv_offs, mask=head_mask(j_ok, offs_d, D, BLOCK_D), other=0.0)
        if HAS_MASK:
            m_rows = b.to(tl.int64) * stride_mb + t.to(tl.int64) * stride_mi  # [BLOCK_M]
            m_offs = m_rows[:, None] + j.to(tl.int64)[None, :] * stride_mj
            visible = tl.load(mask_ptr + m_offs, mask=row_ok[:, None] & j_ok[None, :], other=0) != 0
        else:
            visible = (j[None, :] <= t[:, None]) & j_ok[None, :]
        m_i, l_i, acc = _attend_tile(q, k, v, visible, m_i, l_i, acc, scale_log2, UPCAST_DOT)

    # Every valid row sees itself, so l_i > 0 there when the block was done here; l_i = 0 only for padding rows
    # (never stored) and, with splits, empty prefix chunks: those write lse = -inf and zeros, weighted 0.
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    o_rows = (b.to(tl.int64) * T + t) * H + h  # [BLOCK_M] flat (request, token, head) index
    if SPLIT:
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        # partials are BLOCK_D wide (padding columns hold zeros): the combine runs on the power-of-two width
        part_rows = o_rows * num_splits + split
        tl.store(part_o_ptr + part_rows[:, None] * BLOCK_D + offs_d[None, :], out, mask=row_ok[:, None])
        tl.store(part_lse_ptr + part_rows, lse, mask=row_ok)
    else:
        tl.store(o_ptr + o_rows[:, None] * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=head_mask(row_ok, offs_d, D, BLOCK_D))


def default_num_splits(row_programs: int, cache_len: int, block_n: int, sm_count: int) -> int:
    """Prefix chunks per row program: enough that row_programs * splits >= 2 waves of SMs, at most one per
    BLOCK_N tile of S. row_programs = B * KVH * ceil(T / TOK). Shapes only, so the grid is fixed for capture.
    """
    want = triton.cdiv(2 * sm_count, row_programs)
    return max(1, min(want, triton.cdiv(cache_len, block_n), _MAX_SPLITS))


def supports(q: torch.Tensor) -> bool:
    """The kernel takes a head dim of up to MAX_TILE (padded to a power of two) in bf16, fp16 or fp32."""
    return fits_tile(q.shape[-1]) and q.dtype in (torch.bfloat16, torch.float16, torch.float32)


def _check_inputs(q, k_cache, v_cache, slots, prefix_len, cache_loc, block_mask) -> None:
    assert q.dim() == 4 and k_cache.dim() == 4, f"q [B, T, H, D], cache [N, KVH, S, D]; got {q.shape}, {k_cache.shape}"
    assert k_cache.shape == v_cache.shape, f"k_cache {k_cache.shape} != v_cache {v_cache.shape}"
    B, T, H, D = q.shape
    KVH = k_cache.shape[1]
    assert k_cache.shape[3] == D, f"head dim: q {D} vs cache {k_cache.shape[3]}"
    assert H % KVH == 0, f"H={H} not a multiple of KVH={KVH}"
    assert supports(q), f"head dim {D} ({q.dtype}): the kernel does not take it (see supports)"
    assert k_cache.dtype == v_cache.dtype == q.dtype, f"dtypes differ: {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous"
    for name, t, shape in (("slots", slots, (B,)), ("prefix_len", prefix_len, (B,)), ("cache_loc", cache_loc, (B, T))):
        want = f"{name}: want {list(shape)} int32/int64, got {tuple(t.shape)} {t.dtype}"
        assert t.shape == shape and t.dtype in (torch.int32, torch.int64), want
        assert t.device == q.device, f"{name} on {t.device}, q on {q.device}"
    if block_mask is not None:
        want = f"block_mask: want [{B}, {T}, {T}] bool, got {tuple(block_mask.shape)} {block_mask.dtype}"
        assert block_mask.shape == (B, T, T) and block_mask.dtype == torch.bool, want
        assert block_mask.device == q.device, f"block_mask on {block_mask.device}, q on {q.device}"


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    prefix_len: torch.Tensor,
    cache_loc: torch.Tensor,
    block_mask: torch.Tensor | None,
    scale: float,
    num_splits: int | None = None,
    block_m: int = 64,
    block_n: int | None = None,
    split_block: int = 16,
    num_warps: int | None = None,
    num_stages: int = 2,
) -> torch.Tensor:
    """q [B, T, H, D] (last dim dense); k_cache, v_cache [N, KVH, S, D]; slots, prefix_len [B] int; cache_loc [B, T]
    int; block_mask [B, T, T] bool or None (causal) -> o [B, T, H, D] contiguous, q.dtype.

    block_m: query rows per program (G heads x block_m // G tokens); raised to next_pow2(G) if smaller.
    num_splits: prefix chunks per row program; default from shapes (default_num_splits).
    block_n: positions per K/V tile; default 64 for 16-bit caches, 32 for fp32.
    The defaults are untuned guesses (no GPU measurement yet).
    """
    _check_inputs(q, k_cache, v_cache, slots, prefix_len, cache_loc, block_mask)
    slots, prefix_len = slots.contiguous(), prefix_len.contiguous()  # the kernel reads them at offset b
    if q.stride(-1) != 1:
        q = q.contiguous()
    B, T, H, D = q.shape
    KVH, S = k_cache.shape[1], k_cache.shape[2]
    G = H // KVH
    block_m = max(block_m, triton.next_power_of_2(G))
    assert block_m >= 16 and block_m & (block_m - 1) == 0, f"block_m={block_m} must be a power of two >= 16"
    if block_n is None:
        # fp32 dots run on FMA units (ieee), whose register cost makes big tiles spill.
        block_n = 64 if q.element_size() == 2 else 32
    assert block_n >= 16 and block_n & (block_n - 1) == 0, f"block_n={block_n} must be a power of two >= 16"
    if num_warps is None:
        num_warps = 4 if D <= 128 else 8
    tok = block_m // G  # block tokens per program
    num_t_blocks = triton.cdiv(T, tok)
    if num_splits is None:
        num_splits = default_num_splits(B * KVH * num_t_blocks, S, block_n, sm_count(q.device))
    assert num_splits >= 1, f"num_splits={num_splits}"

    o = torch.empty(B, T, H, D, device=q.device, dtype=q.dtype)
    block_d = tile_width(D)
    if num_splits > 1:
        part_o = torch.empty(B, T, H, num_splits, block_d, device=q.device, dtype=torch.float32)
        part_lse = torch.empty(B, T, H, num_splits, device=q.device, dtype=torch.float32)
    else:
        part_o = part_lse = o  # unused (SPLIT=False)
    # A bool tensor is read as bytes (same size: a free view, any strides); None passes a dummy pointer.
    mask = block_mask.view(torch.uint8) if block_mask is not None else cache_loc
    mask_strides = mask.stride() if block_mask is not None else (0, 0, 0)
    _tree_kernel[(num_t_blocks, num_splits, B * KVH)](
        q, k_cache, v_cache, slots, prefix_len, cache_loc, mask, o, part_o, part_lse,
        q.stride(0), q.stride(1), q.stride(2), cache_loc.stride(0), cache_loc.stride(1), *mask_strides,
        scale * _LOG2E, T, S, num_splits,
        H=H, KVH=KVH, G=G, D=D, BLOCK_D=block_d, TOK=tok, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_MASK=block_mask is not None, SPLIT=num_splits > 1, UPCAST_DOT=interpreter_lacks_bf16_dot(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if num_splits > 1:
        # the combine's rows are block_d wide: a padded head dim combines into a padded buffer, then drops the padding
        wide = o if block_d == D else torch.empty(B, T, H, block_d, device=q.device, dtype=q.dtype)
        combine_kernel[(B * T, H)](part_o, part_lse, wide, num_splits, H, D=block_d, BLOCK_S=split_block,
                                   num_warps=num_warps)
        if wide is not o:
            o.copy_(wide[..., :D])
    return o
