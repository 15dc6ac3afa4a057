"""Shared fixtures: tiny random Hugging Face checkpoints written to disk by transformers' own classes."""

from __future__ import annotations

import os

# Triton kernels run under the interpreter in CI (no GPU); it must be set before anything imports triton
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.checkpoints import write_checkpoint  # noqa: E402

# the tests' models are tiny: a second intra-op thread only adds wake-ups, and on a busy 2-core machine it slows
# the main thread's engine many times over (docs/decisions/2026-12-02-cpu-threads.md)
torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    # token streams, demo checkpoints: never read from or written to the user's own cache during tests
    os.environ["SPECPILOT_CACHE"] = str(tmp_path_factory.mktemp("specpilot-cache"))


@pytest.fixture(autouse=True)
def _threads():
    """A command under test may set torch's intra-op threads (`--threads`); the next test gets this process's."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(42)


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    """checkpoint_factory(name, **overrides) -> (path, hf_model); cached per (name, overrides)."""
    cache = {}

    def make(name: str, **overrides):
        key = (name, tuple(sorted(overrides.items())))
        if key not in cache:
            path = tmp_path_factory.mktemp(name)
            cache[key] = (path, write_checkpoint(name, path, **overrides))
        return cache[key]

    return make
