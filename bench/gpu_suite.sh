#!/usr/bin/env bash
# The GPU benchmark suite (H200) in four calls of under 10 minutes each: run from the repository root,
#
#     SUITE_ONLY="kernel_tests w12n_gemv spec_step" bash bench/gpu_suite.sh OUTDIR COMMIT           # caps 360 s
#     SUITE_ONLY="bench_27b bench_8b" SUITE_BUDGET_S=1400 bash bench/gpu_suite.sh OUTDIR COMMIT     # caps 570 s
#     SUITE_ONLY="verify_cost hybrid_tree" bash bench/gpu_suite.sh OUTDIR COMMIT                    # caps 350 s
#     SUITE_ONLY="ar_decode" bash bench/gpu_suite.sh OUTDIR COMMIT                                  # cap 300 s
#     SUITE_ONLY="bench_27b_long" bash bench/gpu_suite.sh OUTDIR COMMIT      # opt-in, cap 480 s: issue 7's row
#     SUITE_ONLY="fla_tests prefill" bash bench/gpu_suite.sh OUTDIR COMMIT   # opt-in, caps 150 + 420 s: issue 30
#         (needs fla-core: python3 -m pip install --no-index --no-deps .whl/*.whl; docs/prefill.md)
#     SUITE_ONLY="gemv_skinny bench_zoo_dense bench_zoo_hybrid" bash bench/gpu_suite.sh OUTDIR COMMIT  # caps 220 s
#     SUITE_ONLY="gate" bash bench/gpu_suite.sh OUTDIR COMMIT                                          # opt-in, cap 560 s
#     SUITE_ONLY="server_load drafter_proposal" bash bench/gpu_suite.sh OUTDIR COMMIT                  # opt-in, caps 460 s
#     SUITE_ONLY="server_load_process" bash bench/gpu_suite.sh OUTDIR COMMIT                          # opt-in, cap 400 s
#     SUITE_ONLY="fla_tests prefill" bash bench/gpu_suite.sh OUTDIR COMMIT                             # opt-in, caps 570 s
#     SUITE_ONLY="sampling_27b" bash bench/gpu_suite.sh OUTDIR COMMIT                                  # opt-in, cap 300 s
#     SUITE_ONLY="prefill_model" bash bench/gpu_suite.sh OUTDIR COMMIT          # opt-in, cap 500 s: issue 30 (b), (c)
#
# (measured 2026-11-30, fifth and sixth sessions: the kernel checks 48-84 s, gdn_tree_kernel 57 s, w12n_gemv 80-160 s,
# about 200 s with the ninth session's tensor-core variants,
# spec_step 63-70 s, verify_cost --skip-sweep with the A/B 62-80 s, hybrid_tree with its checks 92-116 s; at 128
# tokens per prompt with the probing oracle bench_27b 277 s and bench_8b 116 s. The 27B bench at 2 prompts x 2,048
# tokens, stock + one tree, batch 1 only, took ~240 s: run it alone, see docs/performance.md)
#
# (without kernel_tests in a call, SUITE_KERNEL_TESTS=FILE points the later steps at an earlier call's JUnit XML)
#
# Writes 8 JSON files and suite.log (more than 8 files: split the suite over calls, as above) (every step's stdout and stderr) into OUTDIR, nothing else:
#   kernel_tests_h200.xml    JUnit XML of tests/gpu/test_kernels.py: every Triton kernel vs its reference (fused
#                            decode prologue, tree attention, GDN tree, W12N and FP8-view GEMVs, ...)
#   bench_27b_h200.json      specpilot bench, random:Qwen3.5-27B + random DFlash, synthetic:dflash2-gsm8k
#   verify_cost_h200.json    t(N)/t(1) for N = 1..256 tree tokens (Qwen3-8B shape), host overhead per step
#   hybrid_tree_h200.json    tree verify on the hybrid 27B shape: cost vs nodes, GDN kernel, commit, memory
#   bench_8b_h200.json       specpilot bench, random:Qwen3-8B + random DFlash (5 layers), synthetic:dflash2-gsm8k
#   w12n_gemv_h200.json      W12N vs cuBLAS vs our bf16 GEMV vs FP8 view per projection shape, SASS counts
#   gdn_tree_kernel_h200.json  the GDN tree kernel per (requests, nodes, warps, dot precision) vs the torch form
#   spec_step_27b_h200.json  one 27B speculative step (chain:7, random DFlash, synthetic): ms per phase and kernel
#   ar_decode_h200.json      AR decode (ours, cuBLAS, W12N, HF generate) at 1x512 1x4096 8x512 32x512, profile
#   (opt-in) bench_27b_long_h200.json, gemv_skinny32_h200.json, bench_zoo_{dense,hybrid}_h200.json
#
# Most important first. Each step runs under `timeout`: step i must end by the sum of the caps of the steps run
# so far (time a step leaves unused goes to the next ones). The caps come from the H200 run of 2026-11-30, where
# the kernel checks, verify_cost and hybrid_tree all hit caps of 45 / 75 / 60 s; SUITE_BUDGET_S (default 540) scales
# them by SUITE_BUDGET_S / 540. A step that
# fails or times out leaves its JSON as far as it got (each script rewrites it after every measurement) and
# the next step runs. The bench plots go to /tmp (OUTDIR may hold 8 files).
#
# Environment: SUITE_DRY=1 runs every step on the CPU on tiny shapes (a check of the scripts, minutes);
# SUITE_DATA_DIR (default .data/prompts) holds the prompt sets; SUITE_BENCH_TOKENS (default 128) the bench's new tokens
# per prompt; SUITE_BUDGET_S scales all caps; SUITE_ONLY="a b"
# runs only the named steps (their caps only count), e.g. to split the suite over two calls.

