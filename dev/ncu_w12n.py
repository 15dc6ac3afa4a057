"""Issue 5 probe: what holds the W12N tensor-core GEMV back on the mid-size projections. Launches it (and our
bf16 GEMV, and cuBLAS) a few times per shape at M = 1, for Nsight Compute to profile:

    ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section LaunchStats --section SchedulerStats -k "regex:w12n_mma|gemv|gemm|xmma|cutlass" -c 40 \
        -o OUT/w12n python3 dev/ncu_w12n.py
    ncu --import OUT/w12n.ncu-rep --page details > OUT/details.txt

(the run behind bench/results/ncu_w12n_details_h200.txt, ac69b2e; cuBLAS's kernels did not match the regex)
"""

import torch
import torch.nn.functional as F

from bench.gemv import SHAPES
from specpilot.ops import gemv as bf16_gemv
from specpilot.ops.w12n_gemv import mma
from specpilot.weights import w12n

for name in ("27B.o_proj", "8B.o_proj", "8B.gate_up"):
    n, k = SHAPES[name]
    w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    t = w12n.encode_best(w)
    mma.prepare(t)
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    for _ in range(2):
        mma.w12n_mma_gemv(x, t)
        bf16_gemv.gemv(x, w)
        F.linear(x, w)
    torch.cuda.synchronize()
    print(name, n, k, "segment", t.segment, "launch", mma.default_launch(t, x.shape[0]), flush=True)
