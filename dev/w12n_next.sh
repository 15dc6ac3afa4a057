#!/usr/bin/env bash
# Issue 5, the next H200 session's W12N measurements in one call (dev/LOG.md, thirteenth session, "Next"), each
# step under its own timeout so that one slow step leaves the others' JSON. Writes OUT/*.json.
#   bash dev/w12n_next.sh OUT COMMIT          (at most about 330 s; run from the repository root, PYTHONPATH=.)
set -u
OUT=$1; C=$2; START=$SECONDS
step() {  # step SECONDS NAME COMMAND...: run it, keep its log tail in the call's output
  local cap=$1 name=$2; shift 2
  echo "== $name at $((SECONDS - START)) s"
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? at $((SECONDS - START)) s"; grep -v "^{" "$OUT/$name.log" | tail -12 | cut -c1-600
}
# every W12N case on the GPU first (bitwise batch invariance, exact decode, FP8 view)
step 90 kernel_check python3 bench/kernel_check.py --families w12n_gemv --out "$OUT/kernel_check_w12n_h200.json" \
  --commit "$C"
# the small shapes with verbatim segments (random weights), where the pass after the loop costs 10-20%: the
# default against the paired pass (pair=True: the second listed segment's loads with the first's)
step 90 small_random python3 bench/w12n_gemv.py --out "$OUT/w12n_gemv_small_random_h200.json" --commit "$C" \
  --ms 1 8 --mma-warps --mma-pair --shapes 27B.o_proj 27B.gdn_out_proj 8B.qkv 8B.o_proj 8B.down 27B.down
# the 8B end to end on random weights (verbatim segments) at the current launch
step 150 ar_8b_random python3 bench/ar_decode.py --out "$OUT/ar_decode_w12n_8b_random_h200.json" --commit "$C" \
  --shapes Qwen3-8B --configs 1x512 --steps 40 --w12n --skip-checks --skip-hf --profile
echo "done at $((SECONDS - START)) s"
