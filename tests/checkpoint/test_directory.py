"""A checkpoint directory: Hub ids from the offline cache, shard indexes, and pickled weights refused."""

import shutil

import pytest

from specpilot.checkpoint.directory import resolve_model_dir
from specpilot.checkpoint.errors import CheckpointError
from specpilot.models.loader import load_model


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_no_safetensors_refuses_pickles(checkpoint_factory, tmp_path):
    path = _copy(checkpoint_factory("llama")[0], tmp_path / "m")
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="no \\*.safetensors.*pytorch_model.bin.*never loaded"):
        load_model(str(path))


def test_hub_id_resolves_from_offline_cache(checkpoint_factory, tmp_path, monkeypatch):
    """An org/name id is found in a local Hugging Face cache with HF_HUB_OFFLINE=1 (no network)."""
    src, _ = checkpoint_factory("llama")
    repo = tmp_path / "hub" / "models--acme--tiny-llama"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(src, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = resolve_model_dir("acme/tiny-llama", cache_dir=str(tmp_path / "hub"))
    assert path == repo / "snapshots" / commit
    assert load_model("acme/tiny-llama", cache_dir=str(tmp_path / "hub")).config.family == "llama"
    with pytest.raises(CheckpointError, match="HF_HUB_OFFLINE is set"):
        resolve_model_dir("acme/absent", cache_dir=str(tmp_path / "hub"))


def test_a_corrupt_shard_index_is_named(checkpoint_factory, tmp_path):
    path = _copy(checkpoint_factory("llama")[0], tmp_path / "m")
    (path / "model.safetensors.index.json").write_text('{"weight_map": {"a": ')
    with pytest.raises(CheckpointError, match="model.safetensors.index.json: not a JSON object"):
        load_model(str(path))
