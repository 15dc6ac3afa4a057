"""Model loading: a local directory or Hub id -> config.json + safetensors -> model, and its tokenizer.

The checkpoint's files are found and read through checkpoint/ (directory, damaged-file diagnosis, per-tensor
checksums) and weights/w12n_file.py (W12N matrices decoded to bf16). The model is built on the meta device,
materialised once on the target device, then filled tensor by tensor; the loader proves every checkpoint tensor
was consumed exactly once and every parameter (each block of a packed projection) was filled exactly once, or
fails with one message naming file and key.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specpilot.checkpoint.directory import resolve_model_dir, safetensors_files
from specpilot.checkpoint.errors import CheckpointError
from specpilot.checkpoint.file import CheckpointFile
from specpilot.config import ModelConfig
from specpilot.layers.packed import PackedLinear
from specpilot.models.causal_lm import CausalLM
from specpilot.models.registry import FAMILIES
from specpilot.weights.w12n_file import read_source, source_shape


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
    model.checkpoint_dir = model_dir  # where the MTP drafter (models/mtp.py) reads the checkpoint's mtp.* keys
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


@torch.no_grad()
def load_weights(model: torch.nn.Module, files: list[Path], progress: bool = True) -> None:
    """Fills the model from safetensors files after plan_load accepted them; a progress bar (stderr) by bytes.
    W12N directories (specpilot compress) load transparently: their planes are decoded to bf16 here."""
    entries = []
    for path in files:
        with CheckpointFile(path) as f:
            entries += [(path.name, name, source_shape(f, name)) for name in f.names]
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
                    dest.copy_(read_source(f, key))
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
