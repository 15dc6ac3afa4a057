"""Shared fixtures: tiny random Hugging Face checkpoints written to disk by transformers' own classes."""

from __future__ import annotations

import pytest
import torch

from tests.checkpoints import write_checkpoint


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