OUT=${1:?usage: bash bench/gpu_suite.sh OUTDIR COMMIT}
COMMIT=${2:?usage: bash bench/gpu_suite.sh OUTDIR COMMIT}
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/suite.log"
cd "$(dirname "$0")/.." || exit 1  # the repository root

DRY=${SUITE_DRY:-0}
BUDGET=${SUITE_BUDGET_S:-540}
DATA=${SUITE_DATA_DIR:-.data/prompts}
if [ ! -f "$DATA/eagle/gsm8k_question.jsonl" ]; then  # the bench's gsm8k set: try the usual other homes
    for d in specpilot/data/prompts shared/data/prompts ../shared/data/prompts; do
        [ -f "$d/eagle/gsm8k_question.jsonl" ] && DATA=$d && break
    done
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export SPECPILOT_COMMIT="$COMMIT"
KERNEL_TESTS="${SUITE_KERNEL_TESTS:-$OUT/kernel_tests_h200.xml}"  # or an earlier call's
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
if [ "$DRY" = 1 ]; then
    export TRITON_INTERPRET=1
    BUDGET=${SUITE_BUDGET_S:-2400}  # the CPU is slow; the caps scale with the budget
fi

log() { echo "[suite $(date +%H:%M:%S) +$((SECONDS - START))s] $*" | tee -a "$LOG"; }

START=$SECONDS
DEADLINE=0
# step NAME CAP_S COMMAND...: runs COMMAND until START + (sum of caps so far), scaled to the budget
step() {
    local name=$1 cap=$(( $2 * BUDGET / 540 ))
    shift 2
    if [ -n "${SUITE_ONLY:-}" ] && [[ " $SUITE_ONLY " != *" $name "* ]]; then
        log "SKIP $name: not in SUITE_ONLY"
        return
    fi
    DEADLINE=$(( DEADLINE + cap ))
    local left=$(( DEADLINE - (SECONDS - START) ))
    if [ "$left" -lt 15 ]; then
        log "SKIP $name: ${left}s left of its window"
        return
    fi
    log "START $name (cap ${cap}s, timeout ${left}s): $*"
    local t0=$SECONDS
    timeout -k 5 "$left" "$@" >>"$LOG" 2>&1
    local rc=$?
    local what="rc=$rc"
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && what="TIMED OUT (rc=$rc)"
    log "END $name: $what after $((SECONDS - t0))s"
}

