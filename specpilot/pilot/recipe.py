"""The recipe: what `specpilot tune` chose and why, as a versioned JSON file that `generate` and `bench` apply.

A recipe names the target and drafter it was tuned on (fingerprints: a hash of the model's config and a hash of a
sample of its weights; the drafter's class and parameter shapes as calibration.py names them, and a hash of its
weights), the device, the library versions, the sampling it was tuned at (temperature, top-k, top-p, seed; absent in
the file: greedy), the chosen configuration per batch size (Choice: tree spec, adaptive
node budget on or off, weight format, and any EngineConfig / SchedulerConfig fields), the evidence for each kept
change (held-out tok/s of both sides, the paired ratio's interval, the forcing verdict) and the log of every
candidate tried (kept or rejected, and why). Saved atomically (a temp file beside it, then a rename).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specpilot.checkpoint.json_file import write_json
from specpilot.pilot.sampling import Sampling

VERSION = 1
SAMPLE = 1024  # elements hashed at each end of every parameter


@dataclass(frozen=True)
class Fingerprint:
    """A model's identity: its name as given, a hash of its config, a hash of its weights."""

    name: str
    config_hash: str
    weight_hash: str

    def same_model(self, other: Fingerprint) -> bool:
        return (self.config_hash, self.weight_hash) == (other.config_hash, other.weight_hash)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(raw: dict) -> Fingerprint:
        return Fingerprint(str(raw["name"]), str(raw["config_hash"]), str(raw["weight_hash"]))


