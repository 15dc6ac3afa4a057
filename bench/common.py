"""What the benchmarks share: the run record (GPU, commit, command), a JSON written again after every section (a
timeout or a crash keeps what was measured), per-variant error capture that tells a dead CUDA context from an
ordinary exception, device-agnostic timing, the device's copy bandwidth (the rooflines' denominator) and the
relative error of an output against its reference.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from specpilot.config import EngineConfig
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.settings import Runtime


def make_runner(model: torch.nn.Module, engine: EngineConfig = EngineConfig()) -> ModelRunner:
    """A ModelRunner of `model` under `engine`, resolved for the model's device (Runtime.build)."""
    return ModelRunner(model, Runtime.build(engine, next(model.parameters()).device))


def run_record(device: str, commit: str | None = None) -> dict:
    """GPU name, commit, exact command line, date and library versions of this run."""
    commit = commit or os.environ.get("SPECPILOT_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).parent).stdout.strip() or "unknown"
        except OSError:  # no git on this machine
            commit = "unknown"
    versions = {"torch": torch.__version__}
    for name in ("triton", "transformers"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - a version is informative only
            versions[name] = None
    cuda = device == "cuda" and torch.cuda.is_available()
    return {"gpu": torch.cuda.get_device_name() if cuda else "cpu", "device": device, "commit": commit,
            "command": command_line(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), **versions}


def command_line() -> str:
    """This run's command as typed: `python3 -m bench NAME ...` (sys.argv[0] is then bench/__main__.py)."""
    script = Path(sys.argv[0])
    if script.name == "__main__.py" and script.parent.name == "bench":
        return " ".join(["python3 -m bench", *sys.argv[1:]])
    return " ".join(["python3", *sys.argv])


def write_json(path: str | Path, data) -> None:
    """Atomic: a temp file beside the target, then a rename (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


class Report:
    """The script's JSON document, saved after every `save()` (call it after each measured section)."""

    def __init__(self, path: str | Path, data: dict):
        self.path, self.data = path, data
        self.save()

    def __getitem__(self, key):
        return self.data[key]

    def __setitem__(self, key, value):
        self.data[key] = value
        self.save()

    def save(self) -> None:
        write_json(self.path, self.data)


def cuda_alive() -> bool:
    """False once a kernel fault has poisoned this process's CUDA context (every later CUDA call fails)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return True
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add_(1).item() == 2.0
    except Exception:  # noqa: BLE001
        return False


_DEAD = {"reason": None}


def attempt(label: str, fn, *args, **kwargs):
    """fn(*args, **kwargs), or {"error": ...} if it raised: printed with its traceback, never re-raised. Once the
    CUDA context is dead every later attempt is skipped at once (its work could only fail)."""
    if _DEAD["reason"] is not None:
        return {"error": f"skipped: CUDA context dead since {_DEAD['reason']}", "skipped": True}
    t0 = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - every variant is measured independently
        msg = f"{type(e).__name__}: {e}"
        print(f"!! {label} FAILED after {time.perf_counter() - t0:.1f}s: {msg[:500]}", flush=True)
        traceback.print_exc()
        out = {"error": msg[:2000], "traceback": traceback.format_exc()[-3000:]}
        if not cuda_alive():
            _DEAD["reason"] = label
            out["cuda_context_dead"] = True
            print(f"!! CUDA context is dead after {label}: the rest of this script is skipped", flush=True)
        elif torch.cuda.is_available():
            torch.cuda.empty_cache()
        return out


def start_requests(engine, prompts, params) -> list:
    """Adds the prompts as requests and steps the engine until every one has its slot prefilled and decodes (the
    requests' start); returns them."""
    ids = [engine.add_request(p, params) for p in prompts]
    engine.step()
    while any(r.status.value != "decoding" for r in engine.scheduler.running):
        engine.step()
    reqs = [engine.scheduler.by_id[i] for i in ids]
    if len(reqs) != len(prompts):
        raise RuntimeError("a request finished during its start: raise max_new_tokens")
    return reqs


def engine_step(engine, label=None):
    """One SpecEngine step as step() runs it (schedule, budget, propose, verify, accept, commit, emit), each phase
    inside label(name) if given (torch.profiler.record_function, to find the phases in a trace). Returns the
    step's (decoding requests, trees)."""
    import contextlib

    label = label or (lambda name: contextlib.nullcontext())
    with label("schedule"):
        plan = engine.schedule()
        nodes = engine.budget(plan.decoding, plan.chunks)
    if not plan.decoding:
        raise RuntimeError("the request finished before the measurement did: raise max_new_tokens")
    with label("propose"):
        trees = engine.propose(plan.decoding, nodes)
    with label("verify"):
        tokens = engine.verify(plan.decoding, trees, plan.chunks)
    with label("accept"):
        accepted, firsts = engine.accept(trees, tokens, plan.chunks)
    with label("commit"):
        engine.commit(plan.decoding, trees, accepted, plan.chunks)
    with label("emit"):
        engine.emit(plan, trees, accepted, firsts)
    return plan.decoding, trees


def failed(result) -> bool:
    return isinstance(result, dict) and "error" in result


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def host_ms(fn, device, reps: int) -> float:
    """Median milliseconds until fn() returns, each call starting on an idle device (no synchronisation after
    it): the host cost of the call, which a step that ends in a sync serialises."""
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    sync(device)
    return statistics.median(times)


def time_ms(fn, device, reps: int, warmup: int = 2) -> list[float]:
    """Milliseconds of each of `reps` calls of fn() after warm-up: CUDA events on a GPU (queue time of the
    calls' own work, host gaps included), wall time on the CPU."""
    for _ in range(warmup):
        fn()
    sync(device)
    if torch.device(device).type == "cuda":
        events = []
        for _ in range(reps):
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in events]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def graph_ms(fn, calls: int = 24, reps: int = 10) -> float:
    """Median milliseconds per call of fn(i), measured as CUDA graph replays of `calls` back-to-back calls
    (i = 0..calls-1, so fn can rotate its inputs past the L2): no host launch overhead is counted."""
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        graph.replay()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times) / calls


def time_replays(replay, device, reps: int) -> float:
    """Median seconds of one call of replay() (a CUDA-graph replay): CUDA events around each of `reps` back-to-back
    calls, so the host's launch time is hidden as it is in a real step; on the CPU, the median wall time of a call."""
    return statistics.median(time_ms(replay, device, reps, warmup=3)) / 1e3


def copy_bandwidth(device, nbytes: int = 4 << 30, reps: int = 20) -> float:
    """Bytes read + written per second by a large device-to-device copy (median; 64 MiB on the CPU)."""
    cuda = torch.device(device).type == "cuda"
    if not cuda:
        nbytes = min(nbytes, 64 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(reps + 3):
        if cuda:
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            dst.copy_(src)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - t0
        if i >= 3:
            times.append(seconds)
    del src, dst
    return 2 * nbytes / statistics.median(times)


def median(xs) -> float:
    return statistics.median(xs)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Relative RMS error, max abs error and NaN count of out against ref (float64)."""
    o, r = out.double(), ref.double()
    diff = (o - r).abs()
    return {"rel_rms_err": (diff.pow(2).mean().sqrt() / r.pow(2).mean().sqrt().clamp_min(1e-30)).item(),
            "max_abs_err": diff.nan_to_num(float("inf")).max().item() if diff.numel() else 0.0,
            "nan": int(torch.isnan(o).sum())}
