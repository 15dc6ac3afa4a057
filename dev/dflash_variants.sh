#!/usr/bin/env bash
# Issue 6 experiment: DFlash drafters for the zoo's two targets, trained on long-prompt rollouts (384 corpus tokens,
# 128 generated; anchors in the generated part) with 64 anchors per sequence, target layers 1,4,7 (v2; the zoo's
# drafters read 1,5). A 50-step probe per target first (it also caches the rollouts) sets the step count that
# fits the time left. Writes OUT/drafters.tgz (the two drafter directories and logs).
#   bash dev/dflash_variants.sh OUT BUDGET_S
set -u
OUT=$1; BUDGET=${2:-520}; W=/tmp/dv; START=$SECONDS
mkdir -p "$W"
python3 -c "from specpilot.train.zoo import _tokenize_once; _tokenize_once('zoo/dense', None, 12000)"
common=(--kind dflash --batch-size 16 --seq-len 512 --lr 2e-3 --warmup 100 --block-size 8 --draft-layers 2
        --max-files 12000 --device cuda --anchors 64 --rollouts 12288 --rollout-prompt-len 384 --save-every 100000)
for t in dense hybrid; do
  python3 -m specpilot train drafter --target zoo/$t --out "$W/probe-$t" --steps 50 "${common[@]}" \
    > "$W/probe-$t.log" 2>&1 &
done
wait
echo "probes done at $((SECONDS - START)) s"; tail -c 400 "$W"/probe-*.log
rate=$(python3 - "$W" <<'PY'
import json, re, sys, pathlib
rates = []
for f in pathlib.Path(sys.argv[1]).glob("probe-*.log"):
    m = re.findall(r"([\d,]+) tok/s", f.read_text())
    rates.append(float(m[-1].replace(",", "")) / (16 * 512) if m else 1.0)
print(min(rates))
PY
)
left=$((BUDGET - (SECONDS - START) - 40))
STEPS=$(python3 -c "print(max(200, min(6000, int(0.9 * $rate * $left / 100) * 100)))")
echo "probe rate $rate steps/s (2 jobs); $left s left -> $STEPS steps per job (2 jobs)"
for t in dense hybrid; do
  python3 -m specpilot train drafter --target zoo/$t --out "$W/$t-v2" --steps "$STEPS" --target-layers 1,4,7 \
    "${common[@]}" > "$W/$t-v2.log" 2>&1 &
done
wait
echo "training done at $((SECONDS - START)) s"
rm -rf "$W"/probe-*/checkpoint "$W"/*/checkpoint
tar -czf "$OUT/drafters.tgz" -C "$W" .
for f in "$W"/*/training.json; do echo "$f"; cat "$f"; done
