"""W12N matrices of a checkpoint file: decoded bit-exact with their source shape; a malformed plane group fails
as one CheckpointError naming the file, the plane and what to do."""

import pytest
import torch
from safetensors.torch import save_file

from specpilot.checkpoint import checksum
from specpilot.checkpoint.errors import CheckpointError
from specpilot.checkpoint.file import CheckpointFile
from specpilot.weights import w12n
from specpilot.weights.w12n_file import read_source, read_w12n, source_shape


def _w12n_file(path, w, version=None):
    planes = w12n.to_state_dict("w", w12n.encode(w, segment=128))
    if version is not None:
        planes["w.w12n_meta"][4] = version
    norm = torch.ones(3)
    sums = {"w": checksum.crc32(list(planes.values())), "norm": checksum.crc32([norm])}
    save_file(planes | {"norm": norm}, str(path), metadata={"format": "pt"} | checksum.to_metadata(sums))


def test_a_w12n_matrix_reads_back_bit_exact_with_its_source_shape(tmp_path):
    w = (torch.randn(8, 200) * 0.02).to(torch.bfloat16)
    _w12n_file(tmp_path / "model.safetensors", w)
    with CheckpointFile(tmp_path / "model.safetensors") as f:
        assert f.names == ["norm", "w"] and source_shape(f, "w") == (8, 200) and source_shape(f, "norm") == (3,)
        assert torch.equal(read_source(f, "w").view(torch.int16), w.view(torch.int16))
        assert torch.equal(read_source(f, "norm"), torch.ones(3)) and read_w12n(f, "w").segment == 128


def test_a_malformed_plane_group_names_the_file_and_the_plane(tmp_path):
    path = tmp_path / "model.safetensors"
    _w12n_file(path, torch.randn(4, 128).to(torch.bfloat16), version=9)
    with CheckpointFile(path) as f:
        with pytest.raises(CheckpointError) as e:
            read_source(f, "w")
    assert str(e.value) == f"{path}: w.w12n_meta says format version 9; this reader knows 1, 2; download it again"
