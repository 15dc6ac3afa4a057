"""Calibration: the present device's ceilings (ceilings.py), the target's verify cost curve measured through the
engine's verify call (engine/cost_curve.py: measure), and the engine's other components (draft, accept, commit,
other, host gap) measured per batch size in short runs with the drafter, all cached per GPU name and model
fingerprint (the target's shape, weight format and dtype, and the drafter's) under
$SPECPILOT_CACHE/pilot (default ~/.cache/specpilot/pilot), written atomically.

A calibration of the 27B shape at batch sizes 1, 8 and 32 takes about a minute on an H200 (the verify curve most of
it). A cached file whose fingerprint, format version or GPU differs from the run's is measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specpilot.checkpoint.json_file import write_json
from specpilot.engine.cost_curve import VerifyCostCurve, measure as measure_curve, model_fingerprint
from specpilot.pilot import ceilings as ceiling_bench
from specpilot.pilot.ceilings import Ceilings
from specpilot.pilot.cost_model import CostModel, DrafterShape, Measured, ModelShape, Step
from specpilot.pilot.workload import build_engine, reserve, run_steps

VERSION = 1
CURVE_TOKENS = (1, 2, 4, 8, 16)  # verify tokens per request on the curve's grid


@dataclass(frozen=True)
class CalibrationPlan:
    """What a calibration measures."""

    batches: tuple[int, ...] = (1, 8, 32)
    curve_tokens: tuple[int, ...] = CURVE_TOKENS
    contexts: tuple[int, ...] = (512, 2048)  # the verify curve's contexts
    prompt: int = 128  # prompt tokens of the component runs
    tree: str = "chain:7"
    warmup: int = 4
    steps: int = 12
    reps: int = 5  # back-to-back forwards per verify-curve timing

    def __post_init__(self):
        counts = [("batch", b) for b in self.batches] + [("curve tokens", t) for t in self.curve_tokens] + [
            ("prompt", self.prompt), ("steps", self.steps), ("reps", self.reps)]
        for what, v in counts:
            if v < 1:
                raise ValueError(f"calibration {what} {v}: must be >= 1")
        if not self.batches or not self.contexts or min(self.contexts) < 0 or self.warmup < 0:
            raise ValueError("calibration needs batch sizes, contexts >= 0 and warmup >= 0")

    @staticmethod
    def tiny() -> CalibrationPlan:
        """A CPU smoke calibration: seconds on the tiny shapes."""
        return CalibrationPlan(batches=(1, 2), curve_tokens=(1, 4, 8), contexts=(16, 64), prompt=16, warmup=1,
                               steps=3, reps=1)


@dataclass(frozen=True)
class Calibration:
    gpu: str
    fingerprint: str
    weight_format: str
    ceilings: Ceilings
    verify_curve: VerifyCostCurve | None
    points: tuple[Measured, ...]
    drafter: str = ""
    seconds: float = 0.0  # how long the calibration took
    record: dict = field(default_factory=dict, compare=False)  # date, versions, plan

    def cost_model(self, shape: ModelShape, drafter: DrafterShape | None) -> CostModel:
        return CostModel(shape, self.ceilings, drafter, self.points, self.verify_curve, self.weight_format)

    def to_dict(self) -> dict:
        return {"version": VERSION, "gpu": self.gpu, "fingerprint": self.fingerprint,
                "weight_format": self.weight_format, "drafter": self.drafter, "seconds": self.seconds,
                "ceilings": self.ceilings.to_dict(),
                "verify_curve": self.verify_curve.to_dict() if self.verify_curve is not None else None,
                "points": [p.to_dict() for p in self.points], "record": self.record}

    @staticmethod
    def from_dict(raw: dict) -> Calibration:
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise ValueError(f"not a calibration of format version {VERSION}")
        try:
            curve = raw.get("verify_curve")
            return Calibration(str(raw["gpu"]), str(raw["fingerprint"]), str(raw["weight_format"]),
                               Ceilings.from_dict(raw["ceilings"]),
                               VerifyCostCurve.from_dict(curve) if curve is not None else None,
                               tuple(Measured.from_dict(p) for p in raw["points"]), str(raw.get("drafter", "")),
                               float(raw.get("seconds", 0.0)), dict(raw.get("record", {})))
        except (KeyError, TypeError) as e:
            raise ValueError(f"a calibration needs the field {e}") from None

    def save(self, path: str | Path) -> None:
        """Atomic: a temp file beside the target, then a rename."""
        write_json(path, self.to_dict())

    @staticmethod
    def load(path: str | Path) -> Calibration:
        path = Path(path)
        try:
            return Calibration.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def fingerprint(model, weight_format: str, drafter_label: str) -> str:
    """12 hex digits: the target's cost fingerprint (engine/cost_curve.py: shape, format, dtype) and the drafter's."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    target = model_fingerprint(model.config, weight_format, dtype)
    return hashlib.sha256(f"{target}/{drafter_label}".encode()).hexdigest()[:12]


