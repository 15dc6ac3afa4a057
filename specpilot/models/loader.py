"""Checkpoint loading: a local directory or Hub id -> config.json + safetensors -> model, and its tokenizer.

Weights come only from safetensors (a single file or a sharded index); nothing is ever unpickled and no
remote code runs. Every file is opened here (`open_safetensors`, `CheckpointFile`): one that safetensors cannot
read, a W12N tensor that fails its checksum, or a W12N file without checksums fails with one message naming the
file, what is wrong and what to do. The model is built on the meta device, materialised once on the target
device, then filled tensor by tensor; the loader proves every checkpoint tensor was consumed exactly once and
every parameter (each block of a packed projection) was filled exactly once, or fails with one message naming
file and key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from specpilot.config import ModelConfig
from specpilot.layers.packed import PackedLinear
from specpilot.models.causal_lm import CausalLM
from specpilot.models.registry import FAMILIES


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as given; the message names the file and the tensor."""


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
    hint = f" (found {', '.join(pickled)}: pickled weights are never loaded; convert them to safetensors)" if pickled else ""
    raise CheckpointError(f"{model_dir}: no *.safetensors weights{hint}")


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
             "float32": torch.float32, "fp32": torch.float32}
    if dtype not in names:
        raise ValueError(f"dtype {dtype!r} is not supported; use auto, bfloat16, float16 or float32")
    return names[dtype]


