"""CUDA graphs faked on the CPU: a captured graph whose replay re-runs what the test attaches to it.

What such a test checks is the host side of a graph path: that one copy into the static inputs refreshes
everything a replay reads, and that the static outputs are what the caller uses.
"""

import contextlib

import torch


class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph: replay() calls the `rerun` a test sets after capture."""

    def replay(self):
        self.rerun()


class _Stream:
    def wait_stream(self, other):
        pass


@contextlib.contextmanager
def _nothing(*args, **kwargs):
    yield


def fake_cuda_graphs(monkeypatch) -> None:
    """Makes torch.cuda's graph and stream API no-ops (graphs become FakeGraph) for the rest of the test."""
    for name, value in (("CUDAGraph", FakeGraph), ("graph", _nothing), ("Stream", _Stream), ("stream", _nothing),
                        ("current_stream", _Stream)):
        monkeypatch.setattr(torch.cuda, name, value)
