"""What every `specpilot` subcommand shares: the stderr console, the --device choice and the check of an output
file's path."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

# no emoji codes: a message naming `mtp:x` or a path `:smile:` prints as written
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


def pick_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available on this machine; use --device cpu")
    return name


def check_writable(flag: str, text: str) -> None:
    """The file can be written: not a directory, and its nearest existing folder takes new entries."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise ValueError(f"{flag} {text}: is a directory; give a file path in it")
    folder = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    if not folder.is_dir():
        raise ValueError(f"{flag} {text}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {text}: cannot write in {folder} (permission denied)")
