"""One checkpoint file: a damaged file named with what is wrong and what to do; plane groups listed as one tensor
and read back as planes checked against the group's CRC-32; a file with groups but no checksums refused."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from specpilot.checkpoint import checksum
from specpilot.checkpoint.errors import CheckpointError
from specpilot.checkpoint.file import PLANE_GROUP_MARK, CheckpointFile
from specpilot.models.loader import load_model


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _damaged(data: bytes) -> dict[str, tuple[bytes, str]]:
    """Ways a downloaded or copied safetensors file goes bad -> (file bytes, expected message)."""
    header_len = int.from_bytes(data[:8], "little")
    return {
        "truncated": (data[: len(data) // 2], rf"truncated \({len(data) // 2:,} of {len(data):,} bytes\)"),
        "empty": (b"", r"truncated \(0 bytes"),
        "cut in the header": (data[:40], r"truncated \(40 bytes, inside its"),
        "html": (b"<html><body>rate limited</body></html>\n" * 4, "not a safetensors file"),
        "git lfs pointer": (b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n", "git lfs pull"),
        "header corrupt": (data[:8] + b"{" + b"!" * (header_len - 1) + data[8 + header_len:], "header corrupt"),
        "trailing bytes": (data + b"\0" * 16, "corrupt \\(16 bytes past the end of its data\\)"),
    }


def test_a_damaged_safetensors_file_is_named_with_what_to_do(checkpoint_factory, tmp_path, capsys):
    """safetensors' own errors (SafetensorError: 'incomplete metadata, file not fully covered', ...) become one
    line naming the file, what is wrong and what to do; the CLI exits 2 with it."""
    from specpilot.cli import main

    src, _ = checkpoint_factory("llama")
    data = (src / "model.safetensors").read_bytes()
    capsys.readouterr()
    for case, (bad, message) in _damaged(data).items():
        path = _copy(src, tmp_path / case.replace(" ", "-"))
        (path / "model.safetensors").write_bytes(bad)
        with pytest.raises(CheckpointError, match=message) as e:
            load_model(str(path))
        assert str(e.value).startswith(f"{path / 'model.safetensors'}: ") and "download it again" in str(e.value)
        rc = main(["generate", "--target", str(path), "--prompt", "hi", "--device", "cpu", "--max-new-tokens", "1"])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("error: ") and "model.safetensors" in err and "Traceback" not in err, case




P, Q = f"w{PLANE_GROUP_MARK}p", f"w{PLANE_GROUP_MARK}q"


def _grouped_file(path, sums=True):
    """A file holding tensor `b` and the two-plane group `w` (planes P, Q; its checksum over P then Q)."""
    tensors = {P: torch.arange(6, dtype=torch.uint8), Q: torch.tensor([2, 3]), "b": torch.ones(3)}
    meta = {"format": "pt"}
    if sums:
        meta |= checksum.to_metadata({"w": checksum.crc32([tensors[P], tensors[Q]]),
                                      "b": checksum.crc32([tensors["b"]])})
    save_file(tensors, str(path), metadata=meta)
    return tensors


def test_a_plane_group_is_one_tensor_read_as_its_checked_planes(tmp_path):
    path = tmp_path / "model.safetensors"
    tensors = _grouped_file(path)
    with CheckpointFile(path) as f:
        assert f.names == ["b", "w"] and f.groups == ["w"] and f.shape("b") == (3,)
        planes = f.read_planes("w", [P, Q])
        assert list(planes) == [P, Q] and all(torch.equal(planes[k], tensors[k]) for k in planes)
        assert torch.equal(f.read("b"), tensors["b"])
        with pytest.raises(CheckpointError, match="tensor 'w' fails its checksum"):
            f.read_planes("w", [Q, P])  # the checksum covers the planes in the format's order
        with pytest.raises(ValueError, match="'w' is a plane group; read it with read_planes"):
            f.read("w")


def test_a_flipped_bit_in_a_plane_fails_the_group_checksum(tmp_path):
    path = tmp_path / "model.safetensors"
    _grouped_file(path)
    data = bytearray(path.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    start = json.loads(data[8:8 + header_len])[P]["data_offsets"][0]
    data[8 + header_len + start + 2] ^= 0x10
    path.write_bytes(bytes(data))
    with CheckpointFile(path) as f:
        with pytest.raises(CheckpointError) as e:
            f.read_planes("w", [P, Q])
    assert str(e.value).startswith(f"{path}: tensor 'w' fails its checksum (crc32 ")
    assert str(e.value).endswith("the file is corrupt; download it again")


def test_plane_groups_without_checksums_are_refused_unless_unverified(tmp_path):
    path = tmp_path / "model.safetensors"
    tensors = _grouped_file(path, sums=False)
    with pytest.raises(CheckpointError, match="W12N tensors without checksums \\(format version 1"):
        CheckpointFile(path)
    with CheckpointFile(path, unverified_groups=True) as f:
        assert torch.equal(f.read_planes("w", [P, Q])[Q], tensors[Q])
