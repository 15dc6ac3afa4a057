"""Interleaved A/B of two source trees of specpilot: the same benchmark run by the tree before a change and the
tree after it, alternating process by process (ABBA order, so that drift in the GPU's clocks or temperature
falls on both sides), then per metric the median of each side and their ratio.

Each job is a name and two commands (before, after) with `{out}` where the benchmark writes its JSON; a command
runs in its tree's directory with PYTHONPATH set to it. Understood JSON: `specpilot bench` (tok/s per workload,
batch and configuration) and `bench ar_decode` (step ms median per shape and config).

    python3 dev/ab_trees.py --before /tmp/before --after . --rounds 2 --out /tmp/ab.json \
        --job ar8b 'python3 bench/ar_decode.py --shapes Qwen3-8B --out {out}' \
                   'python3 -m bench ar_decode --shapes Qwen3-8B --out {out}'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def metrics(report: dict) -> dict[str, float]:
    """name -> value (higher or lower is better as the name says: tok_per_s up, step_ms down)."""
    out = {}
    for row in report.get("results") or []:  # specpilot bench
        if "tok_per_s" in row:
            key = f"{row['workload']}/b{row['batch']}/{row['config']}"
            out[f"{key}/tok_per_s"] = row["tok_per_s"]
            split = row.get("seconds_split")
            if split:  # the speculative steps alone: every component but the requests' start, per emitted token
                out[f"{key}/step_ms_per_token"] = 1e3 * (sum(split.values()) - split["start"]) / row["tokens"]
                out[f"{key}/start_s"] = split["start"]
                out[f"{key}/tau"] = row["tau"]
    for shape in report.get("shapes") or []:  # bench ar_decode
        for run in shape.get("runs") or []:
            if "step_ms_median" in run:
                out[f"{shape['shape']}/{run['batch']}x{run['ctx']}/step_ms"] = run["step_ms_median"]
    return out


def run(cmd: str, tree: Path, out: Path, log) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    start = time.perf_counter()
    proc = subprocess.run(cmd.format(out=out), shell=True, cwd=tree, env=env, capture_output=True, text=True)
    log.write(f"$ (cd {tree}) {cmd.format(out=out)}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}\n")
    log.flush()
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{cmd!r} in {tree} failed with exit {proc.returncode}: {proc.stderr[-600:]}")
    found = metrics(json.loads(out.read_text()))
    print(f"  {tree.name or tree}: {len(found)} metrics in {time.perf_counter() - start:.0f} s", flush=True)
    return found


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True)
    except FileNotFoundError:
        return "no GPU"
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "no GPU"


def commit(tree: Path, given: str | None) -> str:
    """`given` (--commit-before / --commit-after), else the tree's git HEAD: a copy shipped to another machine may
    carry a .git whose HEAD is not the copied working tree, so say the commits where they are known."""
    if given:
        return given
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return out.stdout.strip() + " (git HEAD)" if out.returncode == 0 else "unknown"


def summary(sides: dict[str, list[dict[str, float]]]) -> dict:
    """Per metric both sides' values, their medians and after / before; metrics only the after side has apart."""
    common = sorted(set.intersection(*(set(m) for runs in sides.values() for m in runs)))
    job = {}
    for key in common:
        b, a = [m[key] for m in sides["before"]], [m[key] for m in sides["after"]]
        job[key] = {"before": b, "after": a, "median_before": statistics.median(b),
                    "median_after": statistics.median(a),
                    "after_over_before": statistics.median(a) / statistics.median(b)}
        print(f"  {key}: before {job[key]['median_before']:.4g} after {job[key]['median_after']:.4g} "
              f"ratio {job[key]['after_over_before']:.4f}", flush=True)
    only = sorted(set.intersection(*(set(m) for m in sides["after"])) - set(common))
    job["after_only"] = {key: {"after": [m[key] for m in sides["after"]],
                               "median_after": statistics.median(m[key] for m in sides["after"])} for key in only}
    return job


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, type=Path)
    p.add_argument("--after", default=Path("."), type=Path)
    p.add_argument("--rounds", type=int, default=2, help="rounds; each runs every job in both trees, in ABBA order")
    p.add_argument("--budget-s", type=float, default=1e9, help="start no round that would end past this")
    p.add_argument("--job", nargs=3, action="append", required=True, metavar=("NAME", "BEFORE", "AFTER"))
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--log", type=Path, default=None)
    p.add_argument("--label", default="", help="recorded as is (GPU, commits)")
    p.add_argument("--commit-before", default=None, help="the before tree's commit (default: its git HEAD)")
    p.add_argument("--commit-after", default=None, help="the after tree's commit (default: its git HEAD)")
    args = p.parse_args()
    before, after = args.before.resolve(), args.after.resolve()
    log = open(args.log, "a") if args.log else sys.stderr
    report = {"gpu": gpu_name(), "commit_before": commit(before, args.commit_before),
              "commit_after": commit(after, args.commit_after), "label": args.label,
              "command": " ".join(sys.argv), "rounds": args.rounds, "jobs": {}}
    tmp = Path(tempfile.mkdtemp(prefix="ab_"))
    sides = {name: {"before": [], "after": []} for name, _, _ in args.job}
    started = time.perf_counter()
    for r in range(args.rounds):
        if r and time.perf_counter() - started > args.budget_s * r / (r + 1):  # another round would not fit
            print(f"stopping after {r} rounds: the next would pass --budget-s", flush=True)
            break
        for name, cmd_before, cmd_after in args.job:
            print(f"{name}, round {r + 1}:", flush=True)
            order = [("before", before, cmd_before), ("after", after, cmd_after)]
            for side, tree, cmd in (order if r % 2 == 0 else order[::-1]):
                try:
                    sides[name][side].append(run(cmd, tree, tmp / f"{name}_{side}_{r}.json", log))
                except RuntimeError as e:  # recorded; the other runs go on
                    print(f"  {side}: {e}", flush=True)
                    report.setdefault("errors", []).append(f"{name} {side} round {r + 1}: {e}")
            if all(sides[name].values()):
                report["jobs"][name] = summary(sides[name])
                report.setdefault("runs", {})[name] = sides[name]
            report["rounds_done"] = r + 1
            args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
