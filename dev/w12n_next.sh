#!/usr/bin/env bash
# Issue 5, the next H200 session's W12N measurements in one call (dev/LOG.md, fourteenth session), each step under
# its own timeout so that one slow step leaves the others' JSON. Writes OUT/*.json.
#   bash dev/w12n_next.sh OUT COMMIT          (at most about 400 s; run from the repository root, PYTHONPATH=.)
set -u
OUT=$1; C=$2; START=$SECONDS
step() {  # step SECONDS NAME COMMAND...: run it, keep its log tail in the call's output
  local cap=$1 name=$2; shift 2
  echo "== $name at $((SECONDS - START)) s"
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? at $((SECONDS - START)) s"; grep -v "^{" "$OUT/$name.log" | tail -12 | cut -c1-600
}
# every W12N case on the GPU first, the SwiGLU epilogue included (against torch's silu_mul, batch invariance)
step 90 kernel_check python3 bench/kernel_check.py --families w12n_gemv --out "$OUT/kernel_check_w12n_swiglu_h200.json" \
  --commit "$C"
# the SwiGLU epilogue against the product then silu_mul (two kernels), on the gate_up shapes, random weights
step 80 swiglu python3 bench/w12n_gemv.py --out "$OUT/w12n_gemv_swiglu_h200.json" --commit "$C" \
  --ms 1 8 --mma-warps --mma-swiglu --shapes 8B.gate_up 27B.gate_up
# the 8B end to end with the MLP's SwiGLU in the gate_up GEMV: random weights (profiled), then clean weights
step 150 ar_8b_random python3 bench/ar_decode.py --out "$OUT/ar_decode_w12n_swiglu_8b_random_h200.json" --commit "$C" \
  --shapes Qwen3-8B --configs 1x512 --steps 40 --w12n --skip-checks --skip-hf --profile
step 150 ar_8b_clean python3 bench/ar_decode.py --out "$OUT/ar_decode_w12n_swiglu_8b_clean_h200.json" --commit "$C" \
  --shapes Qwen3-8B --configs 1x512 --steps 40 --w12n --skip-checks --skip-hf --clean-weights
echo "done at $((SECONDS - START)) s"
