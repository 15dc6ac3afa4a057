"""`python3 -m bench NAME [args]`: runs benchmark NAME (bench/NAME.py's main(args)); `--help` lists them."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import bench
from specpilot.checkpoint.errors import CheckpointError
from specpilot.config import ConfigError


def benchmarks() -> list[str]:
    """Every module of the package but the shared ones, by name."""
    return sorted(m.name for m in pkgutil.iter_modules(bench.__path__)
                  if m.name not in bench.SHARED and not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(bench.__doc__)
        return 0
    names = benchmarks()
    if not argv or argv[0] not in names:
        what = f"no benchmark {argv[0]!r}" if argv else "no benchmark named"
        print(f"error: {what}: run python3 -m bench NAME [args] with NAME one of {', '.join(names)} "
              f"(--help says what each measures)", file=sys.stderr)
        return 2
    try:
        return importlib.import_module(f"bench.{argv[0]}").main(argv[1:]) or 0
    except (CheckpointError, ConfigError, ValueError, FileNotFoundError, FileExistsError) as e:
        # bad input found past the flags (a checkpoint, a config, a file): one line and status 2, as the CLI does
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
