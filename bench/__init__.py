"""The benchmarks behind the figures in README.md and docs/performance.md, one module each, run from the repository
root as `python3 -m bench NAME [args]` (`python3 -m bench NAME --help` lists a benchmark's flags). Each writes a
JSON report (GPU, commit, command) to --out, again after every section; committed results are in bench/results/.
Most need a GPU; each module's docstring gives its commands, a CPU dry run among them.

Benchmarks:
    ar_decode        AR decode against transformers' generate on random weights in the real shapes, vs the roofline
    cost_model_validation  the pilot's cost model: predicted vs measured tok/s per shape, batch, tree, weight format
    dflash_scaling   the DFlash proposal at batch 1..32 and two contexts, its paths side by side, per part
    drafter_proposal each drafter's proposal (DFlash, DFlash2, DSpark, MTP) at the 27B shape vs its weight-read roofline
    gdn_tree_kernel  the Triton GDN tree kernel alone per (requests, nodes, warps, dot precision)
    gemv             decode GEMV launch configs on every projection shape: cuBLAS vs our Triton kernels
    host_step        host microseconds of one speculative step per component (CPU, no GPU needed)
    hybrid_tree      tree verification on the hybrid 27B shape: verify cost vs nodes, GDN kernel, commit, memory
    margin_check     margin targets against flat ones: top-2 logit gap vs bf16 path noise, and AR decode speed
    odd_shapes       odd shapes the loader accepts run on the GPU and give transformers' greedy output
    path_noise       how far AR decode and a teacher-forced block over the same tokens drift apart
    prefill          GDN prefill (torch, ours, fla-core) and decode kernels; whole-model prefill TFLOP/s; per chunk; TTFT
    sass_count       offline SASS instruction counts of the GEMV kernels' main loops (sm_90, no GPU needed)
    server_load      one open-loop load against the engine driven directly and through `specpilot serve` (overhead)
    spec_step        where a speculative step's time goes, per phase and per kernel (synthetic acceptance)
    verify_cost      t(N)/t(1) of verifying N tree tokens in one forward, and a step's host overhead
    verify_curve     the verify cost curve the node budget reads: seconds per batch, tokens per request, context
    w12n_gemv        W12N GEMV vs cuBLAS bf16 vs our bf16 GEMV vs the FP8 view, per projection shape
    zoo_acceptance   tau and per-depth acceptance of the zoo's drafter x target pairs (CPU)
    zoo_batching     the zoo under continuous batching: adaptive budget on vs off, tokens per verified token (CPU)

Shared by the benchmarks, not run on their own: common (run record, JSON report, error capture, timing, copy
bandwidth), projections (the projection shapes and GEMV timing), sass (offline SASS and its main loop), trees
(random draft trees, a drafter at no cost). A benchmark imports these and never another benchmark. The GPU kernel
checks are tests (tests/gpu/test_kernels.py).
"""

SHARED = ("common", "projections", "sass", "trees")
