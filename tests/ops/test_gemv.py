"""Triton decode GEMV against the fp32 reference on odd shapes (TRITON_INTERPRET=1, set by conftest)."""

import pytest
import torch

from specpilot.ops.gemv.reference import gemv_ref
from specpilot.ops.testing import assert_close

pytest.importorskip("triton")


@pytest.mark.parametrize("M,N,K,block_n,block_k", [(1, 1, 7, 8, 16), (1, 37, 96, 8, 32), (3, 50, 100, 16, 64),
                                                   (4, 9, 64, 4, 64), (2, 130, 1000, 8, 256)],
                         ids=["tiny", "even-k", "ragged-k", "m4", "wide"])
def test_gemv_matches_reference(M, N, K, block_n, block_k):
    from specpilot.ops.gemv.triton import gemv

    x = torch.randn(M, 2 * K)[:, ::2]  # strided rows are allowed only with a dense last dim
    x = x.contiguous()
    w = torch.randn(N + 3, K)[:N]
    assert_close("gemv", gemv_ref(x, w), gemv(x, w, block_n=block_n, block_k=block_k), 1e-5)


@pytest.mark.parametrize("N,K,block_k,gated", [(37, 96, 32, False), (50, 100, 64, True), (9, 40, 64, False),
                                               (21, 130, 64, True)],
                         ids=["three-tiles", "ragged-gated", "one-tile", "ragged-3-tiles-gated"])