# the kernel tests' verdict for the checks named PREFIX.*: ok, failed (a test failed or errored), or unknown (no
# report, or every such test skipped)
kstatus() {
    python3 - "$KERNEL_TESTS" "$@" <<'PY' 2>/dev/null || echo unknown
import sys
import xml.etree.ElementTree as ET

prefixes = tuple(p + "." for p in sys.argv[2:])
cases = [c for c in ET.parse(sys.argv[1]).iter("testcase") if c.get("name", "").partition("[")[2].startswith(prefixes)]
bad = any(c.find("failure") is not None or c.find("error") is not None for c in cases)
ran = any(c.find("skipped") is None for c in cases)
print("failed" if bad else "ok" if ran else "unknown")
PY
}

: >"$LOG"
log "suite: out=$OUT commit=$COMMIT dry=$DRY budget=${BUDGET}s data=$DATA"
[ -f "$DATA/eagle/gsm8k_question.jsonl" ] || log "WARNING: no $DATA/eagle/gsm8k_question.jsonl: the bench steps will fail"
timeout 10 nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv >>"$LOG" 2>&1

if [ "$DRY" = 1 ]; then
    DEV=(--device cpu)
    T27=random:tiny-hybrid; T8=random:tiny-dense
    BENCH_SIZE=(--limit 2 --batch-sizes 1 2 --max-new-tokens 8)
    LONG_SIZE=(--limit 1 --batch-sizes 1 --max-new-tokens 12)
    ZOO_SIZE=(--limit 2 --batch-sizes 1 2 --max-new-tokens 16)
    VC=(--shape tiny-dense --sizes 1 4 --configs 1x32 2x16 --reps 2 --overhead-steps 3)
    HT=(--shape tiny-hybrid --sizes 1 4 8 --configs 1x32 2x16 --reps 2)
    GK=(--batches 1 --nodes 4 9 --warps 4 --precisions ieee tf32x3 --reps 1 --heads 2 6 --dim 16)
    SS=(--steps 2 --warmup 1 --prompt 16)
    WG=(--ms 1 4)
    AR=(--shapes tiny-dense tiny-hybrid --configs 1x16 2x16 --steps 3 --hf-tokens 3)
    AR_ONE=(1x16 --steps 3)
else
    DEV=()
    T27=random:Qwen3.5-27B; T8=random:Qwen3-8B
    BENCH_SIZE=(--limit 8 --batch-sizes 1 8 --max-new-tokens ${SUITE_BENCH_TOKENS:-128})
    LONG_SIZE=(--limit 2 --batch-sizes 1 --max-new-tokens 2048)  # the bench's default length: ~240 s at 27B
    ZOO_SIZE=(--limit 8 --batch-sizes 1 8 --max-new-tokens 256)
    VC=(--reps 10 --ab-layers-per-graph 4)  # the t(N)/t(1) sweep (4 configs, --reps 20) took ~120 s at 22d4117
    HT=(--reps 5)  # ~95 s in all (2026-11-30, 673dc2a: checks 7 s, sweeps 72 s, commit section 18 s)
    GK=(--nodes 1 16 32 64 --warps 4 8 --precisions ieee tf32 tf32x3)
    SS=()
    WG=(--large-ms 64)  # the decode kernel + cuBLAS, for products of more than 16 rows
    AR=(--configs 1x512 1x4096 8x512 32x512 --steps 40 --hf-tokens 8)
    AR_ONE=(1x512 --steps 100)
fi

# 0. Triton kernels vs references (GPU tests; skipped on a dry run); a kernel that failed is left out of the later
# steps: its configurations, and the steps that time it
step kernel_tests 150 env TRITON_INTERPRET=0 python3 -m pytest -m gpu tests/gpu/test_kernels.py -q -p no:cacheprovider \
    --junitxml="$KERNEL_TESTS"
