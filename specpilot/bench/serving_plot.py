"""The serving benchmark's figures (matplotlib, Agg): closed loop, throughput and speedup against batch size; open
loop, TPOT and TTFT (p50 solid, p99 dashed) against the offered load. Rows come from specpilot/bench/serving.py;
a synthetic-acceptance run says so in the title."""

from __future__ import annotations

from pathlib import Path

COLORS = {"ar": "tab:gray", "spec": "tab:blue"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ok(rows: list[dict], mode: str, engine: str) -> list[dict]:
    return [r for r in rows if r.get("mode") == mode and r.get("engine") == engine and "error" not in r
            and r.get("role") != "capacity"]


def _title(rows: list[dict], title: str) -> str:
    label = next((r["synthetic"] for r in rows if r.get("synthetic")), None)
    return title + (f"\nSYNTHETIC acceptance: {label}" if label else "")


def plot_closed(rows: list[dict], path: str | Path, title: str = "closed loop") -> None:
    """Output tokens/s of AR and the speculative engine against the number of clients, and the speedup."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for engine in ("ar", "spec"):
        pts = sorted((r["batch"], r["throughput_tok_s"]) for r in _ok(rows, "closed", engine))
        if pts:
            left.plot(*zip(*pts), marker="o", color=COLORS[engine], label=engine)
    spec = sorted((r["batch"], r["speedup_vs_ar"]) for r in _ok(rows, "closed", "spec") if "speedup_vs_ar" in r)
    if spec:
        bars = right.bar([str(b) for b, _ in spec], [v for _, v in spec], color=COLORS["spec"])
        right.bar_label(bars, labels=[f"{v:.2f}x" for _, v in spec], fontsize=8, padding=2)
    right.axhline(1.0, color="gray", linewidth=0.8)
    left.set_xscale("log", base=2)
    batches = sorted({r["batch"] for r in _ok(rows, "closed", "ar") + _ok(rows, "closed", "spec")})
    left.set_xticks(batches, [str(b) for b in batches])
    left.minorticks_off()
    left.set_xlabel("concurrent clients (batch)")
    left.set_ylabel("output tokens/s")
    left.legend()
    right.set_xlabel("concurrent clients (batch)")
    right.set_ylabel("speedup over AR (tokens/s)")
    right.margins(y=0.15)
    fig.suptitle(_title(rows, title))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_open(rows: list[dict], path: str | Path, title: str = "open loop") -> None:
    """TPOT and TTFT percentiles of AR and the speculative engine against the offered load (fraction of AR's
    capacity)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric, name in zip(axes, ("tpot", "ttft"), ("time per output token (ms)", "time to first token (ms)")):
        for engine in ("ar", "spec"):
            pts = sorted(_ok(rows, "open", engine), key=lambda r: r["load"])
            for q, style in (("p50", "-"), ("p99", "--")):
                xy = [(r["load"], r[f"{metric}_{q}_ms"]) for r in pts if r.get(f"{metric}_{q}_ms") is not None]
                if xy:
                    ax.plot(*zip(*xy), style, marker="o", color=COLORS[engine], label=f"{engine} {q}")
        ax.set_xlabel("offered load (fraction of AR capacity)")
        ax.set_ylabel(name)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(_title(rows, title))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(rows: list[dict], path: str | Path, title: str) -> None:
    """The figure of the rows' mode."""
    if any(r.get("mode") == "open" for r in rows):
        plot_open(rows, path, title)
    else:
        plot_closed(rows, path, title)
