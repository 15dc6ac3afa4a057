"""Runtimes for CPU tests: one built from EngineConfig fields, and a runner's GPU paths switched on by hand (each op
then runs its reference, or its interpreted kernel where the test routes CPU tensors there)."""

import dataclasses

from specpilot.config import EngineConfig
from specpilot.runtime.settings import Runtime


def cpu_runtime(**fields) -> Runtime:
    """Runtime.build on the CPU from EngineConfig fields (ablation switches by name too, as from_dict takes them)."""
    return Runtime.build(EngineConfig.from_dict(fields), "cpu")


def set_paths(runner, *steps: str, **changes) -> None:
    """The runner's KernelPaths of each step kind in `steps` ("decode", "verify", "prefill") with `changes`."""
    rt = runner.runtime
    runner.runtime = dataclasses.replace(rt, **{s: dataclasses.replace(getattr(rt, s), **changes) for s in steps})


def set_runtime(runner, **changes) -> None:
    """The runner's Runtime with `changes` (verify_graphs=True: the graph path, with graphs faked on the CPU)."""
    runner.runtime = dataclasses.replace(runner.runtime, **changes)
