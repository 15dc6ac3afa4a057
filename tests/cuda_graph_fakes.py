"""CUDA graphs faked on the CPU: a captured graph whose replay re-runs what the test attaches to it.

What such a test checks is the host side of a graph path: that one copy into the static inputs refreshes
everything a replay reads, and that the static outputs are what the caller uses.
"""

import contextlib

import torch


class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph: replay() calls the `rerun` a test sets after capture (a graph of a
    chain that has none replays nothing: the test's rerun on the chain's last graph redoes the whole call)."""

    captures = 0  # capture_begin calls since fake_cuda_graphs

    def capture_begin(self, pool=None):
        FakeGraph.captures += 1

    def capture_end(self):
        pass

    def replay(self):
        rerun = getattr(self, "rerun", None)
        if rerun is not None:
            rerun()


class _Stream:
    def wait_stream(self, other):
        pass


@contextlib.contextmanager
def _nothing(*args, **kwargs):
    yield


def fake_cuda_graphs(monkeypatch) -> None:
    """Makes torch.cuda's graph and stream API no-ops (graphs become FakeGraph) for the rest of the test."""
    FakeGraph.captures = 0
    for name, value in (("CUDAGraph", FakeGraph), ("graph", _nothing), ("Stream", _Stream), ("stream", _nothing),
                        ("current_stream", _Stream), ("synchronize", lambda *a: None),
                        ("graph_pool_handle", lambda: (0, 0))):
        monkeypatch.setattr(torch.cuda, name, value)
