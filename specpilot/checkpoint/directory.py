"""A checkpoint directory: a local path or a Hub repo id resolved to a directory, and its safetensors files
(one file or the shards of an index; pickled weights are named and refused, never loaded)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from specpilot.checkpoint.errors import CheckpointError


def resolve_model_dir(path_or_id: str, cache_dir: str | None = None, revision: str | None = None) -> Path:
    """A local directory as is; otherwise a Hub repo id fetched (or found in the cache) by huggingface_hub.

    Honours HF_HUB_OFFLINE and HF_HOME / cache_dir; only config, tokenizer and safetensors files are fetched.
    """
    path = Path(path_or_id).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CheckpointError(f"{path}: expected a model directory (config.json + *.safetensors), got a file")
        return path
    if path_or_id.startswith((".", "/", "~")) or path_or_id.count("/") != 1:
        raise CheckpointError(f"{path_or_id}: no such directory, and not a Hub repo id of the form 'org/name'")
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.jinja", "*.model", "*.txt"]
    try:
        return Path(snapshot_download(path_or_id, revision=revision, cache_dir=cache_dir, allow_patterns=patterns))
    except Exception as e:  # huggingface_hub raises several types for offline / missing / auth cases
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        hint = " (HF_HUB_OFFLINE is set and it is not in the local cache)" if offline else ""
        raise CheckpointError(f"{path_or_id}: could not fetch from the Hub{hint}: {type(e).__name__}: {e}") from None


def safetensors_files(model_dir: Path) -> list[Path]:
    """The directory's safetensors files: the shards its index lists (each must exist), else every *.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map")
        except (json.JSONDecodeError, AttributeError) as e:
            raise CheckpointError(f"{index}: not a JSON object ({e}); download it again") from None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no weight_map")
        files = sorted({model_dir / f for f in weight_map.values()})
        for f in files:
            if not f.exists():
                raise CheckpointError(f"{index}: lists shard {f.name}, which is missing from {model_dir}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        return files
    pickled = [p.name for p in model_dir.glob("*.bin")] + [p.name for p in model_dir.glob("*.pt*")]
    hint = (f" (found {', '.join(pickled)}: pickled weights are never loaded; convert them to safetensors)"
            if pickled else "")
    raise CheckpointError(f"{model_dir}: no *.safetensors weights{hint}")