def drafter_label(drafter) -> str:
    """What names a drafter's cost: its class and its network's parameter shapes (a SyntheticDrafter's inner one)."""
    inner = getattr(drafter, "inner", drafter)
    if inner is None:
        return "none"
    net = getattr(inner, "model", None)
    shapes = [tuple(p.shape) for p in net.parameters()] if isinstance(net, torch.nn.Module) else []
    text = f"{type(inner).__name__}:{getattr(inner, 'block_size', '')}:{shapes}"
    return f"{type(inner).__name__}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def cache_path(gpu: str, fp: str) -> Path:
    root = Path(os.environ.get("SPECPILOT_CACHE", Path.home() / ".cache" / "specpilot"))
    name = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "device"
    return root / "pilot" / f"{name}-{fp}.json"


def cached(runner, drafter, plan: CalibrationPlan | None = None, refresh: bool = False,
           log=lambda msg: None) -> Calibration:
    """The calibration of this device, target (as the runner runs it) and drafter: from the cache when one with the
    same GPU, fingerprint and format version is there (and covers the plan's batch sizes), else measured and
    cached."""
    plan = plan or CalibrationPlan()
    gpu = device_name(runner.device)
    fp = fingerprint(runner.model, runner.runtime.weight_format, drafter_label(drafter))
    path = cache_path(gpu, fp)
    if path.exists() and not refresh:
        try:
            cal = Calibration.load(path)
        except ValueError as e:
            log(f"calibration cache unreadable, measuring again: {e}")
        else:
            have = {p.step.batch for p in cal.points}
            if cal.fingerprint == fp and cal.gpu == gpu and set(plan.batches) <= have:
                log(f"calibration: cached ({path})")
                return cal
    log(f"calibration: measuring on {gpu} (batch sizes {', '.join(map(str, plan.batches))})")
    cal = calibrate(runner, drafter, plan, fp)
    try:
        cal.save(path)
    except OSError as e:  # the measurement stands; only the next run measures again
        log(f"calibration: {cal.seconds:.1f} s, not cached ({e})")
    else:
        log(f"calibration: {cal.seconds:.1f} s, cached at {path}")
    return cal


def calibrate(runner, drafter, plan: CalibrationPlan, fp: str | None = None, seed: int = 0) -> Calibration:
    """Measures the ceilings, the verify curve at the plan's batch sizes, tokens per request and contexts, and per
    batch size the engine's components in a run of the plan's tree (every request its full tree, the drafter's
    real acceptance; synthetic acceptance is no part of a calibration)."""
    t0 = time.perf_counter()
    device = runner.device
    fp = fp or fingerprint(runner.model, runner.runtime.weight_format, drafter_label(drafter))
    ceilings = ceiling_bench.measure(device, runner.dtype)
    nodes = _full_nodes(plan.tree, drafter)
    tokens = (plan.warmup + plan.steps + 4) * nodes + 8  # every step emits at most `nodes` tokens
    reserve(runner, drafter, max(plan.batches), max(plan.prompt + tokens + 1, max(plan.contexts) + max(
        plan.curve_tokens)), [plan.tree])
    curve = measure_curve(runner, list(plan.batches), list(plan.curve_tokens), list(plan.contexts), plan.reps)
    runner.verify_graphs.clear()
    points = []
    rng = random.Random(seed)
    vocab = runner.config.vocab_size
    for b in plan.batches:
        prompts = [[rng.randrange(vocab) for _ in range(plan.prompt)] for _ in range(b)]
        engine = build_engine(runner, drafter, plan.tree, b, plan.prompt + tokens + 1)
        run = run_steps(engine, prompts, plan.warmup, plan.steps, tokens)
        step = Step(b, nodes, run.context, sum(run.accepted) / max(run.steps * b, 1), runner.runtime.weight_format)
        points.append(Measured(step, tuple(sorted(run.medians().items()))))
    runner.verify_graphs.clear()
    record = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
              "plan": {k: v for k, v in plan.__dict__.items()}}
    return Calibration(device_name(device), fp, runner.runtime.weight_format, ceilings, curve, tuple(points),
                       drafter_label(drafter), time.perf_counter() - t0, record)


def _full_nodes(tree: str, drafter) -> int:
    """Nodes (root included) of the tree spec's full tree as the drafter drafts it (capped at its depth)."""
    from specpilot.spec_decode.tree import TreeSpec

    spec = TreeSpec.parse(tree)
    depth = getattr(drafter, "max_depth", None)
    return (spec.capped(depth) if depth else spec).max_tree_nodes
