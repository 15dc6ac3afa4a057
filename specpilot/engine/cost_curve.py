"""VerifyCostCurve: the seconds of one target forward (a verify step) as a function of its total tokens, its batch
size and the batch's mean context, which the node budget (engine/budget.py) reads every step.

The curve is a grid of points: per measured batch size a grid of total tokens, per context a time for each.
Between points it is piecewise linear in tokens (and past the last point linear with the last segment's slope),
linear in context (flat below the smallest, extrapolated above the largest with a slope of at least 0) and linear
in batch between the two measured batch sizes around it (the nearest one outside the grid). Measured times are
made non-decreasing in tokens (running maximum): a noisy point where more tokens ran faster would otherwise make
the budget add nodes for nothing.

Two sources, one object: measure() times chain verifies through the runner on the present device; roofline() and
from_model() give the analytic default before a measurement exists and on the CPU (weights and K/V read at the
device's bandwidth against the tokens' FLOPs at its peak, the slower of the two or their sum, plus a launch
floor). Curves are saved
as JSON (atomic), cached per GPU name and model fingerprint under $SPECPILOT_CACHE/cost_curves
(default ~/.cache/specpilot/cost_curves).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import re
import statistics
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from specpilot.checkpoint.json_file import write_json
from specpilot.config import ModelConfig
from specpilot.spec_decode.tree import DraftTree
from specpilot.spec_decode.verify import host_tree_metadata


@dataclass(frozen=True)
class DeviceRoof:
    """What the roofline default assumes of a device: bytes/s read from memory, FLOP/s of dense bf16 matmuls as
    realistically reached, and the fixed seconds of a forward (launches, synchronisation)."""

    bandwidth: float
    peak_flops: float
    floor_s: float


DEVICE_ROOFS = {
    "cuda": DeviceRoof(bandwidth=4.8e12, peak_flops=7e14, floor_s=1.5e-4),  # H200
    "cpu": DeviceRoof(bandwidth=2e10, peak_flops=2e11, floor_s=1e-4),
}

ROOFLINE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ROOFLINE_CONTEXTS = (0, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)

# the ModelConfig fields that set a forward's cost: a random-weight model in a checkpoint's shape and the checkpoint
# itself (other token ids, another architecture name for the same text model) share one cached curve
_SHAPE_FIELDS = ("family", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias",
                 "mlp_bias", "layer_types", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                 "linear_value_head_dim", "linear_conv_kernel_dim")


@dataclass(frozen=True)
class VerifyCostCurve:
    batches: tuple[int, ...]  # measured batch sizes, ascending
    contexts: tuple[int, ...]  # measured mean contexts (committed tokens per request), ascending
    tokens: tuple[tuple[int, ...], ...]  # per batch size: total tokens of the forward, ascending
    seconds_grid: tuple[tuple[tuple[float, ...], ...], ...]  # [batch][context][tokens] seconds of one forward
    source: str = "measured"  # "measured" or "roofline"

    def __post_init__(self):
        def ascending(xs, what):
            if not xs or any(b <= a for a, b in zip(xs, xs[1:])) or xs[0] < 0:
                raise ValueError(f"VerifyCostCurve.{what} must be non-negative and strictly ascending, got {xs}")

        ascending(self.batches, "batches")
        ascending(self.contexts, "contexts")
        if len(self.tokens) != len(self.batches) or len(self.seconds_grid) != len(self.batches):
            raise ValueError(f"VerifyCostCurve needs one tokens grid and one seconds grid per batch size "
                             f"({len(self.batches)}), got {len(self.tokens)} and {len(self.seconds_grid)}")
        for b, toks, rows in zip(self.batches, self.tokens, self.seconds_grid):
            ascending(toks, f"tokens at batch {b}")
            if len(rows) != len(self.contexts) or any(len(r) != len(toks) for r in rows):
                raise ValueError(f"VerifyCostCurve.seconds_grid at batch {b} must be [contexts][tokens] = "
                                 f"[{len(self.contexts)}][{len(toks)}]")
            if not all(math.isfinite(s) and s > 0 for r in rows for s in r):
                raise ValueError(f"VerifyCostCurve.seconds_grid at batch {b} holds a time that is not a positive "
                                 f"finite number")

    @cached_property
    def _tables(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per batch size: (tokens [T] float, seconds [contexts, T] made non-decreasing in tokens)."""
        return [(np.asarray(toks, dtype=np.float64), np.maximum.accumulate(np.asarray(rows, dtype=np.float64), 1))
                for toks, rows in zip(self.tokens, self.seconds_grid)]

    def seconds(self, tokens, batch: int, context: float):
        """Seconds of one forward of `tokens` total tokens (an int, or an array of them: an array back) over `batch`
        requests whose mean context is `context`."""
        lo, hi, w = _bracket(self.batches, batch)
        t = np.asarray(tokens, dtype=np.float64)
        out = self._at(lo, t, context)
        if w:
            out = (1 - w) * out + w * self._at(hi, t, context)
        return float(out) if out.ndim == 0 else out

    def _at(self, b: int, t: np.ndarray, context: float) -> np.ndarray:
        xs, ys = self._tables[b]
        c = self.contexts
        if len(c) == 1 or context <= c[0]:
            return _extrapolated(xs, ys[0], t)
        i = min(bisect.bisect_right(c, context) - 1, len(c) - 2)
        lo, hi = _extrapolated(xs, ys[i], t), _extrapolated(xs, ys[i + 1], t)
        return lo + np.maximum(hi - lo, 0.0) * ((context - c[i]) / (c[i + 1] - c[i]))

    @staticmethod
    def roofline(weight_bytes: int, flops_per_token: float, kv_bytes_per_token: float, bandwidth: float,
                 peak_flops: float, floor_s: float, state_bytes_per_request: float = 0.0, overlap: bool = True,
                 batches: tuple[int, ...] = ROOFLINE_BATCHES, contexts: tuple[int, ...] = ROOFLINE_CONTEXTS,
                 max_tokens_per_request: int = 64) -> VerifyCostCurve:
        """floor_s + max(bytes read / bandwidth, FLOPs / peak_flops), as a curve: bytes = the weights once, plus per
        request its context's K/V and its recurrent state; FLOPs = flops_per_token per token. overlap=False: the
        sum of the two instead of the larger (memory and compute serialised). Per batch size the tokens grid holds
        the points where the time turns from bandwidth- to compute-bound, so that between grid points the curve
        is the formula itself (to within a token)."""
        combine = max if overlap else (lambda a, b: a + b)

        def time_at(tokens: int, batch: int, ctx: int) -> float:
            read = weight_bytes + batch * (ctx * kv_bytes_per_token + state_bytes_per_request)
            return floor_s + combine(read / bandwidth, tokens * flops_per_token / peak_flops)

        tokens, grid = [], []
        for b in batches:
            last = b * max_tokens_per_request
            points = {b, last}
            for c in contexts:  # the bandwidth/compute knee, on both sides
                read = weight_bytes + b * (c * kv_bytes_per_token + state_bytes_per_request)
                knee = read / bandwidth * peak_flops / max(flops_per_token, 1e-30)
                points |= {k for k in (int(knee), int(knee) + 1) if b < k < last}
            toks = tuple(sorted(points))
            tokens.append(toks)
            grid.append(tuple(tuple(time_at(t, b, c) for t in toks) for c in contexts))
        return VerifyCostCurve(tuple(batches), tuple(contexts), tuple(tokens), tuple(grid), source="roofline")

    @staticmethod
    def from_model(model: torch.nn.Module, device_kind: str, overlap: bool = False) -> VerifyCostCurve:
        """The roofline of a CausalLM on a device kind ("cuda": H200 constants; anything else: CPU-like ones):
        weight bytes from model.weight_bytes_per_token(), 2 FLOPs per weight per token, K/V bytes per token of
        context from the config and the model's dtype, the recurrent state read and written once per request.
        Memory and compute times add by default (overlap=False): verify blocks of a few tokens per request
        pay for their tokens well below the roofline's knee (docs/budget.md has the measured figures), and a
        curve flat up to the knee would give every request every node."""
        roof = DEVICE_ROOFS["cuda" if device_kind == "cuda" else "cpu"]
        cfg: ModelConfig = model.config
        weight_bytes = model.weight_bytes_per_token()
        params = sum(p.numel() for p in model.parameters())
        emb = model.model.embed_tokens.weight
        if not cfg.tie_word_embeddings:  # one row of the table is read, as weight_bytes_per_token counts it
            params -= emb.numel() - emb.shape[1]
        elt = next(model.parameters()).element_size()
        kv = 2 * cfg.num_attention_layers * cfg.num_key_value_heads * cfg.head_dim * elt
        state = 0.0
        if cfg.num_linear_layers:
            ssm = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
            conv = (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
                    + cfg.linear_num_value_heads * cfg.linear_value_head_dim) * cfg.linear_conv_kernel_dim * elt
            state = 2.0 * cfg.num_linear_layers * (ssm + conv)  # read and written back
        return VerifyCostCurve.roofline(weight_bytes, 2.0 * params, kv, roof.bandwidth, roof.peak_flops, roof.floor_s,
                                        state_bytes_per_request=state, overlap=overlap)

    def to_dict(self) -> dict:
        return {"source": self.source, "batches": list(self.batches), "contexts": list(self.contexts),
                "tokens": [list(t) for t in self.tokens],
                "seconds": [[list(r) for r in rows] for rows in self.seconds_grid]}

    @staticmethod
    def from_dict(raw: dict) -> VerifyCostCurve:
        """The inverse of to_dict; also takes a document holding the curve under "curve" (bench/verify_curve.py's
        JSON). A missing or malformed field is a ValueError naming it."""
        if isinstance(raw, dict) and isinstance(raw.get("curve"), dict):
            raw = raw["curve"]
        if not isinstance(raw, dict):
            raise ValueError("a verify cost curve must be a JSON object")
        try:
            return VerifyCostCurve(
                batches=tuple(int(b) for b in raw["batches"]), contexts=tuple(int(c) for c in raw["contexts"]),
                tokens=tuple(tuple(int(t) for t in toks) for toks in raw["tokens"]),
                seconds_grid=tuple(tuple(tuple(float(s) for s in r) for r in rows) for rows in raw["seconds"]),
                source=str(raw.get("source", "measured")))
        except KeyError as e:
            raise ValueError(f"a verify cost curve needs the field {e.args[0]!r} (batches, contexts, tokens, "
                             f"seconds)") from None
        except TypeError as e:
            raise ValueError(f"a verify cost curve's fields must be lists of numbers ({e})") from None

    def save(self, path: str | Path, **record) -> None:
        """Atomic: a temp file beside the target, then a rename. `record` (GPU, commit, command) goes beside the
        curve, which is then under "curve"."""
        write_json(path, {**record, "curve": self.to_dict()} if record else self.to_dict())

    @staticmethod
    def load(path: str | Path) -> VerifyCostCurve:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e}); measure the curve again (python3 -m bench "
                             f"verify_curve) or delete the file") from None
        try:
            return VerifyCostCurve.from_dict(raw)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None


