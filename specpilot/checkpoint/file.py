"""One safetensors file of a checkpoint: opened with a diagnosis of what is wrong with a damaged one, and read by
source tensor with each tensor's CRC-32 (checksum.py) checked.

A source tensor is stored either as itself or as a group of planes under the keys `{name}{PLANE_GROUP_MARK}*`
(a W12N matrix, written by `specpilot compress`). This file knows groups only by that key mark: it lists a
group as one tensor and hands back its planes, checked; `weights/w12n_file.py` turns them into weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from specpilot.checkpoint import checksum
from specpilot.checkpoint.errors import CheckpointError

PLANE_GROUP_MARK = ".w12n_"  # key `{name}.w12n_{plane}`: one plane of the group that stores source tensor `name`


def open_safetensors(file: Path):
    """safe_open of one checkpoint file (use it as a context manager); a file safetensors cannot read raises
    CheckpointError naming it, what is wrong with it and what to do."""
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except SafetensorError as e:
        raise CheckpointError(f"{file}: {_what_is_wrong(file, e)}; {_remedy(file)}") from None


def _what_is_wrong(file: Path, err: Exception) -> str:
    """Why safetensors refused `file`, told from its size and its header (8-byte length, then JSON)."""
    size = file.stat().st_size
    with open(file, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"truncated ({size} bytes, shorter than a safetensors header)"
        if head == b"version ":
            return "not a safetensors file (a Git LFS pointer: fetch the real file with `git lfs pull`)"
        header_len = int.from_bytes(head, "little")
        first = fh.read(1)
        if first != b"{":
            return "not a safetensors file"
        if 8 + header_len > size:
            return f"truncated ({size:,} bytes, inside its {header_len:,}-byte header)"
        try:
            header = json.loads(first + fh.read(header_len - 1))
        except ValueError as e:
            return f"header corrupt (not JSON: {e})"
        try:
            end = 8 + header_len + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                                       default=0)
        except (TypeError, KeyError, IndexError, AttributeError):
            return "header corrupt (a tensor entry without data_offsets)"
    if size < end:
        return f"truncated ({size:,} of {end:,} bytes)"
    if size > end:
        return f"corrupt ({size - end:,} bytes past the end of its data)"
    reason = str(err).removeprefix("Error while deserializing header: ")
    return f"header corrupt ({reason[:120]}{'...' if len(reason) > 120 else ''})"


def _remedy(file: Path) -> str:
    if (file.parent / "w12n.json").exists():  # written by specpilot compress
        return "re-run `specpilot compress` on its source model (or fetch this directory again)"
    return "download it again"


class CheckpointFile:
    """One safetensors file of a checkpoint, by source tensor: a plane group counts as one tensor (`groups`, read
    with `read_planes`), and in a file with checksums (specpilot compress) every tensor read is checked against its
    own. A file with plane groups but no checksums (W12N format version 1) is refused unless `unverified_groups`
    (compress rewrites such a file)."""

    def __init__(self, path: Path, unverified_groups: bool = False):
        self.path = Path(path)
        self.handle = open_safetensors(self.path)
        self.keys = set(self.handle.keys())
        self.groups = sorted({k.rsplit(PLANE_GROUP_MARK, 1)[0] for k in self.keys if PLANE_GROUP_MARK in k})
        self.names = sorted([k for k in self.keys if PLANE_GROUP_MARK not in k] + self.groups)
        try:
            self.sums = checksum.from_metadata(self.handle.metadata())
        except ValueError as e:
            raise self.corrupt(str(e)) from None
        if self.groups and self.sums is None and not unverified_groups:
            raise CheckpointError(
                f"{self.path}: W12N tensors without checksums (format version 1, written by an older specpilot); "
                f"rewrite the directory with `specpilot compress {self.path.parent} NEW_DIR`")

    def __enter__(self) -> CheckpointFile:
        return self

    def __exit__(self, *exc) -> None:
        self.handle.__exit__(*exc)

    def corrupt(self, what: str) -> CheckpointError:
        """The error for this file holding something wrong: the file, `what`, and what to do."""
        return CheckpointError(f"{self.path}: {what}; {_remedy(self.path)}")

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape of a tensor that is not a plane group."""
        self._stored(name)
        return tuple(self.handle.get_slice(name).get_shape())

    def read(self, name: str) -> torch.Tensor:
        """The values of a tensor that is not a plane group, checksum checked."""
        self._stored(name)
        return self._checked(name, [name])[0]

    def read_planes(self, name: str, keys: list[str]) -> dict[str, torch.Tensor]:
        """Of the plane group `name`, the planes `keys` that the file holds, checked together against the group's
        checksum; `keys` in the order the checksum covers them (the format's: `w12n.plane_keys`)."""
        keys = [k for k in keys if k in self.keys]  # the format's reader names a missing plane
        return dict(zip(keys, self._checked(name, keys)))

    def _stored(self, name: str) -> None:
        if name in self.groups:
            raise ValueError(f"{self.path}: {name!r} is a plane group; read it with read_planes")

    def _checked(self, name: str, keys: list[str]) -> list[torch.Tensor]:
        tensors = [self.handle.get_tensor(k) for k in keys]
        if self.sums is None:
            return tensors
        stored, got = self.sums.get(name), checksum.crc32(tensors)
        if stored is None:
            raise self.corrupt(f"tensor {name!r} has no checksum in the file's metadata (the header is corrupt)")
        if stored != got:
            raise self.corrupt(f"tensor {name!r} fails its checksum (crc32 {got}, stored {stored}): the file is "
                               f"corrupt")
        return tensors