def weight_hash(module: torch.nn.Module | None) -> str:
    """16 hex digits over every parameter's name, shape and its first and last SAMPLE elements as fp32 (the dtype a
    model was loaded in does not change it; reading a sample keeps a 27B model's hash to milliseconds)."""
    if module is None:
        return "none"
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        flat = p.detach().reshape(-1)
        ends = torch.cat([flat[:SAMPLE], flat[-SAMPLE:]]) if flat.numel() > 2 * SAMPLE else flat
        h.update(f"{name}:{tuple(p.shape)}".encode())
        h.update(ends.float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def target_fingerprint(model, name: str) -> Fingerprint:
    config = json.dumps(model.config.to_dict(), sort_keys=True, default=str)
    return Fingerprint(name, hashlib.sha256(config.encode()).hexdigest()[:16], weight_hash(model))


def drafter_fingerprint(drafter, name: str) -> Fingerprint:
    """The drafter's class and parameter shapes (calibration.drafter_label) and its own network's weights."""
    from specpilot.pilot.calibration import drafter_label

    inner = getattr(drafter, "inner", drafter)
    net = getattr(inner, "model", None) if inner is not None else None
    return Fingerprint(name, drafter_label(drafter), weight_hash(net if isinstance(net, torch.nn.Module) else None))


@dataclass(frozen=True)
class Choice:
    """One batch size's configuration."""

    tree: str
    adaptive: bool = False
    weight_format: str = "bf16"
    engine: dict = field(default_factory=dict)  # EngineConfig fields beyond weight_format
    scheduler: dict = field(default_factory=dict)  # SchedulerConfig fields beyond adaptive and max_num_seqs

    def __post_init__(self):
        from specpilot.config import EngineConfig
        from specpilot.engine.scheduler import SchedulerConfig
        from specpilot.spec_decode.tree import TreeSpec

        TreeSpec.parse(self.tree)
        EngineConfig.from_dict({**self.engine, "weight_format": self.weight_format})
        SchedulerConfig(**{**self.scheduler, "adaptive": self.adaptive})

    @property
    def label(self) -> str:
        words = [self.tree] + (["adaptive"] if self.adaptive else []) + (
            [self.weight_format] if self.weight_format != "bf16" else [])
        return " ".join(words + [f"{k}={v}" for k, v in {**self.engine, **self.scheduler}.items()])

    def engine_config(self):
        from specpilot.config import EngineConfig

        return EngineConfig.from_dict({**self.engine, "weight_format": self.weight_format})

    def scheduler_config(self, batch: int, **more):
        from specpilot.engine.scheduler import SchedulerConfig

        return SchedulerConfig(**{**self.scheduler, "max_num_seqs": batch, "adaptive": self.adaptive, **more})

    def to_dict(self) -> dict:
        return {"tree": self.tree, "adaptive": self.adaptive, "weight_format": self.weight_format,
                "engine": dict(self.engine), "scheduler": dict(self.scheduler)}

    @staticmethod
    def from_dict(raw: dict) -> Choice:
        return Choice(str(raw["tree"]), bool(raw.get("adaptive", False)), str(raw.get("weight_format", "bf16")),
                      dict(raw.get("engine", {})), dict(raw.get("scheduler", {})))


@dataclass(frozen=True)
class Recipe:
    target: Fingerprint
    drafter: Fingerprint
    device: str
    versions: dict  # library -> version
    choices: dict[int, Choice]  # batch size -> its configuration
    evidence: dict[int, list[dict]] = field(default_factory=dict)  # batch size -> each kept change's Verdict dict
    candidates: list[dict] = field(default_factory=list)  # every candidate's Verdict dict, kept or rejected
    settings: dict = field(default_factory=dict)  # the tune's workloads, prompts, seed, repeats, ...
    sampling: Sampling = Sampling()  # the workload's decoding it was tuned at

    def choice_for(self, batch: int) -> tuple[int, Choice]:
        """The entry for the largest tuned batch size <= `batch` (the smallest one if every one is larger)."""
        sizes = sorted(self.choices)
        size = max((b for b in sizes if b <= batch), default=sizes[0])
        return size, self.choices[size]

    def check_target(self, got: Fingerprint) -> None:
        if not self.target.same_model(got):
            raise ValueError(f"recipe tuned on target {self.target.name} (config {self.target.config_hash}, weights "
                             f"{self.target.weight_hash}), not on {got.name} (config {got.config_hash}, weights "
                             f"{got.weight_hash}): tune this target (specpilot tune)")

    def check_drafter(self, got: Fingerprint) -> None:
        if not self.drafter.same_model(got):
            raise ValueError(f"recipe tuned with drafter {self.drafter.name} ({self.drafter.config_hash}, weights "
                             f"{self.drafter.weight_hash}), not with {got.name} ({got.config_hash}, weights "
                             f"{got.weight_hash}): pass --drafter {self.drafter.name} or tune this pair")

    def to_dict(self) -> dict:
        return {"version": VERSION, "target": self.target.to_dict(), "drafter": self.drafter.to_dict(),
                "device": self.device, "versions": dict(self.versions),
                "choices": {str(b): c.to_dict() for b, c in sorted(self.choices.items())},
                "evidence": {str(b): list(e) for b, e in sorted(self.evidence.items())},
                "candidates": list(self.candidates), "settings": dict(self.settings),
                "sampling": self.sampling.to_dict()}

    @staticmethod
    def from_dict(raw) -> Recipe:
        if not isinstance(raw, dict):
            raise ValueError("not a recipe (a JSON object is expected)")
        if raw.get("version") != VERSION:
            raise ValueError(f"recipe format version {raw.get('version')!r}, this specpilot reads version {VERSION}: "
                             f"tune again")
        try:
            choices = {int(b): Choice.from_dict(c) for b, c in raw["choices"].items()}
            if not choices:
                raise ValueError("the recipe has no batch sizes under 'choices'")
            return Recipe(Fingerprint.from_dict(raw["target"]), Fingerprint.from_dict(raw["drafter"]),
                          str(raw["device"]), dict(raw["versions"]), choices,
                          {int(b): list(e) for b, e in raw.get("evidence", {}).items()},
                          list(raw.get("candidates", [])), dict(raw.get("settings", {})),
                          Sampling.from_dict(raw.get("sampling", {})))
        except KeyError as e:
            raise ValueError(f"the recipe lacks the field {e}") from None
        except (TypeError, AttributeError) as e:
            raise ValueError(f"a recipe field has the wrong type ({e})") from None

    def save(self, path: str | Path) -> None:
        """Atomic: a temp file beside the target, then a rename; nothing is left behind on failure."""
        write_json(Path(path).expanduser(), self.to_dict())

    @staticmethod
    def load(path: str | Path) -> Recipe:
        path = Path(path).expanduser()
        if not path.is_file():
            raise ValueError(f"recipe {path}: {'not a file' if path.exists() else 'no such file'}")
        try:
            return Recipe.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ValueError(f"recipe {path}: not valid JSON ({e})") from None
        except ValueError as e:
            raise ValueError(f"recipe {path}: {e}") from None


def versions() -> dict:
    """The versions of the libraries a recipe's measurements depend on."""
    from specpilot import __version__

    out = {"specpilot": __version__, "torch": torch.__version__, "cuda": torch.version.cuda or "none"}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = "none"
    return out
