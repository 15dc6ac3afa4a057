#!/usr/bin/env bash
# Issue 6 probe on a GPU: dflash_probe.py variants side by side, after one shared prep per target (the corpus
# tokens and the 12,288 rollouts the variants read from the cache). Writes OUT/probe.json (every job's
# training.json), OUT/TARGET-VARIANT.tgz (the drafter) and OUT/logs.tgz.
#   bash dev/dflash_probe.sh OUT BUDGET_S TARGET:VARIANT...      e.g. dense:base hybrid:layers3
set -u
OUT=$1; BUDGET=$2; shift 2; W=/tmp/dp; START=$SECONDS
mkdir -p "$W"
python3 -c "from specpilot.train.zoo import _tokenize_once; _tokenize_once('zoo/dense', None, 12000)"
for t in $(printf '%s\n' "$@" | cut -d: -f1 | sort -u); do
  python3 dev/dflash_probe.py prep "$W/prep-$t" "zoo/$t" > "$W/prep-$t.log" 2>&1 &
done
wait
echo "prep done at $((SECONDS - START)) s"
left=$((BUDGET - (SECONDS - START) - 25))
for job in "$@"; do
  t=${job%%:*}; v=${job#*:}
  timeout "$left" python3 dev/dflash_probe.py "$v" "$W/$t-$v" "zoo/$t" > "$W/$t-$v.log" 2>&1 &
done
wait
echo "variants done at $((SECONDS - START)) s"
python3 - "$W" "$OUT/probe.json" <<'PY'
import json, pathlib, sys
w = pathlib.Path(sys.argv[1])
rows = {d.name: json.loads((d / "training.json").read_text()) for d in sorted(w.iterdir())
        if (d / "training.json").exists()}
pathlib.Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
for k, r in rows.items():
    print(k, r["steps"], "first", round(r["held_out_first_token_accuracy"], 4), "chain", round(r["held_out_chain_tau"], 3),
          "loss", round(r["held_out_loss"], 3), r["held_out_position_accuracy"])
PY
for d in "$W"/*/; do
  v=$(basename "$d"); rm -rf "$d/checkpoint"
  [ -f "$d/training.json" ] && [ "${v#prep}" = "$v" ] && tar -czf "$OUT/$v.tgz" -C "$W" "$v"
done
tar -czf "$OUT/logs.tgz" -C "$W" $(cd "$W" && ls *.log)
tail -c 300 "$W"/*.log
