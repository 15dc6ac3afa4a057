"""Training checkpoints: the weights, the AdamW moments and the step, all safetensors + JSON (nothing pickled),
written to a temporary directory and renamed, so a crash never leaves a half-written checkpoint.

Language models save their weights the Hugging Face way (`save_pretrained`, so a resume rebuilds them with
transformers); drafters save their state dict as it is."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

STATE = "trainer_state.json"


def save(module: torch.nn.Module, opt: torch.optim.Optimizer, step: int, path: Path,
         save_weights: Callable[[Path], None] | None = None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if save_weights is not None:
        save_weights(tmp)
    else:
        weights = {k: v.detach().cpu().clone().contiguous() for k, v in module.state_dict().items()}
        save_file(weights, str(tmp / "weights.safetensors"))
    names = {id(p): n for n, p in module.named_parameters()}
    moments = {}
    for group in opt.param_groups:
        for p in group["params"]:
            for key in ("exp_avg", "exp_avg_sq"):
                if key in opt.state.get(p, {}):
                    moments[f"{names[id(p)]}.{key}"] = opt.state[p][key].detach().cpu().contiguous()
    save_file(moments, str(tmp / "optimizer.safetensors"))
    (tmp / STATE).write_text(json.dumps({"step": step}))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def exists(path: Path) -> bool:
    return (path / STATE).exists()


def load(module: torch.nn.Module, opt: torch.optim.Optimizer, path: Path, weights: bool = True) -> int:
    """Restores the moments (and, unless the caller rebuilt the module from the checkpoint, the weights);
    returns the step to continue from."""
    step = json.loads((path / STATE).read_text())["step"]
    if weights:
        module.load_state_dict(load_file(str(path / "weights.safetensors")))
    moments = load_file(str(path / "optimizer.safetensors"))
    for name, p in module.named_parameters():
        if f"{name}.exp_avg" in moments:
            opt.state[p] = {"step": torch.tensor(float(step)), "exp_avg": moments[f"{name}.exp_avg"].to(p.device),
                            "exp_avg_sq": moments[f"{name}.exp_avg_sq"].to(p.device)}
    return step


def every(module: torch.nn.Module, opt: torch.optim.Optimizer, path: Path, save_every: int, steps: int,
          save_weights: Callable[[Path], None] | None = None) -> Callable[[int], None]:
    """The after-step hook of `optimize`: a checkpoint every `save_every` steps (none at the end: the trainer
    writes the final model itself)."""
    def hook(done: int) -> None:
        if done % save_every == 0 and done < steps:
            save(module, opt, done, path, save_weights)

    return hook
