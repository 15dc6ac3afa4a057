#!/usr/bin/env bash
# Issue 5, the next H200 session's W12N measurements in one call (dev/LOG.md, fourteenth session), each step under
# its own timeout so that one slow step leaves the others' JSON. Writes OUT/*.json.
#   bash dev/w12n_next.sh OUT COMMIT          (at most about 330 s; run from the repository root, PYTHONPATH=.)
set -u
OUT=$1; C=$2; START=$SECONDS
step() {  # step SECONDS NAME COMMAND...: run it, keep its log tail in the call's output
  local cap=$1 name=$2; shift 2
  echo "== $name at $((SECONDS - START)) s"
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? at $((SECONDS - START)) s"; grep -v "^{" "$OUT/$name.log" | tail -6 | cut -c1-400
}
# the 8B end to end, side by side: the SwiGLU epilogue with its PDL trigger after the K loop (default), without the
# epilogue (product, then silu_mul), with the trigger at the kernel's start; random weights, then clean ones
step 170 ar_8b_random python3 bench/ar_decode.py --out "$OUT/ar_decode_w12n_ab_8b_random_h200.json" --commit "$C" \
  --shapes Qwen3-8B --configs 1x512 --steps 40 --w12n --w12n-ab --skip-checks --skip-hf
step 170 ar_8b_clean python3 bench/ar_decode.py --out "$OUT/ar_decode_w12n_ab_8b_clean_h200.json" --commit "$C" \
  --shapes Qwen3-8B --configs 1x512 --steps 40 --w12n --w12n-ab --skip-checks --skip-hf --clean-weights
python3 - "$OUT" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/ar_decode_*.json")):
    r = json.load(open(f))["shapes"][0]["runs"][0]
    ab = {k: round(v.get("step_ms_median", 0), 3) for k, v in r.get("w12n_ab", {}).items()}
    print(f.split("/")[-1], "bf16", round(r["step_ms_median"], 3), "w12n", round(r["w12n_variant"]["step_ms_median"], 3), ab)
PY
echo "done at $((SECONDS - START)) s"
