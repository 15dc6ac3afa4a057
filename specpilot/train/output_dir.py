"""The output directory (`--out`) a trainer writes its model into, whole or not at all.

The new files are written into a staging directory beside `out` (checkpoint/staging.py: removed on an error,
SIGINT or SIGTERM, and by the next run once a SIGKILLed process is gone), which then takes the place of `out`.
Entries of an existing `out` that the new files do not replace (the resume checkpoint, `checkpoint/`) move into
the new directory first; a failure before the new directory is in place moves them back and leaves `out` as it
was. Only a SIGKILL between the two renames of the swap leaves no `out` (its old entries are then in a staging
directory that the next run removes).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from specpilot.checkpoint.staging import publish, staging_dir


@contextmanager
def output_dir(out: Path) -> Iterator[Path]:
    """A staging directory for `out`'s new files; on a clean exit it replaces `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(out) as tmp:
        yield tmp
        _replace(out, tmp)


def _replace(out: Path, tmp: Path) -> None:
    if not out.exists():
        publish(tmp, out)
        return
    with staging_dir(out) as old:  # why: an empty directory, so that the rename of `out` onto it succeeds
        out.rename(old)
        kept = [p.name for p in old.iterdir() if not (tmp / p.name).exists()]
        moved = []
        try:
            for name in kept:
                (old / name).rename(tmp / name)
                moved.append(name)
            publish(tmp, out)
        except BaseException:
            for name in moved:
                (tmp / name).rename(old / name)
            old.rename(out)
            raise


def save_drafter(out: Path, tensors: dict[str, torch.Tensor], config: dict, report: dict) -> None:
    """`out` as a drafter directory: the weights (model.safetensors), config.json and training.json."""
    from safetensors.torch import save_file

    with output_dir(out) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        (tmp / "training.json").write_text(json.dumps(report, indent=1))


def cast_state(state: dict[str, torch.Tensor], save_dtype: str, keep: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """The tensors on the CPU in `save_dtype`, but those named in `keep` (index maps) as they are."""
    dtype = getattr(torch, save_dtype)
    return {k: (v if k in keep else v.to(dtype)).cpu() for k, v in state.items()}