QK=$(kstatus qk_norm_rope_store); TA=$(kstatus tree_attention); GT=$(kstatus gdn_tree tree_conv)
WN=$(kstatus w12n_gemv fp8_gemv)
log "kernel verdicts: qk_norm_rope_store=$QK tree_attention=$TA gdn_tree=$GT w12n_gemv+fp8_gemv=$WN"
# step_unless VERDICT NAME CAP COMMAND...: the step, unless its kernel failed its tests
step_unless() {
    local verdict=$1
    shift
    if [ "$verdict" = failed ] && { [ -z "${SUITE_ONLY:-}" ] || [[ " $SUITE_ONLY " == *" $1 "* ]]; }; then
        log "SKIP $1: its kernel failed tests/gpu/test_kernels.py"
        return
    fi
    step "$@"
}
# the fused decode prologue runs in every AR decode step (EngineConfig.ablations.fused_qk_rope_store, on by
# default): if it failed its check, every runner goes without it
# AR, stock and every configuration run the engine's GPU path: the captured verify graph with the tree-attention
# op ("stock" is the speculation setting, chain:7, bf16, no tuning, not an eager runtime)
ENGINE="block_attention:tree;verify_graphs:true"; AR_BASE=()
[ "$TA" = failed ] && ENGINE="block_attention:sdpa"
[ "$QK" = failed ] && ENGINE="$ENGINE;fused_qk_rope_store:false" && AR_BASE=(--no-fused-prologue)
BASE_ENGINE=(--engine "$ENGINE")

# the bench configurations beside AR and stock: none that needs a kernel which failed its tests. Trees are at most 7 deep (a DFlash block of 8); under
# synthetic acceptance a dynamic tree is shaped by the profile's chances. Expected tau under dflash2-gsm8k
# (AcceptanceProfile.expected_tau): chain:7 5.46, dynamic:4,7,15 (16 rows, the skinny GEMV's 16-row tile) 5.79,
# dynamic:4,7,28 (29 rows) 6.10.
configs() {  # configs dense|hybrid
    local out=()
    if [ "$1" = dense ] || [ "$GT" != failed ]; then
        out+=("tree16=tree:dynamic:4,7,15" "tree29=tree:dynamic:4,7,28")
    fi
    [ "${#out[@]}" -gt 0 ] && printf '%s\n' "${out[@]}"
    return 0
}
mapfile -t C27 < <(configs hybrid)
mapfile -t C8 < <(configs dense)

# 5. where a 27B speculative step's time goes (per phase and kernel), then the 27B shape end to end
step spec_step 90 python3 -m bench spec_step --target "${T27#random:}" --tree chain:7 --engine "$ENGINE" \
    --out "$OUT/spec_step_27b_h200.json" --commit "$COMMIT" "${SS[@]}" "${DEV[@]}"
: AR vs stock vs the fast configurations, batch 1 and 8, token forcing
step bench_27b 140 python3 -m specpilot bench --target "$T27" --drafter random-dflash \
    --acceptance synthetic:dflash2-gsm8k --workloads gsm8k --data-dir "$DATA" "${BENCH_SIZE[@]}" \
    --stock-tree chain:7 "${BASE_ENGINE[@]}" --configs "${C27[@]}" --out "$OUT/bench_27b_h200.json" --plot /tmp/bench_27b_h200.png "${DEV[@]}"

# issue 7's target row, opt-in (SUITE_ONLY must name it): batch 1 at the bench's default 2,048 tokens, stock against
# the trees (the 2-prompt run of 21bc29a had only tree29, rank-shaped, which fell behind stock)
if [[ " ${SUITE_ONLY:-} " == *" bench_27b_long "* ]]; then
    step bench_27b_long 480 python3 -m specpilot bench --target "$T27" --drafter random-dflash \
        --acceptance synthetic:dflash2-gsm8k --workloads gsm8k --data-dir "$DATA" "${LONG_SIZE[@]}" \
        --stock-tree chain:7 "${BASE_ENGINE[@]}" --configs "${C27[@]}" --out "$OUT/bench_27b_long_h200.json" \
        --plot /tmp/bench_27b_long_h200.png "${DEV[@]}"
fi

