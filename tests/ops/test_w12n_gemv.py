"""W12N fused decode GEMV and FP8-view GEMV (Triton under TRITON_INTERPRET=1, set by conftest) vs torch truth.

Weights are built so every kernel branch runs: clean segments, inline escapes (one shared tiny exponent,
zeros, bf16 subnormals), verbatim segments (two far exponent clusters, zeros beside tiny values), several
verbatim segments per row with clean ones between them, rows without any, and K padding.
"""

import pytest
import torch
import torch.nn.functional as F

from specpilot.ops.testing import assert_close
from specpilot.ops.w12n_gemv import fp8_dequant_ref, fp8_gemv_ref, w12n_gemv_ref, w12n_linear
from specpilot.weights.w12n import VERBATIM, decode, encode, escape_mask

pytest.importorskip("triton")


def _plant(w: torch.Tensor, r: int, lo: int, hi: int, values: list[float], gen: torch.Generator) -> None:
    cols = lo + torch.randperm(hi - lo, generator=gen)[: len(values)]
    for c, v in zip(cols.tolist(), values):
        w[r, c] = v


def make_weight(n: int, k: int, segment: int, seed: int = 0, outliers: bool = False) -> torch.Tensor:
    """bf16 [n, k] ~ N(0, 0.02^2) with one planted pattern per (row, segment), cycling through
    verbatim (two far clusters) / clean / inline zeros+subnormals / inline tiny / verbatim (zero + tiny)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.02
    segs = -(-k // segment)
    for r in range(n):
        for s in range(segs):
            lo, hi = s * segment, min((s + 1) * segment, k)
            pattern = ((r * segs + s) * 3 + 2) % 5
            if pattern == 1:  # inline escape, one shared exponent (2^-30) with different mantissas and signs
                _plant(w, r, lo, hi, [1.1e-9, -1.5e-9, 1.8e-9], gen)
            elif pattern == 2:  # verbatim: escapes at 2^-30 and 2^-40
                _plant(w, r, lo, hi, [1.1e-9, -1.3e-12], gen)
            elif pattern == 3:  # inline escape with exponent 0: signed zeros and bf16 subnormals
                _plant(w, r, lo, hi, [0.0, -0.0, 3e-39, -5e-40], gen)
            elif pattern == 4:  # verbatim: zero beside a tiny normal value
                _plant(w, r, lo, hi, [0.0, 2e-9], gen)
            if outliers and (r + s) % 3 == 0:  # far above the bulk: escapes above the 'coverage' window
                _plant(w, r, lo, hi, [37.0], gen)
    return w.bfloat16()


def make_tensor(n, k, segment, base="max", seed=0):
    t = encode(make_weight(n, k, segment, seed, outliers=base == "coverage"), segment=segment, base=base)
    assert (t.xe == VERBATIM).any(), "test weights must hold a verbatim segment"
    if t.xe.numel() >= 4:
        inline = (escape_mask(t) & (t.xe != VERBATIM).repeat_interleave(segment, 1)[:, :k]).any()
        assert inline, "test weights must hold inline escapes"
    return t


def make_x(m, k, dtype, seed=1):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def check(name, ref_fn, x, t, y):
    """fp32 x: y within fp32 rounding of the reference. bf16 x: y is the fp32 result rounded once to bf16
    (relative error <= 2^-9 per element, so the RMS ratio stays below 2^-8 even for a single output)."""
    if x.dtype == torch.float32:
        assert_close(name, ref_fn(x, t), y, 1e-5)
    else:
        assert_close(name, ref_fn(x.float(), t), y.float(), 2.0**-8)


def check_bf16_epilogue(fn, x, t, y):
    """bf16 x is exact in fp32, so the bf16 call is the fp32 call rounded once (RNE, like torch), bitwise."""
    if x.dtype == torch.bfloat16:
        assert torch.equal(y.view(torch.int16), fn(x.float(), t).to(torch.bfloat16).view(torch.int16))


CASES = [(1, 1, 64, 128), (3, 7, 300, 128), (8, 33, 1024, 128), (16, 33, 300, 512), (1, 7, 1024, 512),
         (16, 1, 1024, 128), (3, 33, 64, 512), (8, 7, 300, 512)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("M,N,K,segment", CASES, ids=[f"m{m}-n{n}-k{k}-s{s}" for m, n, k, s in CASES])
def test_w12n_gemv_matches_reference(M, N, K, segment, dtype):
    from specpilot.ops.w12n_gemv.triton import w12n_gemv

    t = make_tensor(N, K, segment, seed=M + N + K)
    x = make_x(M, K, dtype)
    y = w12n_gemv(x, t)
    assert y.dtype == dtype and y.shape == (M, N)
    check("w12n_gemv", w12n_gemv_ref, x, t, y)
    check_bf16_epilogue(w12n_gemv, x, t, y)
    if dtype == torch.float32:  # the decoded-weight GEMV, written out
        assert_close("w12n_gemv vs x @ decode(t).T", x.float() @ decode(t).float().T, y, 1e-5)


@pytest.mark.parametrize("block_n,block_k", [(2, 32), (16, 64), (4, 128)])
def test_w12n_gemv_tiles_inside_segment(block_n, block_k):
    """Several tiles per segment: the verbatim pool counter must advance once per segment, not per tile."""
    from specpilot.ops.w12n_gemv.triton import w12n_gemv

    t = make_tensor(9, 600, 256, seed=5)
    assert ((t.xe == VERBATIM).sum(1) >= 2).any(), "needs a row with two verbatim segments"
    x = make_x(3, 1200, torch.float32)[:, :600]  # strided rows, dense last dim
    assert_close("w12n_gemv", w12n_gemv_ref(x, t), w12n_gemv(x, t, block_n=block_n, block_k=block_k), 1e-5)


@pytest.mark.parametrize("N", [32, 40], ids=["even-rows", "ragged-rows"])
def test_block_n_changes_no_bit(N):
    """The unmasked-row path (BLOCK_N divides N) and the masked one, at block_n 8 / 16 / 32: the same bits, since
    each row's sum runs the same fixed chain whatever the tile."""
    from specpilot.ops.w12n_gemv.triton import fp8_gemv, w12n_gemv

    t = make_tensor(N, 256, 128, seed=N)
    x = make_x(3, 256, torch.bfloat16)
    for fn in (w12n_gemv, fp8_gemv):
        base = fn(x, t).view(torch.int16)
        for block_n in (16, 32):
            assert torch.equal(fn(x, t, block_n=block_n).view(torch.int16), base), (fn.__name__, block_n)
    check("w12n_gemv", w12n_gemv_ref, x, t, w12n_gemv(x, t, block_n=32))


