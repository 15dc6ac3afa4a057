#!/usr/bin/env bash
# Issue 5, the next H200 session's W12N measurements in one call (dev/LOG.md, twelfth session, in that order),
# each step under its own timeout so that one slow step leaves the others' JSON. Writes OUT/*.json.
#   bash dev/w12n_next.sh OUT COMMIT          (at most 570 s; run from the repository root, PYTHONPATH=.)
# The 27B step encodes about 27B weights on the host (the 8B took 68 s): if its cap cuts it, give it a call alone.
set -u
OUT=$1; C=$2; START=$SECONDS
step() {  # step SECONDS NAME COMMAND...: run it, keep its log tail in the call's output
  local cap=$1 name=$2; shift 2
  echo "== $name at $((SECONDS - START)) s"
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? at $((SECONDS - START)) s"; grep -v "^{" "$OUT/$name.log" | tail -6 | cut -c1-300
}
# the 8-row launch is in kernel_check: every W12N case on the GPU first
step 80 kernel_check python3 bench/kernel_check.py --families w12n_gemv --out "$OUT/kernel_check_w12n_h200.json" \
  --commit "$C"
# the 8-row launch against the default, random weights (verbatim segments) and clean ones
step 110 rows8 python3 bench/w12n_gemv.py --out "$OUT/w12n_gemv_rows8_h200.json" --commit "$C" --ms 1 8 16 \
  --mma-rows8 --shapes 27B.o_proj 27B.gdn_out_proj 27B.down 27B.gdn_in_proj 8B.qkv 8B.o_proj 8B.down
step 80 rows8_clean python3 bench/w12n_gemv.py --out "$OUT/w12n_gemv_rows8_clean_h200.json" --commit "$C" \
  --ms 1 8 --mma-rows8 --clean-weights --shapes 27B.o_proj 27B.down 27B.gdn_in_proj 8B.o_proj 27B.lm_head
# the whole 27B with the bf16 copies dropped (the W12N encode runs on the host: minutes)
step 300 ar_27b python3 bench/ar_decode.py --out "$OUT/ar_decode_w12n_only_27b_h200.json" --commit "$C" \
  --shapes Qwen3.5-27B --configs 1x512 --steps 40 --w12n-only --skip-checks --skip-hf --clean-weights
echo "done at $((SECONDS - START)) s"