def build_empty(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> CausalLM:
    """The model with uninitialised parameters on `device` (no double allocation: built on meta first)."""
    with torch.device("meta"):
        model = FAMILIES[cfg.family].build(cfg)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.tie_weights()
    model.reset_buffers()
    return model.eval().requires_grad_(False)


def load_model(path_or_id: str, device: str | torch.device = "cpu", dtype: str | torch.dtype = "auto",
               cache_dir: str | None = None) -> CausalLM:
    model_dir = resolve_model_dir(path_or_id, cache_dir)
    cfg = ModelConfig.from_file(model_dir / "config.json")
    device = torch.device(device)
    model = build_empty(cfg, device, resolve_dtype(dtype, device))
    load_weights(model, safetensors_files(model_dir))
    return model


def _targets(model: CausalLM) -> dict[str, tuple[str, str | None]]:
    """Checkpoint key (after prefix mapping) -> (parameter name, packed shard or None)."""
    params = dict(model.named_parameters())
    targets = {name: (name, None) for name in params}
    for path, module in model.named_modules():
        if isinstance(module, PackedLinear):
            parent = path.rsplit(".", 1)[0]
            for shard in module.shards:
                for kind in ("weight", "bias") if module.bias is not None else ("weight",):
                    targets[f"{parent}.{shard}.{kind}"] = (f"{path}.{kind}", shard)
                    targets.pop(f"{path}.{kind}", None)
    return targets


def unpacked_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters under checkpoint names: each packed projection split back into its shards (the
    inverse of the loader's mapping; used to save trained drafters in their public layouts)."""
    state, modules = {}, dict(model.named_modules())
    for name, p in model.named_parameters():
        parent, kind = name.rsplit(".", 1) if "." in name else ("", name)
        module = modules.get(parent)
        if isinstance(module, PackedLinear):
            owner = parent.rsplit(".", 1)[0]
            for shard in module.shards:
                start, rows = module.shard_rows(shard)
                state[f"{owner}.{shard}.{kind}"] = p[start:start + rows].detach().contiguous()
        else:
            state[name] = p.detach().contiguous()
    return state


def _map_key(key: str, prefixes: dict[str, str]) -> str:
    for src in sorted(prefixes, key=len, reverse=True):
        if key.startswith(src):
            return prefixes[src] + key[len(src):]
    return key


def plan_load(model: CausalLM, entries: list[tuple[str, str, tuple[int, ...]]]) -> list[tuple[str, str, tuple]]:
    """Checks a checkpoint's (file, key, shape) list against the model before a byte is copied.

    Returns (file, key, target) for every tensor to load; raises CheckpointError naming the file and key of the
    first unexpected, duplicated or mis-shaped tensor, or the keys that are missing.
    """
    cfg = model.config
    prefixes = FAMILIES[cfg.family].CHECKPOINT_PREFIXES
    targets = _targets(model)
    params, modules = dict(model.named_parameters()), dict(model.named_modules())
    filled: dict[str, str] = {}  # target key -> file that fills it
    plan = []
    for file, key, shape in entries:
        if any(key.startswith(p) for p in cfg.ignored_key_prefixes):
            continue
        name = _map_key(key, prefixes)
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied: the embedding supplies it
        if name not in targets:
            raise CheckpointError(f"{file}: unexpected tensor {key!r} for {cfg.architecture}")
        if name in filled:
            raise CheckpointError(f"{file}: tensor {key!r} appears twice (also in {filled[name]})")
        expected = tuple(_destination(params, modules, targets[name]).shape)
        if tuple(shape) != expected:
            raise CheckpointError(f"{file}: tensor {key!r} has shape {tuple(shape)}, expected {expected}")
        filled[name] = file
        plan.append((file, key, targets[name]))
    missing = sorted(set(targets) - set(filled))
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"checkpoint is missing tensors {missing[:5]}{more} for {cfg.architecture}")
    return plan


W12N_SUFFIX = ".w12n_"


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
    """One safetensors file of a checkpoint, by source tensor: W12N plane groups count as one bf16 tensor (decoded
    when read), and in a file with checksums (specpilot compress) every tensor read is checked against its own.
    A W12N file without checksums (format version 1) is refused unless `unverified_w12n` (compress rewrites it)."""

    def __init__(self, path: Path, unverified_w12n: bool = False):
        from specpilot.weights import checksum

        self.path = Path(path)
        self.handle = open_safetensors(self.path)
        self.keys = set(self.handle.keys())
        self.w12n = sorted({k.rsplit(W12N_SUFFIX, 1)[0] for k in self.keys if W12N_SUFFIX in k})
        self.names = sorted([k for k in self.keys if W12N_SUFFIX not in k] + self.w12n)
        try:
            self.sums = checksum.from_metadata(self.handle.metadata())
        except ValueError as e:
            raise CheckpointError(f"{self.path}: {e}; {_remedy(self.path)}") from None
        if self.w12n and self.sums is None and not unverified_w12n:
            raise CheckpointError(
                f"{self.path}: W12N tensors without checksums (format version 1, written by an older specpilot); "
                f"rewrite the directory with `specpilot compress {self.path.parent} NEW_DIR`")

    def __enter__(self) -> CheckpointFile:
        return self

    def __exit__(self, *exc) -> None:
        self.handle.__exit__(*exc)

    def shape(self, name: str) -> tuple[int, ...]:
        """The source shape; of a W12N group from `{name}.w12n_meta` = N, K, base, segment, version."""
        if name in self.w12n:
            return tuple(self.handle.get_tensor(f"{name}{W12N_SUFFIX}meta")[:2].tolist())
        return tuple(self.handle.get_slice(name).get_shape())

    def read(self, name: str) -> torch.Tensor:
        """The tensor's values: W12N planes decoded here (bit-exact bf16)."""
        if name in self.w12n:
            from specpilot.weights import w12n

            return w12n.decode(self.read_w12n(name))
        return self._checked(name, [name])[0]

    def read_w12n(self, name: str):
        """The W12NTensor of a plane group, checksum and structure checked."""
        from specpilot.weights import w12n

        keys = [k for k in w12n.plane_keys(name) if k in self.keys]  # from_state_dict names any missing one
        planes = dict(zip(keys, self._checked(name, keys)))
        try:
            return w12n.from_state_dict(name, planes)
        except ValueError as e:
            raise CheckpointError(f"{self.path}: {e}; {_remedy(self.path)}") from None

    def _checked(self, name: str, keys: list[str]) -> list[torch.Tensor]:
        from specpilot.weights import checksum

        tensors = [self.handle.get_tensor(k) for k in keys]
        if self.sums is None:
            return tensors
        stored, got = self.sums.get(name), checksum.crc32(tensors)
        if stored is None:
            raise CheckpointError(f"{self.path}: tensor {name!r} has no checksum in the file's metadata (the header "
                                  f"is corrupt); {_remedy(self.path)}")
        if stored != got:
            raise CheckpointError(f"{self.path}: tensor {name!r} fails its checksum (crc32 {got}, stored {stored}): "
                                  f"the file is corrupt; {_remedy(self.path)}")
        return tensors


@torch.no_grad()
def load_weights(model: torch.nn.Module, files: list[Path], progress: bool = True) -> None:
    """Fills the model from safetensors files after plan_load accepted them; a progress bar (stderr) by bytes.
    W12N directories (specpilot compress) load transparently: their planes are decoded to bf16 here."""
    entries = []
    for path in files:
        with CheckpointFile(path) as f:
            entries += [(path.name, name, f.shape(name)) for name in f.names]
    plan = plan_load(model, entries)
    params, modules = dict(model.named_parameters()), dict(model.named_modules())
    by_file: dict[str, list] = {}
    for file, key, target in plan:
        by_file.setdefault(file, []).append((key, target))
    directory = files[0].parent
    total = sum(_destination(params, modules, t).nbytes for _, _, t in plan)
    with _progress(progress and total > 256 << 20) as bar:
        task = bar.add_task("loading weights", total=total)
        for file, items in by_file.items():
            with CheckpointFile(directory / file) as f:
                for key, target in items:
                    dest = _destination(params, modules, target)
                    dest.copy_(f.read(key))
                    bar.advance(task, dest.nbytes)


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    return Progress(*columns, console=Console(stderr=True), transient=True, disable=not enabled)


def _destination(params, modules, target: tuple[str, str | None]) -> torch.Tensor:
    pname, shard = target
    dest = params[pname]
    if shard is not None:
        start, rows = modules[pname.rsplit(".", 1)[0]].shard_rows(shard)
        dest = dest[start:start + rows]
    return dest


def load_tokenizer(path_or_id: str, cache_dir: str | None = None):
    """The Hugging Face fast tokenizer saved beside the weights (tokenizer.json / tokenizer_config.json)."""
    from transformers import AutoTokenizer

    model_dir = resolve_model_dir(path_or_id, cache_dir)
    if not (model_dir / "tokenizer.json").exists() and not (model_dir / "tokenizer_config.json").exists():
        raise CheckpointError(f"{model_dir}: no tokenizer.json or tokenizer_config.json")
    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)