def test_gemv_tiles_before_the_wait_change_nothing(N, K, block_k, gated):
    """pre_tiles moves the first weight loads ahead of the PDL wait: the sums and their order stay the same, so
    every setting gives the same bits (one-tile: pre_tiles is clamped to the tiles there are)."""
    from specpilot.ops.gemv.triton import gemv

    x = torch.randn(1, 2 * K if gated else K).to(torch.bfloat16)
    w = (torch.randn(N, K) * 0.1).to(torch.bfloat16)
    outs = [gemv(x, w, block_n=8, block_k=block_k, pre_tiles=p, gated=gated) for p in (0, 1, 2)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    with pytest.raises(AssertionError, match="pre_tiles"):
        gemv(x, w, pre_tiles=3, gated=gated)


@pytest.mark.parametrize("M,N,K,block_n,block_k,dtype", [
    (2, 17, 40, 16, 16, torch.float32), (5, 70, 96, 32, 32, torch.float32), (16, 33, 130, 16, 64, torch.float32),
    (8, 48, 256, 32, 64, torch.bfloat16), (13, 20, 100, 16, 32, torch.bfloat16), (17, 35, 96, 16, 32, torch.float32),
    (29, 50, 130, 32, 64, torch.bfloat16), (32, 64, 256, 64, 128, torch.float32)],
    ids=["m2-ragged", "m5-even", "m16-ragged", "m8-bf16", "m13-bf16-ragged", "m17-32row-tile", "m29-bf16-ragged",
         "m32-even"])
def test_skinny_matches_reference(M, N, K, block_n, block_k, dtype):
    from specpilot.ops.gemv.triton import skinny

    x = torch.randn(M, K + 5)[:, :K].to(dtype)  # strided rows, dense last dim
    w = (torch.randn(N + 3, K)[:N] * 0.1).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert_close("skinny", gemv_ref(x, w), skinny(x, w, block_n=block_n, block_k=block_k), tol)


def test_dispatch_and_kernel_agree_on_the_row_limit():
    from specpilot.ops import gemv
    from specpilot.ops.gemv import triton

    assert gemv.MAX_M == triton.MAX_M == 32


def test_wide_blocks_take_the_skinny_kernel_only_where_it_was_measured_faster():
    from specpilot.ops.gemv import configs

    assert configs.skinny_config(5120, 6144, 16) == configs.H200[(5120, 6144)][1]
    assert configs.skinny_config(5120, 6144, 29) is None  # cuBLAS won at 24 and 32 rows
    assert configs.skinny_config(14336, 5120, 32) == configs.H200[(14336, 5120)][1]
    assert configs.skinny_config(123, 456, 17) is None and configs.skinny_config(123, 456, 8) == configs.SKINNY_DEFAULT


def test_dispatch_takes_reference_on_cpu_and_checks_rows():
    from specpilot.ops.gemv import gemv

    x, w = torch.randn(3, 8), torch.randn(5, 8)
    torch.testing.assert_close(gemv(x, w), gemv_ref(x, w))


@pytest.mark.parametrize("N,K,block_n,block_k,dtype", [(37, 96, 8, 32, torch.float32), (50, 100, 16, 64, torch.float32),
                                                       (24, 256, 8, 64, torch.bfloat16)],
                         ids=["even-k", "ragged-k", "bf16"])
def test_gated_gemv_matches_reference(N, K, block_n, block_k, dtype):
    from specpilot.ops.gemv.reference import gated_gemv_ref
    from specpilot.ops.gemv.triton import gemv

    gate_up = torch.randn(1, 2 * K).to(dtype)
    w = (torch.randn(N, K) * 0.1).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert_close("gated gemv", gated_gemv_ref(gate_up, w), gemv(gate_up, w, block_n=block_n, block_k=block_k,
                                                                gated=True), tol)
    # the reference is the unfused path: silu_mul, then the product
    gate, up = gate_up.float().chunk(2, dim=-1)
    unfused = gemv_ref((torch.nn.functional.silu(gate) * up).to(dtype), w)
    torch.testing.assert_close(gated_gemv_ref(gate_up, w), unfused)


def test_gated_dispatch_takes_one_row():
    from specpilot.ops.gemv import gated_gemv
    from specpilot.ops.gemv.reference import gated_gemv_ref

    gate_up, w = torch.randn(1, 16), torch.randn(3, 8)
    torch.testing.assert_close(gated_gemv(gate_up, w), gated_gemv_ref(gate_up, w))
    with pytest.raises(AssertionError, match="one row"):
        gated_gemv(torch.randn(5, 16), w)


_COMPILE_PDL = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specpilot.ops.gemv.triton import _gemv_kernel
sig = {n: "*bf16" for n in ("x_ptr", "w_ptr", "y_ptr")}
sig.update({n: "i32" for n in ("N", "K", "stride_xm", "stride_wn", "stride_ym")})
consts = {"M": 1, "BLOCK_N": 16, "BLOCK_K": 512, "EVEN_K": True, "GATED": True, "PDL": True, "PRE_TILES": 1}
sig.update({n: "constexpr" for n in consts})
ptx = {}
try:
    for pre in (1, 2):
        k = triton.compile(ASTSource(fn=_gemv_kernel, signature=sig, constexprs={**consts, "PRE_TILES": pre}),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
        ptx[pre] = k.asm["ptx"]
except (RuntimeError, FileNotFoundError) as e:
    print("SKIP", e)
else:
    # every weight load issued before the wait: one per tile taken early
    early = {p: t[:t.index("griddepcontrol.wait")].count("ld.global") for p, t in ptx.items()}
    pdl = all("griddepcontrol.wait" in p and "griddepcontrol.launch_dependents" in p for p in ptx.values())
    print("OK" if pdl and 0 < early[1] < early[2] else f"MISSING pdl={pdl} early loads={early}")
"""


def test_pdl_kernels_compile_for_hopper():
    """The PDL variants (griddepcontrol, one or two weight tiles loaded before the wait) cannot run interpreted:
    compile them for sm_90 (in a child process without TRITON_INTERPRET) so that a CPU machine checks the codegen."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _COMPILE_PDL], env=env, capture_output=True, text=True, timeout=300)
    last = (out.stdout.strip().splitlines() or [""])[-1]
    if last.startswith("SKIP"):
        pytest.skip(f"no CUDA code generation here: {last}")
    assert out.returncode == 0 and last == "OK", out.stdout[-2000:] + out.stderr[-2000:]

