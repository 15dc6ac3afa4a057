"""write_json: parents created, the file whole, no temp file left behind when the rename fails."""

import json

import pytest

from specpilot.checkpoint.json_file import write_json


def test_writes_the_file_whole_and_creates_its_folders(tmp_path):
    path = tmp_path / "a" / "b" / "r.json"
    write_json(path, {"x": [1, 2], "p": tmp_path})
    assert json.loads(path.read_text()) == {"x": [1, 2], "p": str(tmp_path)}
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]


def test_a_failed_rename_leaves_no_temp_file(tmp_path):
    (tmp_path / "r.json").mkdir()  # a directory where the file should go: the rename fails
    with pytest.raises(OSError):
        write_json(tmp_path / "r.json", {"x": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
