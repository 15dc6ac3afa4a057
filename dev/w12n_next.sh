#!/usr/bin/env bash
# W12N measurements not yet run, in one call (dev/LOG.md, fifteenth session, "Not run"), each
# step under its own timeout so that one slow step leaves the others' JSON. Writes OUT/*.json.
#   bash dev/w12n_next.sh OUT COMMIT          (at most about 560 s; run from the repository root, PYTHONPATH=.)
set -u
OUT=$1; C=$2; START=$SECONDS
step() {  # step SECONDS NAME COMMAND...: run it, keep its log tail in the call's output
  local cap=$1 name=$2; shift 2
  echo "== $name at $((SECONDS - START)) s"
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? at $((SECONDS - START)) s"; grep -v "^{" "$OUT/$name.log" | tail -8 | cut -c1-500
}
# where verbatim segments cost, per shape: segment 512 against 256, the verbatim build, the pass (after any loop change)
step 90 probe python3 dev/w12n_verbatim_probe.py "$OUT/w12n_verbatim_probe_h200.json" "$C"
# the whole Qwen3.5-27B with the SwiGLU epilogue on random weights (verbatim segments, as trained checkpoints have)
step 460 ar_27b_random python3 bench/ar_decode.py --out "$OUT/ar_decode_w12n_only_27b_random_h200.json" --commit "$C" \
  --shapes Qwen3.5-27B --configs 1x512 --steps 40 --w12n-only --skip-checks --skip-hf
echo "done at $((SECONDS - START)) s"
