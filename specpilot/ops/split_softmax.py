"""Pieces the split-K attention kernels share (decode_attention, tree_attention).

A kernel that splits the keys across programs writes fp32 partial outputs with their log2-sum-exp;
combine_kernel merges them per (row, query head). Also: the SM count that sizes the splits, and the dot
product that works around the interpreter's bf16 tl.dot.
"""

import functools

import torch
import triton
import triton.language as tl

from specpilot.ops.pdl_wait import wait_for_inputs

FALLBACK_SM_COUNT = 132  # H200; used when there is no CUDA device (interpreter runs)


@triton.jit
def dot(a, b, UPCAST: tl.constexpr):
    """a @ b accumulated in fp32; UPCAST feeds fp32 operands (see interpreter_lacks_bf16_dot)."""
    if UPCAST:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b, input_precision="ieee")  # ieee: no silent tf32 for fp32 caches
    return c


@triton.jit
def combine_kernel(part_o_ptr, part_lse_ptr, o_ptr, num_splits, H, D: tl.constexpr, BLOCK_S: tl.constexpr,
                   PDL: tl.constexpr = False):
    """One program per (request, query head): o = sum_s 2^(lse_s - m) * o_s / sum_s 2^(lse_s - m)."""
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64) * H + tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D)
    lse_row = part_lse_ptr + row * num_splits

    m_vec = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s_mask = s0 + offs_s < num_splits
        m_vec = tl.maximum(m_vec, tl.load(lse_row + s0 + offs_s, mask=s_mask, other=float("-inf")))
    m = tl.max(m_vec, 0)  # finite: callers guarantee every row has one split that saw a key

    acc = tl.zeros([D], tl.float32)
    w_sum = tl.zeros([BLOCK_S], tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s_mask = s0 + offs_s < num_splits
        w = tl.exp2(tl.load(lse_row + s0 + offs_s, mask=s_mask, other=float("-inf")) - m)
        part_offs = (row * num_splits + s0 + offs_s)[:, None] * D + offs_d[None, :]
        part = tl.load(part_o_ptr + part_offs, mask=s_mask[:, None], other=0.0)
        acc += tl.sum(w[:, None] * part, 0)
        w_sum += w
    o = acc / tl.sum(w_sum, 0)
    tl.store(o_ptr + row * D + offs_d, o.to(o_ptr.dtype.element_ty))


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return FALLBACK_SM_COUNT
    return torch.cuda.get_device_properties(device).multi_processor_count


def interpreter_lacks_bf16_dot(dtype: torch.dtype) -> bool:
    # TRITON_INTERPRET keeps bf16 as raw uint16 bits and its tl.dot multiplies those bits (triton-lang/triton
    # #11584), so interpreted bf16 runs upcast the (already bf16-rounded) operands; compiled kernels never do.
    return dtype == torch.bfloat16 and bool(triton.knobs.runtime.interpret)
