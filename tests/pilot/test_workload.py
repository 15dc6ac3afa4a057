"""Measured workloads: several engines in turn on one runner and drafter, timed steps read back from the step log."""

from __future__ import annotations

import random

import torch

from specpilot.bench.shapes import RANDOM_DRAFTERS, hf_config, random_model
from specpilot.runtime.runner import ModelRunner
from specpilot.pilot.workload import build_engine, reserve, run_steps


def test_a_smaller_longer_workload_after_a_larger_one_on_the_same_drafter():
    """Batch 3 then batch 1 with longer requests: without the reserve the second engine sizes the caches again,
    smaller, and the drafter's extensions left pending by the first engine's aborted requests land past them."""
    model = random_model(hf_config("tiny-dense"), "cpu", torch.float32)
    runner = ModelRunner(model)
    drafter = RANDOM_DRAFTERS["random-dflash"](model, "tiny-dense", runner.runtime)
    rng = random.Random(0)
    prompt = lambda: [rng.randrange(512) for _ in range(12)]  # noqa: E731 (longer than a block: flushed at start)
    reserve(runner, drafter, 3, 12 + 120 + 1, ["chain:3"])
    first = run_steps(build_engine(runner, drafter, "chain:3", 3, 12 + 40 + 1), [prompt() for _ in range(3)], 1, 2, 40)
    second = run_steps(build_engine(runner, drafter, "chain:3", 1, 12 + 120 + 1), [prompt()], 1, 3, 120)
    assert (first.batch, first.steps, second.batch, second.steps) == (3, 2, 1, 3)
    for run in (first, second):
        assert len(run.records) == run.steps and all("seconds" in r for r in run.records)
        assert run.emitted >= run.steps * run.batch and run.wall_s > 0
        assert set(run.medians()) == {"draft", "verify", "accept", "commit", "other", "host_gap"}
        assert sum(run.drafted) == 3 * run.steps * run.batch  # chain:3, every request its full tree
