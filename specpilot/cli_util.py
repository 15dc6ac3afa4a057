"""What every `specpilot` subcommand shares: the stderr console and the --device choice."""

from __future__ import annotations

from rich.console import Console

err = Console(stderr=True, highlight=False, soft_wrap=True)


def pick_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available on this machine; use --device cpu")
    return name
