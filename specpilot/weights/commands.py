"""`specpilot compress` and `specpilot inspect`: flags and commands."""

from __future__ import annotations

import json

from rich.console import Console

from specpilot.cli_util import err


def add_parsers(sub) -> None:
    c = sub.add_parser("compress", help="write a W12N (lossless ~12-bit) copy of a model directory")
    c.add_argument("src", help="model directory or Hub repo id")
    c.add_argument("dst", help="new output directory (written to a temporary path, then renamed)")
    c.add_argument("--format", choices=["w12n"], default="w12n")
    c.add_argument("--segment", type=int, default=None,
                   help="escape segment length (weights per row segment); default: chosen per tensor")
    c.add_argument("--json", action="store_true", help="print the per-tensor report as one JSON object")
    c.set_defaults(func=cmd_compress)
    i = sub.add_parser("inspect", help="bits per weight, escape rate and verbatim fraction of a model directory; "
                                       "checks every checksum of a W12N one")
    i.add_argument("dir", help="model directory or Hub repo id")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_inspect)


def cmd_compress(args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from specpilot.weights.compress import compress

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True, disable=args.json or not err.is_terminal) as bar:
        reports = compress(args.src, args.dst, args.segment, bar)
    _print_weight_report(reports, args.json, f"wrote {args.dst}")
    return 0


def cmd_inspect(args) -> int:
    from specpilot.weights.compress import inspect

    _print_weight_report(inspect(args.dir), args.json, str(args.dir))
    return 0


def _print_weight_report(reports, as_json: bool, title: str) -> None:
    from rich.table import Table

    from specpilot.weights.compress import report_dict, totals

    total = totals(reports)
    if as_json:
        print(json.dumps({"total": total, "tensors": [report_dict(r) for r in reports]}))
        return
    table = Table(title=title)
    for col in ("tensor", "shape", "format", "bits/weight", "escapes", "verbatim"):
        table.add_column(col, justify="left" if col in ("tensor", "format") else "right")
    for r in reports:
        table.add_row(r.name, "x".join(map(str, r.shape)), r.fmt, f"{r.bits_per_weight:.3f}",
                      f"{100 * r.escape_rate:.3f}%", f"{100 * r.verbatim_fraction:.3f}%")
    table.add_row("total", f"{total['parameters']:,}", f"{total['w12n_tensors']}/{total['tensors']} w12n",
                  f"{total['bits_per_weight']:.3f}", f"{100 * total['escape_rate']:.3f}%",
                  f"{100 * total['verbatim_fraction']:.3f}%", style="bold")
    Console(highlight=False).print(table)
