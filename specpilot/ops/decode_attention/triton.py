"""Flash-decoding batch decode attention over a slotted KV cache (split-K partials, then an LSE combine).

Two kernels: _split_kernel splits each request's sequence into num_splits chunks, one program per
(request, kv head, chunk), and writes fp32 partial outputs plus their log2-sum-exp; combine_kernel
(ops/split_softmax.py) merges the chunks per (request, query head). With one split the split kernel writes the
output itself and there is no combine launch (short contexts, where the step is a chain of short kernels).
The grid depends only on shapes, so the op is CUDA-graph safe. A head dim that is not a power of two is padded
to one (BLOCK_D, masked); the combine then runs on padded partials (supports: what the kernels take).
"""

import math

import torch
import triton
import triton.language as tl

from specpilot.ops.pdl import launch_kwargs, usable
from specpilot.ops.dispatch import fits_tile, tile_width
from specpilot.ops.pdl_wait import wait_for_inputs
from specpilot.ops.split_softmax import combine_kernel, dot, interpreter_lacks_bf16_dot, sm_count

_LOG2E = math.log2(math.e)  # kernels work in base 2: exp2 is the native instruction
_MAX_SPLITS = 128


@triton.jit
def head_mask(ok, offs_d, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """The mask of rows `ok` over a head dim D padded to BLOCK_D columns ([rows, BLOCK_D]); the rows alone
    ([rows, 1]) when D needs no padding, so that a power-of-two head dim compiles as it does unpadded. Shared with
    ops/tree_attention."""
    if D == BLOCK_D:
        m = ok[:, None]
    else:
        m = ok[:, None] & (offs_d < D)[None, :]
    return m


@triton.jit
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    slot_ptr,
    kv_len_ptr,
    part_o_ptr,
    part_lse_ptr,
    scale_log2,
    cache_len,
    num_splits,
    H: tl.constexpr,
    KVH: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DIRECT: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """One program: query heads [kvh*G, kvh*G+G) of request b over chunk `split` of its live positions."""
    wait_for_inputs(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    n_live = tl.load(kv_len_ptr + b).to(tl.int32)
    # Chunks are sized from kv_len, not S, so short contexts in a long cache still use every split.
    chunk = tl.cdiv(tl.cdiv(n_live, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n_live)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    g_mask = offs_g < G
    rows = b.to(tl.int64) * H + kvh * G + offs_g  # [BLOCK_G] flat (request, head) index
    q = tl.load(q_ptr + rows[:, None] * D + offs_d[None, :], mask=head_mask(g_mask, offs_d, D, BLOCK_D), other=0.0)

    slot = tl.load(slot_ptr + b).to(tl.int64)
    kv_base = (slot * KVH + kvh) * cache_len * D

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + offs_n
        n_mask = pos < hi
        kv_offs = kv_base + pos.to(tl.int64)[:, None] * D + offs_d[None, :]
        # Masked loads: positions past kv_len may hold NaN and must never reach an FMA.
        k = tl.load(k_ptr + kv_offs, mask=head_mask(n_mask, offs_d, D, BLOCK_D), other=0.0)
        v = tl.load(v_ptr + kv_offs, mask=head_mask(n_mask, offs_d, D, BLOCK_D), other=0.0)
        s = dot(q, tl.trans(k), UPCAST_DOT) * scale_log2  # [BLOCK_G, BLOCK_N], log2 units
        s = tl.where(n_mask[None, :], s, float("-inf"))
        # Every tile has >= 1 live position, so m_new is finite and exp2 never sees -inf - -inf.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, UPCAST_DOT)
        m_i = m_new

    if DIRECT:  # a single split: the chunk is the whole sequence (kv_len >= 1, so l_i > 0)
        tl.store(part_o_ptr + rows[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(part_o_ptr.dtype.element_ty),
                 mask=head_mask(g_mask, offs_d, D, BLOCK_D))
        return
    # An empty chunk (lo >= kv_len) leaves l_i = 0: write lse = -inf and zeros so the combine weights it 0.
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    # partials are BLOCK_D wide (padding columns hold zeros): the combine runs on the power-of-two width
    part_rows = rows * num_splits + split
    tl.store(part_o_ptr + part_rows[:, None] * BLOCK_D + offs_d[None, :], out, mask=g_mask[:, None])
    tl.store(part_lse_ptr + part_rows, lse, mask=g_mask)


def default_num_splits(batch: int, kv_heads: int, cache_len: int, block_n: int, sm_count: int) -> int:
    """Enough splits that batch * kv_heads * splits >= 2 waves of SMs, at most one per BLOCK_N tile of S.

    Shapes only (never kv_len values), so the grid is fixed for CUDA-graph capture.
    """
    want = triton.cdiv(2 * sm_count, batch * kv_heads)
    return max(1, min(want, triton.cdiv(cache_len, block_n), _MAX_SPLITS))


def supports(q: torch.Tensor) -> bool:
    """The kernels take a head dim of up to MAX_TILE (padded to a power of two) in bf16, fp16 or fp32."""
    return fits_tile(q.shape[-1]) and q.dtype in (torch.bfloat16, torch.float16, torch.float32)


def _check_inputs(q, k_cache, v_cache, slot, kv_len) -> None:
    assert q.dim() == 3 and k_cache.dim() == 4, f"q [B, H, D], cache [N, KVH, S, D]; got {q.shape}, {k_cache.shape}"
    assert k_cache.shape == v_cache.shape, f"k_cache {k_cache.shape} != v_cache {v_cache.shape}"
    B, H, D = q.shape
    KVH = k_cache.shape[1]
    assert k_cache.shape[3] == D, f"head dim: q {D} vs cache {k_cache.shape[3]}"
    assert H % KVH == 0, f"H={H} not a multiple of KVH={KVH}"
    assert supports(q), f"head dim {D} ({q.dtype}): the kernel does not take it (see supports)"
    assert k_cache.dtype == v_cache.dtype == q.dtype, f"dtypes differ: {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
    assert q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous(), "q and caches must be contiguous"
    for name, t in (("slot", slot), ("kv_len", kv_len)):
        want = f"{name}: want [B] int32/int64, got {tuple(t.shape)} {t.dtype}"
        assert t.shape == (B,) and t.dtype in (torch.int32, torch.int64), want
        assert t.device == q.device, f"{name} on {t.device}, q on {q.device}"


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot: torch.Tensor,
    kv_len: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    block_n: int | None = None,
    split_block: int = 16,
    num_warps: int = 4,
    num_stages: int = 3,
    pdl: bool = False,
) -> torch.Tensor:
    """q [B, H, D]; k_cache, v_cache [N, KVH, S, D]; slot, kv_len [B] int (kv_len >= 1) -> o [B, H, D] in q.dtype.

    num_splits: sequence chunks per (request, kv head); default from shapes (default_num_splits).
    block_n: positions per K/V tile; default 64 for 16-bit caches, 32 for fp32.
    num_stages: software-pipelining stages of the K/V tile loads.
    pdl: launch with programmatic dependent launch (ops/pdl.py).
    """
    _check_inputs(q, k_cache, v_cache, slot, kv_len)
    slot, kv_len = slot.contiguous(), kv_len.contiguous()  # the kernel reads them at offset b
    B, H, D = q.shape
    KVH, S = k_cache.shape[1], k_cache.shape[2]
    G = H // KVH
    if block_n is None:
        # fp32 dots run on FMA units (ieee), whose register cost makes big tiles spill.
        block_n = 64 if q.element_size() == 2 else 32
    assert block_n >= 16 and block_n & (block_n - 1) == 0, f"block_n={block_n} must be a power of two >= 16"
    if num_splits is None:
        num_splits = default_num_splits(B, KVH, S, block_n, sm_count(q.device))
    assert num_splits >= 1, f"num_splits={num_splits}"

    o = torch.empty_like(q)
    block_d = tile_width(D)
    direct = num_splits == 1  # the split kernel writes o itself: no partials, no combine launch
    part_o = o if direct else torch.empty(B, H, num_splits, block_d, device=q.device, dtype=torch.float32)
    part_lse = torch.empty(B, H, num_splits, device=q.device, dtype=torch.float32)
    on = usable(q, pdl)
    _split_kernel[(B, KVH, num_splits)](
        q, k_cache, v_cache, slot, kv_len, part_o, part_lse, scale * _LOG2E, S, num_splits,
        H=H, KVH=KVH, G=G, D=D, BLOCK_D=block_d, BLOCK_G=max(16, triton.next_power_of_2(G)), BLOCK_N=block_n,
        UPCAST_DOT=interpreter_lacks_bf16_dot(q.dtype), DIRECT=direct, num_warps=num_warps, num_stages=num_stages,
        PDL=on, **launch_kwargs(on),
    )  # fmt: skip
    if direct:
        return o
    # the combine's rows are block_d wide: a padded head dim combines into a padded buffer, then drops the padding
    wide = o if block_d == D else torch.empty(B, H, block_d, device=q.device, dtype=q.dtype)
    combine_kernel[(B, H)](part_o, part_lse, wide, num_splits, H, D=block_d, BLOCK_S=split_block, num_warps=num_warps,
                           PDL=on, **launch_kwargs(on))
    if wide is not o:
        o.copy_(wide[..., :D])
    return o