# issue 30, opt-in (SUITE_ONLY must name them): fla-core's GDN kernels against our references, then the prefill
# benchmark (GDN layer forms, whole-model prefill TFLOP/s, per-chunk times, fresh-process TTFT)
if [[ " ${SUITE_ONLY:-} " == *" fla_tests "* ]]; then
    step fla_tests 150 env TRITON_INTERPRET=0 python3 -m pytest -m gpu tests/gpu/test_fla_gpu.py -q -p no:cacheprovider \
        --junitxml="$OUT/fla_tests_h200.xml"
fi
if [[ " ${SUITE_ONLY:-} " == *" prefill "* ]]; then
    PF=(--budget-s 400); [ "$DRY" = 1 ] && PF=(--smoke)
    step prefill 420 python3 -m bench prefill --out "$OUT/prefill_h200.json" --commit "$COMMIT" "${PF[@]}"
fi
# (b) and (c) alone, the GDN layer forms being measured (prefill_gdn_h200.json, a4c4d7a): whole-model TFLOP/s
if [[ " ${SUITE_ONLY:-} " == *" prefill_model "* ]]; then
    PF=(--budget-s 480 --skip-gdn-layer --skip-ttft); [ "$DRY" = 1 ] && PF=(--smoke --skip-gdn-layer --skip-ttft)
    step prefill_model 500 python3 -m bench prefill --out "$OUT/prefill_model_h200.json" --commit "$COMMIT" "${PF[@]}"
fi

# the twentieth session's opt-in steps (SUITE_ONLY must name them). The exactness gate alone took over 380 s for 33
# of its 44 tests on the H200 (run it in a call of its own; 4 parallel shards ran out of memory); the server's load
# needs fastapi, starlette, pydantic(-core), uvicorn, annotated-types, typing-inspection and opentelemetry-api as
# wheels in .whl (install them first, as bench/server_load.py's docstring says)
if [[ " ${SUITE_ONLY:-} " == *" gate "* ]]; then
    step gate 560 env TRITON_INTERPRET=0 python3 -m pytest -m gpu tests/gpu/test_gate_gpu.py \
        tests/gpu/test_gate_full_depth.py -q -p no:cacheprovider --junitxml="$OUT/gate_h200.xml"
fi
if [[ " ${SUITE_ONLY:-} " == *" server_load "* ]]; then
    SL=(--target "$T8" --repeats 2 --requests 32 --loop-lag --clients 2)
    [ "$DRY" = 1 ] && SL=(--target "$T8" --requests 6 --max-tokens 8 --batch 2 --loop-lag)
    step server_load 360 python3 -m bench server_load "${SL[@]}" --out "$OUT/server_load_8b_h200.json" "${DEV[@]}"
fi
# the same load with the HTTP path's engine in the server's thread and in a process of its own (serve
# --engine-process), side by side in one run, AR only (the speculative engine's rows come from server_load)
if [[ " ${SUITE_ONLY:-} " == *" server_load_process "* ]]; then
    SL=(--target "$T8" --engines ar --repeats 3 --requests 32 --loop-lag --clients 2 --http-engines thread process)
    [ "$DRY" = 1 ] && SL=(--target "$T8" --engines ar --requests 6 --max-tokens 8 --batch 2 --loop-lag \
        --http-engines thread process)
    step server_load_process 400 python3 -m bench server_load "${SL[@]}" \
        --out "$OUT/server_load_8b_engine_process_h200.json" "${DEV[@]}"
fi
if [[ " ${SUITE_ONLY:-} " == *" drafter_proposal "* ]]; then
    DP=(); [ "$DRY" = 1 ] && DP=(--target tiny-hybrid --batches 1 3 --context 24 --reps 2 --warmup 1)
    step drafter_proposal 100 python3 -m bench drafter_proposal --out "$OUT/drafter_proposal_27b_h200.json" \
        "${DP[@]}" "${DEV[@]}"
