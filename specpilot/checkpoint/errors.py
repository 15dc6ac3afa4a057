"""The error a checkpoint that cannot be read or loaded as given raises (the CLI prints it as one line, exit 2)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as given; the message names the file and the tensor."""