def test_w12n_gemv_coverage_base():
    """'coverage' base: outliers escape above the window (inline high XE, or verbatim beside tiny values)."""
    from specpilot.ops.w12n_gemv.triton import fp8_gemv, w12n_gemv

    t = make_tensor(7, 300, 128, base="coverage", seed=3)
    assert ((t.xe > t.base + 14) & (t.xe != VERBATIM)).any(), "needs an inline escape above the window"
    x = make_x(4, 300, torch.float32)
    assert_close("w12n_gemv", w12n_gemv_ref(x, t), w12n_gemv(x, t), 1e-5)
    assert_close("fp8_gemv", fp8_gemv_ref(x, t), fp8_gemv(x, t), 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_exact_decode_through_one_hot_rows(dtype):
    """x = one-hot rows picks weight columns: the kernels must reproduce them bit for bit (fp32 of bf16)."""
    from specpilot.ops.w12n_gemv.triton import fp8_gemv, w12n_gemv

    K = 300
    t = make_tensor(33, K, 128, seed=7)
    w = decode(t).float()
    v, _ = torch.sort(escape_mask(t).any(0).nonzero().flatten()[:8])  # columns with escapes or verbatim
    cols = torch.cat((v, torch.tensor([0, 1, 127, 128, 255, 256, 298, 299])))[:16]
    x = torch.zeros(len(cols), K, dtype=dtype)
    x[torch.arange(len(cols)), cols] = 1
    assert torch.equal(w12n_gemv(x, t).float(), w[:, cols].T.to(dtype).float())
    assert torch.equal(fp8_gemv(x, t).float(), fp8_dequant_ref(t)[:, cols].T.to(dtype).float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel", ["w12n", "fp8"])
def test_batch_invariance(kernel, dtype):
    """Row m of an M = 8 (and M = 16) call equals the M = 1 call on that row, bitwise."""
    from specpilot.ops.w12n_gemv import triton as kernels

    fn = kernels.w12n_gemv if kernel == "w12n" else kernels.fp8_gemv
    t = make_tensor(33, 300, 128, seed=11)
    x = make_x(16, 300, dtype, seed=2)
    y8, y16 = fn(x[:8], t), fn(x, t)
    for m in range(8):
        y1 = fn(x[m:m + 1], t)
        assert torch.equal(y8[m:m + 1], y1), f"row {m}: M=8 differs from M=1"
        assert torch.equal(y16[m:m + 1], y1), f"row {m}: M=16 differs from M=1"


FP8_CASES = [(1, 7, 300, 128), (8, 33, 1024, 512), (16, 1, 64, 128)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("M,N,K,segment", FP8_CASES, ids=[f"m{m}-n{n}-k{k}-s{s}" for m, n, k, s in FP8_CASES])
def test_fp8_gemv_matches_reference(M, N, K, segment, dtype):
    from specpilot.ops.w12n_gemv.triton import fp8_gemv

    t = make_tensor(N, K, segment, seed=M * N + K)
    x = make_x(M, K, dtype)
    y = fp8_gemv(x, t)
    assert y.dtype == dtype and y.shape == (M, N)
    check("fp8_gemv", fp8_gemv_ref, x, t, y)
    check_bf16_epilogue(fp8_gemv, x, t, y)


@pytest.mark.parametrize("M", [1, 5])
def test_fp8_gemv_launches(M):
    """The FP8 view at tiles wider than the segment, with and without the one-tile prefetch, ragged rows: every
    launch matches the reference; prefetch and block_n change no bit (the same chain per lane)."""
    from specpilot.ops.w12n_gemv.triton import fp8_gemv

    t = make_tensor(37, 1000, 128, seed=M)  # padded K 1024: tiles of up to 1024 weights, 8 segments each
    x = make_x(M, 1000, torch.bfloat16, seed=M)
    for block_k in (128, 512, 1024):
        base = fp8_gemv(x, t, block_k=block_k)
        check("fp8_gemv", fp8_gemv_ref, x, t, base)
        for kw in ({"prefetch": True}, {"prefetch": True, "block_n": 4, "num_warps": 2}, {"block_n": 32}):
            assert torch.equal(fp8_gemv(x, t, block_k=block_k, **kw), base), (block_k, kw)
    with pytest.raises(ValueError, match="dividing the padded K"):
        fp8_gemv(x, t, block_k=2048)


def test_fp8_view_is_close_to_exact():
    """Under the 'max' base the FP8 scan stays within the 3-bit-mantissa truncation of the exact GEMV."""
    t = make_tensor(33, 1024, 128, seed=13)
    x = make_x(4, 1024, torch.float32)
    exact, view = w12n_gemv_ref(x, t), fp8_gemv_ref(x, t)
    rel = (exact - view).norm() / exact.norm()
    assert 0 < rel < 0.125, rel


def test_nonfinite_weights_in_verbatim_segments():
    """inf/NaN never escape inline (XE 255 is the verbatim marker): they come from the pool, propagate like torch."""
    from specpilot.ops.w12n_gemv.triton import w12n_gemv

    w = make_weight(7, 300, 128, seed=17)
    w[1, 5], w[4, 140], w[4, 141], w[6, 290] = float("inf"), float("nan"), -float("inf"), -float("inf")
    t = encode(w, segment=128)
    assert t.xe[1, 0] == t.xe[4, 1] == t.xe[6, 2] == VERBATIM
    x = make_x(3, 300, torch.float32).abs() + 0.1  # positive x: no inf - inf in the rows with one infinity
    ref, y = w12n_gemv_ref(x, t), w12n_gemv(x, t)
    assert torch.equal(torch.isnan(ref), torch.isnan(y)) and torch.equal(torch.isinf(ref), torch.isinf(y))
    assert torch.isinf(y[:, [1, 6]]).all() and torch.isnan(y[:, 4]).all()
    finite = torch.isfinite(ref)
    assert torch.equal(ref[~finite].isnan(), y[~finite].isnan()) and torch.equal(ref[torch.isinf(ref)], y[torch.isinf(y)])
    assert_close("finite rows", ref[:, [0, 2, 3, 5]], y[:, [0, 2, 3, 5]], 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_w12n_linear_cpu_is_decode_plus_linear(dtype):
    t = make_tensor(33, 300, 128, seed=19)
    w = decode(t).to(dtype)
    x = make_x(32, 300, dtype)
    assert torch.equal(w12n_linear(x, t), F.linear(x, w))
    x3 = x.reshape(2, 16, 300)
    assert torch.equal(w12n_linear(x3, t), F.linear(x3, w))
    assert torch.equal(w12n_linear(x[:4], t), F.linear(x[:4], w))


@pytest.mark.parametrize("base", ["max", "coverage"])
@pytest.mark.parametrize("n,k,segment,block_n,block_k", [(33, 300, 128, 8, None), (7, 1024, 512, 4, 128),
                                                         (1, 64, 128, 8, None), (16, 300, 512, 16, 256),
                                                         (5, 2000, 256, 2, 64)])
def test_decode_kernel_is_the_exact_decode(n, k, segment, block_n, block_k, base):
    """The decode-to-bf16 kernel (large batches: decode, then cuBLAS) returns decode(t)'s bits: inline escapes,
    zeros, subnormals, verbatim segments, K padding, ragged row blocks."""
    from specpilot.ops.w12n_gemv.triton import w12n_decode

    t = make_tensor(n, k, segment, base=base, seed=n + k)
    got = w12n_decode(t, block_n=block_n, block_k=block_k)
    assert got.shape == (n, k) and got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), decode(t).view(torch.int16))


def test_decode_kernel_keeps_nonfinite_bits():
    from specpilot.ops.w12n_gemv.triton import w12n_decode

    w = make_weight(7, 300, 128, seed=17)
    w[1, 5], w[4, 140], w[4, 141], w[6, 290] = float("inf"), float("nan"), -float("inf"), -float("inf")
    t = encode(w, segment=128)
    assert torch.equal(w12n_decode(t).view(torch.int16), w.view(torch.int16))


def test_w12n_linear_large_m_uses_the_decode_kernel(monkeypatch):
    """Above 16 rows a GPU call decodes with the kernel and multiplies with F.linear (run here on CPU tensors
    through the interpreter, dispatch forced)."""
    import specpilot.ops.w12n_gemv as ops
    from specpilot.ops.w12n_gemv import triton as kernels

    calls = []
    real = kernels.w12n_decode
    monkeypatch.setattr(ops, "use_triton", lambda x: True)
    monkeypatch.setattr(kernels, "w12n_decode", lambda t: calls.append(t) or real(t))
    t = make_tensor(33, 300, 128, seed=31)
    x = make_x(20, 300, torch.float32)
    assert torch.equal(w12n_linear(x, t), F.linear(x, decode(t).float())) and len(calls) == 1


def test_dispatch_on_cpu_uses_reference():
    from specpilot.ops.w12n_gemv import fp8_gemv, w12n_gemv

    t = make_tensor(7, 64, 128, seed=23)
    x = make_x(20, 64, torch.float32)  # M > 16 is fine for the references
    assert torch.equal(w12n_gemv(x, t), w12n_gemv_ref(x, t))
    assert torch.equal(fp8_gemv(x, t), fp8_gemv_ref(x, t))


def test_rejects_bad_calls():
    from specpilot.ops.w12n_gemv.triton import w12n_gemv

    t = make_tensor(7, 300, 128, seed=29)
    with pytest.raises(ValueError, match="M <= 16"):
        w12n_gemv(make_x(17, 300, torch.float32), t)
    with pytest.raises(ValueError, match="K=300"):
        w12n_gemv(make_x(2, 301, torch.float32), t)
    with pytest.raises(ValueError, match="block_k"):
        w12n_gemv(make_x(2, 300, torch.float32), t, block_k=256)
    with pytest.raises(ValueError, match="fp32 or bf16"):
        w12n_gemv(make_x(2, 300, torch.float16), t)
    from specpilot.ops.w12n_gemv.triton import w12n_decode

    with pytest.raises(ValueError, match="block_k"):
        w12n_decode(t, block_k=256)
    from specpilot.ops.w12n_gemv import fuses_swiglu, w12n_swiglu
    from specpilot.ops.w12n_gemv.mma import glu_supported

    glu = make_tensor(32, 256, 128, seed=30)
    assert glu_supported(glu) and not glu_supported(t)  # [gate; up] of whole 16-row blocks only
    x = make_x(1, 256, torch.bfloat16)
    assert not fuses_swiglu(x, glu)  # the fused kernel is a GPU one: on a CPU the MLP runs silu_mul
    with pytest.raises(ValueError, match="decode-sized bf16 batch on CUDA"):
        w12n_swiglu(x, glu)


def test_asm_decode_compiles_for_sm90(tmp_path):
    """The PTX decode (never run by the interpreter) compiles for an H100/H200 with Triton's own ptxas, and its
    main loop stays within the measured instruction budget (python3 -m bench sass_count, README.md). Runs in a child
    process: the kernels are plain @triton.jit functions only without TRITON_INTERPRET."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("Triton's nvidia backend (ptxas) is not installed")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(root), TRITON_DEFAULT_FP_FUSION="1")
    out = tmp_path / "sass.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "sass_count", "--out", str(out)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    # measured 8.9-9.6, 3.4-3.5 and 5.8-6.2 (Triton 3.9 / 3.6)
    budget = {"w12n.M1": 10.5, "fp8.M1": 4.5, "w12n_mma.M1": 6.5, "w12n_mma.M16": 7.0}
    for name in ("w12n.M1", "w12n.M8", "w12n.M16", "fp8.M1", "fp8.M8", "w12n_mma.M1", "w12n_mma.M16", "w12n_decode"):
        assert "per_weight" in res[name], res[name]
        assert res[name]["per_weight"] <= budget.get(name, 64), (name, res[name])
        assert "PRMT" in res[name]["ops_fast"] or "F2FP" in res[name]["ops_fast"], res[name]["ops_fast"]
    for name in ("w12n_mma.M1", "w12n_mma.M16"):  # the products on the tensor cores: one mma per 8 weights a lane
        assert res[name]["ops_fast"].get("HMMA", 0) == (4 if name.endswith("M1") else 8), res[name]["ops_fast"]
    # verbatim segments are added after the K loop, so a tensor with some keeps the plain loop
    # (docs/decisions/2026-11-30-w12n-verbatim-pass.md)
    plain, verbatim = res["w12n_mma.M1"], res["w12n_mma_verbatim.M1"]
    assert verbatim["ops_fast"].get("HMMA", 0) == 4 and verbatim["loop"] <= 1.15 * plain["loop"], (plain, verbatim)
    ks8 = res["w12n_mma_verbatim_ks8.M1"]  # 8 warps at segment 256: no division left in the loop
    assert ks8["ops_fast"].get("HMMA", 0) == 4 and ks8["loop"] <= 1.1 * plain["loop"], (plain, ks8)
    swiglu = res["w12n_mma_swiglu.M1"]  # the SwiGLU epilogue changes what follows the loop only
    assert swiglu["ops_fast"].get("HMMA", 0) == 4 and abs(swiglu["loop"] - plain["loop"]) <= 4, (plain, swiglu)


def test_tiled_planes_put_each_lane_fragment_together():
    """The tensor-core kernel's tile-major planes: block rb, chunk c, half h, lane 4g + t holds row 16 rb + g + 8 h,
    columns 64 c + 16 t .. + 16 of A (8 bytes of B), rows padded to whole blocks with zeros."""
    from specpilot.ops.w12n_gemv.mma import tiled_planes

    t = make_tensor(37, 300, 128)
    a, b = tiled_planes(t)
    blocks, chunks = 3, t.padded_k // 64
    a = a.view(blocks, chunks, 2, 8, 4, 16)
    b = b.view(blocks, chunks, 2, 8, 4, 8)
    for rb, c, h, g, tt in [(0, 0, 0, 0, 0), (1, 2, 1, 3, 2), (2, 5, 0, 4, 3), (2, 1, 1, 7, 1)]:
        row = 16 * rb + g + 8 * h
        if row < t.n and t.xe[row, 64 * c // t.segment] != VERBATIM:
            assert torch.equal(a[rb, c, h, g, tt], t.a[row, 64 * c + 16 * tt: 64 * c + 16 * tt + 16])
            assert torch.equal(b[rb, c, h, g, tt], t.b[row, 32 * c + 8 * tt: 32 * c + 8 * tt + 8])
        else:  # padding rows and verbatim segments (added from the pool after the K loop) hold zeros
            assert not a[rb, c, h, g, tt].any() and not b[rb, c, h, g, tt].any()
    assert tiled_planes(t)[0].data_ptr() == tiled_planes(t)[0].data_ptr()  # cached per tensor


def _pool_pairs(words: torch.Tensor, vr: torch.Tensor, col: torch.Tensor) -> tuple[list, list]:
    """The kernel's pool pairs (w0, w2) / (w1, w3) of words col + j (j = 0..3) of pool rows vr (zeros where -1)."""
    from tests.ops import ptx

    p02, p13 = [], []
    for j in range(4):
        v = torch.where(vr >= 0, words[vr.clamp(min=0), col + j], 0)
        lo, hi = v & ptx.M32, (v >> 32) & ptx.M32
        p02.append((lo & 0xFFFF) | ((hi & 0xFFFF) << 16))
        p13.append((lo >> 16) | (hi & 0xFFFF0000))
    return p02, p13


def _emulated_mma_gemv(x: torch.Tensor, t, swiglu: bool = False) -> torch.Tensor:
    """The tensor-core kernel's data flow on a CPU, one warp per 16-row block (KS = 1): lane registers filled
    from the tile-major planes and the verbatim tables as the kernel loads them, its decode and mma asm text run
    by tests/ops/ptx.py; the K loop, then the pass over each block's listed verbatim segments. swiglu: the SwiGLU
    planes (rows in glu_rows order), the fp32 sums returned in that kernel-row order."""
    from specpilot.ops.w12n_gemv import mma
    from tests.ops import ptx

    M, blocks, chunks = x.shape[0], -(-t.n // 16), t.padded_k // 64
    A, B = mma.tiled_planes(t, swiglu)
    a = A.view(blocks, chunks, 2, 32, 16).view(torch.int32).long() & ptx.M32  # [.., h, lane, word j]
    b = B.view(blocks, chunks, 2, 32, 8).view(torch.int32).long() & ptx.M32  # [.., h, lane, B word]
    lane = torch.arange(32)
    g, tt = lane // 4, lane % 4
    rows = (16 * torch.arange(blocks)[:, None, None] + g + 8 * torch.arange(2)[:, None]).clamp(max=t.n - 1)
    segs = 64 * torch.arange(chunks) // t.segment
    vt = mma.verbatim_tables(t, swiglu) if t.verbatim.shape[0] else None
    xe = t.xe[mma.glu_rows(t.n)] if swiglu else t.xe  # by kernel row
    xe = (xe if vt is None else vt.xe).long()[rows[:, None], segs[None, :, None, None]]  # [blocks, chunks, h, lane]
    base = (t.base << 7) | (t.base << 23)
    pairs = []
    for h in range(2):
        ops = {8 + j: a[:, :, h, :, j] for j in range(4)}
        ops.update({12: b[:, :, h, :, 0], 13: b[:, :, h, :, 1]})
        ops.update({14 + j: (xe[:, :, h] << 7) | (xe[:, :, h] << 23) for j in range(4)})
        ops.update({18 + j: torch.full_like(xe[:, :, h], base) for j in range(4)})
        out = ptx.run(mma._DECODE_CHUNK.value, ops)
        pairs.append(([out[j] for j in range(4)], [out[4 + j] for j in range(4)]))
    xw = torch.zeros(M, t.padded_k // 4, dtype=torch.int64)
    xw[:, :t.k // 4] = x.contiguous().view(torch.int64)
    acc = [torch.zeros(blocks, 32, dtype=torch.int64) for _ in range(4)]

    def run_mma(p, chunk, acc, live):  # p: (row g pairs, row g + 8 pairs), [blocks, 32] each; chunk: [blocks]
        ops = {4 + j: p[0][0][j] for j in range(4)}
        ops.update({8 + j: p[0][1][j] for j in range(4)})
        ops.update({12 + j: p[1][0][j] for j in range(4)})
        ops.update({16 + j: p[1][1][j] for j in range(4)})
        ops.update({20 + j: xw[g.clamp(max=M - 1), 16 * chunk[:, None] + 4 * tt + j] for j in range(4)})
        ops.update({24 + i: acc[i] for i in range(4)})
        out = ptx.run(mma._MMA_CHUNK.value, ops)
        return [torch.where(live[:, None], out[i], acc[i]) for i in range(4)]

    every = torch.ones(blocks, dtype=torch.bool)
    for c in range(chunks):
        chunk_pairs = [([q[:, c] for q in p02], [q[:, c] for q in p13]) for p02, p13 in pairs]
        acc = run_mma(chunk_pairs, torch.full((blocks,), c), acc, every)
    if vt is not None:  # the pass after the K loop: block i's q-th listed segment, its chunks in order
        words = t.verbatim.view(torch.int64)
        cps = t.segment // 64
        for q in range(int(vt.vcount.max())):
            seg = vt.vseg[:, q].long()
            for r in range(cps):
                pool_pairs = []
                for h in range(2):
                    pool_pairs.append(_pool_pairs(words, vt.vq.long()[rows[:, h], q], 16 * r + 4 * tt))
                acc = run_mma(pool_pairs, seg * cps + r, acc, q < vt.vcount)
    y = torch.zeros(16, blocks * 16)
    for i, (dr, dn) in enumerate([(0, 0), (0, 1), (8, 0), (8, 1)]):
        vals = acc[i].to(torch.int32).view(torch.float32)
        y[2 * tt + dn, 16 * torch.arange(blocks)[:, None] + g + dr] = vals
    return y[:M, :t.n]



@pytest.mark.parametrize("make", [lambda: make_tensor(48, 300, 128, seed=3), lambda: _sparse_verbatim_tensor()])
def test_swiglu_planes_emulated(make):
    """The SwiGLU planes (rows in glu_rows order, verbatim tables by kernel row) give each row the same fp32 sums
    as the plain planes, bitwise; the epilogue's pairs (c0, c2), (c1, c3) of a lane are then the gate and the up
    of one output column."""
    from specpilot.ops.w12n_gemv import mma

    t = make()
    rows = mma.glu_rows(t.n)
    assert sorted(rows.tolist()) == list(range(t.n))
    assert rows[:16].tolist() == list(range(8)) + list(range(24, 32))  # block 0: gate 0..7, then up 0..7 (I = 24)
    x = make_x(3, t.k, torch.bfloat16)
    plain, fused = _emulated_mma_gemv(x, t), _emulated_mma_gemv(x, t, swiglu=True)
    assert torch.equal(fused, plain[:, rows])
    block, g = torch.arange(t.n // 16)[:, None], torch.arange(8)
    assert torch.equal(rows[16 * block + g] + t.n // 2, rows[16 * block + g + 8])  # row g + 8 is row g's up


@pytest.mark.parametrize("N,K,segment", [(37, 300, 128), (16, 512, 256)])
def test_mma_kernel_asm_emulated(N, K, segment):
    """The tensor-core kernel's decode and mma asm, run by a PTX interpreter on the lanes' registers: one-hot
    activation rows return decoded weight columns bit for bit (escapes, zeros, subnormals, verbatim segments,
    padding), and random rows match the fp32 reference."""
    t = make_tensor(N, K, segment, seed=N)
    cols = [0, 1, 5, 13, 36, K // 2, K - 2, K - 1]
    onehot = torch.zeros(len(cols), K, dtype=torch.bfloat16)
    onehot[torch.arange(len(cols)), cols] = 1
    assert torch.equal(_emulated_mma_gemv(onehot, t), decode(t).float()[:, cols].T)
    x = make_x(5, K, torch.bfloat16)
    check("w12n mma (emulated)", w12n_gemv_ref, x, t, _emulated_mma_gemv(x, t).to(torch.bfloat16))



def _sparse_verbatim_tensor():
    """48 x 512 at segment 128, verbatim only at (row 20, segment 2) and (row 47, segments 0 and 3): block 0
    has none, block 1 one segment, block 2 two (not the first ones), so the pass skips, walks and masks rows."""
    w = (torch.randn(48, 512, generator=torch.Generator().manual_seed(5)) * 0.02).clamp_min(1e-4)
    w = torch.where(torch.rand(48, 512, generator=torch.Generator().manual_seed(6)) < 0.5, w, -w)
    for r, s in [(20, 2), (47, 0), (47, 3)]:
        w[r, 128 * s + 3], w[r, 128 * s + 70] = 1.1e-9, -1.3e-12  # two escape exponents in one segment
    t = encode(w.bfloat16(), segment=128)
    assert (t.xe == VERBATIM).sum() == 3
    return t


def test_verbatim_tables_list_each_blocks_segments():
    from specpilot.ops.w12n_gemv.mma import verbatim_tables

    vt = verbatim_tables(_sparse_verbatim_tensor())
    assert vt.vcount.tolist() == [0, 1, 2]
    assert vt.vseg[1, :1].tolist() == [2] and vt.vseg[2, :2].tolist() == [0, 3]
    assert vt.vq[20].tolist() == [0, -1, -1, -1] and vt.vq[47].tolist() == [1, 2, -1, -1]  # by list position
    assert vt.vq[16].tolist() == [-1] * 4 and vt.vq[0].tolist() == [-1] * 4  # inline row; block without any
    assert (vt.xe[20, 2], vt.xe[47, 0]) == (0, 0)


def test_mma_kernel_asm_emulated_sparse_verbatim():
    """As above on a tensor whose blocks have none, one, or two verbatim segments."""
    t = _sparse_verbatim_tensor()
    cols = [3, 70, 128 * 2 + 3, 128 * 2 + 70, 128 * 3 + 70, 100, 511]
    onehot = torch.zeros(len(cols), 512, dtype=torch.bfloat16)
    onehot[torch.arange(len(cols)), cols] = 1
    assert torch.equal(_emulated_mma_gemv(onehot, t), decode(t).float()[:, cols].T)
    x = make_x(3, 512, torch.bfloat16)
    check("w12n mma (emulated)", w12n_gemv_ref, x, t, _emulated_mma_gemv(x, t).to(torch.bfloat16))


def test_mma_launch_rules():
    """The K split always divides the chunk count (no masked chunks) and never depends on M (batch invariance);
    small N takes 8 warps, at M <= 8 under an 80-register cap (the H200 sweep's best); the rest 4 warps, the
    compiler's registers."""
    from types import SimpleNamespace

    from specpilot.ops.w12n_gemv.mma import Launch, default_launch, resolve_launch

    for n, k in [(6144, 4096), (4096, 4096), (5120, 17408), (248320, 5120), (40, 320), (16, 192)]:
        t = SimpleNamespace(n=n, padded_k=k)
        for m in (1, 8, 16):
            assert (k // 64) % default_launch(t, m).warps == 0
    o_proj, lm_head = (SimpleNamespace(n=n, padded_k=4096) for n in (4096, 151936))
    assert default_launch(o_proj, 1) == default_launch(o_proj, 8) == Launch(warps=8, maxnreg=80)
    assert default_launch(o_proj, 16) == Launch(warps=8)  # two x tiles: no cap; the K split stays (invariance)
    for n, k in [(6144, 4096), (5120, 6144), (5120, 17408), (24576, 4096), (248320, 5120), (40, 320)]:
        t = SimpleNamespace(n=n, padded_k=k)
        assert len({default_launch(t, m).warps for m in range(1, 17)}) == 1, (n, k)
    none, some = torch.zeros(0, 256), torch.zeros(3, 256)  # pools: no verbatim segments, three
    qkv27, gate_up = SimpleNamespace(n=14336, padded_k=5120, verbatim=some), SimpleNamespace(n=24576, padded_k=4096)
    for v in (none, some):  # 1,030 blocks: 8 programs per SM take them in one wave, 7 (verbatim pass) in two
        gdn_in = SimpleNamespace(n=16480, padded_k=5120, verbatim=v)
        assert default_launch(gdn_in, 1) == default_launch(gdn_in, 8) == Launch(warps=4, maxnreg=64 if len(v) else None)
        assert default_launch(gdn_in, 16) == Launch(warps=4)
    assert default_launch(qkv27, 1) == default_launch(qkv27, 16) == Launch(warps=4)  # 896 blocks: no cap
    for t in (gate_up, lm_head):  # >= 10 blocks per SM: capped at M <= 8 (the cap changes no bit)
        assert default_launch(t, 1) == default_launch(t, 8) == Launch(warps=4, maxnreg=80)
        assert default_launch(t, 16) == Launch(warps=4)
    assert default_launch(SimpleNamespace(n=4096, padded_k=192), 1).maxnreg is None  # 3 chunks: 8 does not divide
    # overrides: another K split drops the cap unless one is given; a cap alone keeps the default's K split
    assert resolve_launch(o_proj, 1, 132, warps=4) == Launch(warps=4)
    assert resolve_launch(o_proj, 1, 132, warps=4, maxnreg=96) == Launch(warps=4, maxnreg=96)
    assert resolve_launch(o_proj, 1, 132, maxnreg=96) == Launch(warps=8, maxnreg=96)
    assert resolve_launch(o_proj, 1, 132, warps=8) == default_launch(o_proj, 1)


def test_fma_kernel_asm_emulated():
    """The FMA kernel's PTX decode (one A word + one B half-word -> 4 fp32) and FP8-view convert, run by the PTX
    interpreter on every word of a matrix: the decode widens decode(t)'s bf16 bits exactly (inline escapes,
    zeros, subnormals; verbatim segments are replaced after it), the view equals fp8_dequant_ref's values."""
    from specpilot.ops.w12n_gemv import triton as kernels
    from tests.ops import ptx

    t = make_tensor(9, 300, 128, seed=4)
    words = t.a.contiguous().view(torch.int32).long() & ptx.M32  # [N, KP / 4]
    halves = t.b.contiguous().view(torch.int16).long() & 0xFFFF
    xe = t.xe.long().repeat_interleave(t.segment // 4, dim=1)  # per word
    ops = {4: words, 5: halves, 6: (xe << 7) | (xe << 23), 7: torch.full_like(xe, (t.base << 7) | (t.base << 23))}
    out = ptx.run(kernels._W12N_ASM.value, ops)
    got = torch.stack([out[i] for i in range(4)], -1).flatten(1)[:, :t.k]  # weights 4w + i
    want = (decode(t).view(torch.int16).long() & 0xFFFF) << 16
    inline = (t.xe != VERBATIM).repeat_interleave(t.segment, 1)[:, :t.k]
    assert torch.equal(got[inline], want[inline])
    out = ptx.run(kernels._FP8_ASM.value, {4: words})
    view = torch.stack([out[i] for i in range(4)], -1).flatten(1)[:, :t.k].to(torch.int32).view(torch.float32)
    scale = 2.0 ** (t.base - 120)
    assert torch.equal(view * scale, fp8_dequant_ref(t).float()[:, :t.k])