def _bracket(grid: tuple[int, ...], x: float) -> tuple[int, int, float]:
    """(i, j, w): x sits between grid[i] and grid[j] at weight w on grid[j]; outside the grid, its nearest end."""
    if x <= grid[0]:
        return 0, 0, 0.0
    if x >= grid[-1]:
        return len(grid) - 1, len(grid) - 1, 0.0
    i = bisect.bisect_right(grid, x) - 1
    return i, i + 1, (x - grid[i]) / (grid[i + 1] - grid[i])


def _extrapolated(xs: np.ndarray, ys: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Piecewise-linear through (xs, ys), flat below xs[0], the last segment's slope past xs[-1]."""
    out = np.interp(t, xs, ys)
    if len(xs) > 1:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(t > xs[-1], ys[-1] + slope * (t - xs[-1]), out)
    return out


def model_fingerprint(config: ModelConfig, weight_format: str = "bf16", dtype: str = "bfloat16") -> str:
    """12 hex digits naming the forward's cost: the config's shape fields, the weight format and the dtype."""
    fields = {name: getattr(config, name) for name in _SHAPE_FIELDS}
    text = json.dumps({**fields, "weight_format": weight_format, "dtype": dtype}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_path(gpu_name: str, model_fingerprint: str) -> Path:
    """Where the curve of this GPU and model is cached: $SPECPILOT_CACHE/cost_curves/<gpu>-<fingerprint>.json."""
    root = Path(os.environ.get("SPECPILOT_CACHE", Path.home() / ".cache" / "specpilot"))
    gpu = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "device"
    return root / "cost_curves" / f"{gpu}-{model_fingerprint}.json"


@torch.inference_mode()
def measure(runner, batches: list[int], tokens_grid: list[int], contexts: list[int], reps: int,
            layers: tuple[int, ...] = (), rounds: int = 3) -> VerifyCostCurve:
    """Times verify forwards of chains through runner.verify_inputs + runner.verify (the engine's verify call, CUDA
    graphs included where the runtime captures them) on the runner's device: per batch size B, per tokens per
    request t in tokens_grid (B * t tokens in all) and per context, the median over `rounds` timings of `reps`
    back-to-back calls (CUDA events on a GPU, wall time on the CPU). Allocates the runner's cache for the largest batch and context;
    the cache's contents do not change a forward's time."""
    device = runner.device
    cuda = device.type == "cuda"
    tokens_grid, contexts, batches = sorted(set(tokens_grid)), sorted(set(contexts)), sorted(set(batches))
    runner.allocate(max(batches), max(contexts) + max(tokens_grid) + 1)
    fold = runner.config.is_hybrid and runner.runtime.fold_hybrid_chains
    grid = []
    for b in batches:
        rows = [[0.0] * len(tokens_grid) for _ in contexts]
        for j, t in enumerate(tokens_grid):
            trees = [DraftTree.chain([0] * t)] * b
            for i, ctx in enumerate(contexts):  # one captured graph per (batch, width) serves every context
                def call():
                    host = host_tree_metadata(trees, [ctx] * b, list(range(b)), device, chains_as_trees=fold)
                    runner.verify(runner.verify_inputs(host, layers), layers)

                rows[i][j] = _median_seconds(call, reps, cuda, rounds)
        runner.verify_graphs.clear()  # graphs hold their activations: one batch size's at a time
        grid.append(tuple(map(tuple, rows)))
    totals = tuple(tuple(b * t for t in tokens_grid) for b in batches)
    return VerifyCostCurve(tuple(batches), tuple(contexts), totals, tuple(grid))


def _median_seconds(call, reps: int, cuda: bool, rounds: int = 3) -> float:
    """Median over `rounds` of the mean seconds of `reps` back-to-back calls, after two warm-up calls."""
    call()
    call()
    out = []
    for _ in range(rounds):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            for _ in range(reps):
                call()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / reps)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                call()
            out.append((time.perf_counter() - t0) / reps)
    return statistics.median(out)



BUNDLED = Path(__file__).resolve().parent.parent / "data" / "cost_curves"


def curve_for(model, weight_format: str = "bf16") -> VerifyCostCurve:
    """The verify cost curve the engine's budget reads for this model on its device: a measured one for this GPU
    and model shape (python3 -m bench verify_curve --cache writes the cache; the package ships the curves measured
    for the benchmark shapes), else the model's roofline."""
    param = next(model.parameters())
    if param.device.type == "cuda":
        fingerprint = model_fingerprint(model.config, weight_format, str(param.dtype).removeprefix("torch."))
        cached = cache_path(torch.cuda.get_device_name(param.device), fingerprint)
        for path in (cached, BUNDLED / cached.name):
            if path.exists():
                return VerifyCostCurve.load(path)
    return VerifyCostCurve.from_model(model, param.device.type)