fi
if [[ " ${SUITE_ONLY:-} " == *" sampling_27b "* ]]; then
    SP=(--limit 4 --batch-sizes 1 --max-new-tokens 256); [ "$DRY" = 1 ] && SP=("${BENCH_SIZE[@]}")
    step sampling_27b 300 python3 -m specpilot bench --target "$T27" --drafter random-dflash \
        --acceptance synthetic:dflash2-gsm8k --workloads gsm8k --data-dir "$DATA" "${SP[@]}" --stock-tree chain:7 \
        "${BASE_ENGINE[@]}" --configs "tree16=tree:dynamic:4,7,15" --temperature 0 0.7 --seed 0 \
        --out "$OUT/bench_27b_sampling_b1_h200.json" --plot /tmp/bench_27b_sampling_b1_h200.png "${DEV[@]}"
fi

# the skinny GEMV at 16, 24 and 32 rows on the 27B projections (tree verify blocks above 16 nodes)
[ "$DRY" = 1 ] || step gemv_skinny 100 python3 -m bench gemv --skinny --rows 16 24 32 --shapes 27B \
    --out "$OUT/gemv_skinny32_h200.json" --commit "$COMMIT"

# the zoo pairs with their real acceptance (issue 7): trained targets, their DFlash drafters, HumanEval held out
for pair in dense hybrid; do
    step "bench_zoo_$pair" 60 python3 -m specpilot bench --target "zoo/$pair" --drafter "zoo/$pair-dflash" \
        --workloads humaneval --data-dir "$DATA" "${ZOO_SIZE[@]}" "${BASE_ENGINE[@]}" \
        --configs "tree16=tree:dynamic:4,7,15" \
        --out "$OUT/bench_zoo_${pair}_h200.json" --plot "/tmp/bench_zoo_${pair}_h200.png" "${DEV[@]}"
done

# 3. verify cost vs tree size (SDPA and tree attention) and host overhead per step at batch 1
step_unless "$TA" verify_cost 200 python3 -m bench verify_cost --out "$OUT/verify_cost_h200.json" --commit "$COMMIT" \
    "${VC[@]}" "${DEV[@]}"

# 4. hybrid tree verification (27B shape): the GDN tree kernel alone first (warps and dot precision), then the
# verify path end to end
step_unless "$GT" gdn_tree_kernel 90 python3 -m bench gdn_tree_kernel --out "$OUT/gdn_tree_kernel_h200.json" --commit "$COMMIT" \
    "${GK[@]}" "${DEV[@]}"
step_unless "$GT" hybrid_tree 150 python3 -m bench hybrid_tree --out "$OUT/hybrid_tree_h200.json" --commit "$COMMIT" \
    "${HT[@]}" "${DEV[@]}"

# 6. the 8B shape end to end
step bench_8b 80 python3 -m specpilot bench --target "$T8" --drafter random-dflash \
    --acceptance synthetic:dflash2-gsm8k --workloads gsm8k --data-dir "$DATA" "${BENCH_SIZE[@]}" \
    --stock-tree chain:7 "${BASE_ENGINE[@]}" --configs "${C8[@]}" --out "$OUT/bench_8b_h200.json" --plot /tmp/bench_8b_h200.png "${DEV[@]}"

# 1. W12N GEMV per projection shape
step_unless "$WN" w12n_gemv 260 python3 -m bench w12n_gemv --out "$OUT/w12n_gemv_h200.json" --commit "$COMMIT" "${WG[@]}" "${DEV[@]}"

# 2. AR decode: ours vs cuBLAS vs W12N vs HF generate (8B first: the 27B part gets what time is left)
step ar_decode 300 python3 -m bench ar_decode --out "$OUT/ar_decode_h200.json" --commit "$COMMIT" --w12n --profile \
    "${AR[@]}" "${AR_BASE[@]}" "${DEV[@]}"

rm -f "$OUT"/*.tmp  # a write cut by a timeout
log "done in $((SECONDS - START))s; files in $OUT:"
ls -la "$OUT" | tee -a "$LOG"
n=$(find "$OUT" -maxdepth 1 -type f | wc -l)
[ "$n" -le 8 ] || log "WARNING: $n files in $OUT (only 8 come back)"
exit 0
