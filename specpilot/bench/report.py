"""Bench reports: the JSON file (with GPU, commit and command), a rich table, and a matplotlib plot of the
speedups. Rows from synthetic acceptance are labelled so in all three."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from rich.table import Table


def environment() -> dict:
    """GPU, commit (SPECPILOT_COMMIT if set: a copy of the tree without .git, e.g. on a GPU machine), command."""
    commit = os.environ.get("SPECPILOT_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).parent).stdout.strip()
        except OSError:  # no git on this machine
            commit = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "commit": commit or "unknown", "command": " ".join(["specpilot"] + sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__}


def write_json(rows: list[dict], path: str | Path, extra: dict) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({**environment(), **extra, "results": rows}, indent=1))
    tmp.replace(path)


def table(rows: list[dict]) -> Table:
    synthetic = any(r.get("synthetic") for r in rows)
    t = Table(title="specpilot bench" + (" (SYNTHETIC acceptance)" if synthetic else ""))
    for col in ("workload", "batch", "config", "tok/s", "vs AR", "vs stock", "tau", "forcing"):
        t.add_column(col, justify="left" if col in ("workload", "config") else "right")
    several = len({r.get("temperature", 0.0) for r in rows}) > 1  # then each config names its temperature
    for r in rows:
        config = f"{r['config']} T{r.get('temperature', 0.0):g}" if several else r["config"]
        if "error" in r:
            t.add_row(r["workload"], str(r["batch"]), config, "-", "-", "-", "-", f"ERROR: {r['error'][:60]}")
            continue
        f = r.get("forcing")
        verdict = "-" if f is None else ("pass" if f["passed"] else f"FAIL ({f['failures']})")
        tau = f"{r['tau']:.2f}" if "tau" in r else "-"
        vs_stock = f"{r['speedup_vs_stock']:.2f}x" if "speedup_vs_stock" in r else "-"
        t.add_row(r["workload"], str(r["batch"]), config, f"{r['tok_per_s']:.1f}", f"{r['speedup_vs_ar']:.2f}x",
                  vs_stock, tau, verdict)
    return t


def plot(rows: list[dict], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["workload"], r["batch"]) for r in rows})
    configs = [c for c in dict.fromkeys(r["config"] for r in rows) if c != "ar"]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(keys) * max(1, len(configs))), 4))
    width = 0.8 / max(1, len(configs))
    for i, cfg in enumerate(configs):
        vals = [next((r.get("speedup_vs_ar", 0) for r in rows if (r["workload"], r["batch"]) == k
                      and r["config"] == cfg), 0) for k in keys]
        bars = ax.bar([x + i * width for x in range(len(keys))], vals, width, label=cfg)
        ax.bar_label(bars, labels=[f"{v:.2f}x" if v else "" for v in vals], fontsize=8, padding=2)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks([x + width * (len(configs) - 1) / 2 for x in range(len(keys))])
    ax.set_xticklabels([f"{w}\nbatch {b}" for w, b in keys])
    ax.set_ylabel("speedup over AR")
    synthetic = any(r.get("synthetic") for r in rows)
    label = next((r["acceptance"] for r in rows if "acceptance" in r), "")
    # two lines: a long profile name must not run off a narrow figure
    ax.set_title("specpilot bench" + (f"\nSYNTHETIC acceptance ({label})" if synthetic else ""))
    ax.margins(y=0.12)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
