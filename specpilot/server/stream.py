"""RequestStream: how the engine thread hands one request's events to the asyncio task answering it.

The engine thread hands a step's events to deliver() (thread-safe: they are queued on the requests' event loop);
the request's task awaits get(). A request's events are Admitted or Failed first, then Tokens, then exactly one
Finished (or a Failed if the engine stopped under it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Admitted:
    """The engine took the request (add_request returned)."""


@dataclass(frozen=True, slots=True)
class Tokens:
    ids: list[int]


@dataclass(frozen=True, slots=True)
class Finished:
    reason: str  # the engine's: "length" | "eos" | "stop" | "abort"
    spec: dict = field(default_factory=dict)  # the request's speculative statistics (spec_stats)


@dataclass(frozen=True, slots=True)
class Failed:
    status: int  # 400: the engine refused the request; 503: the engine stopped or failed
    message: str


class RequestStream:
    """One request's events, read by the task answering it on `loop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()

    async def get(self):
        return await self._queue.get()


def deliver(batch: list[tuple[RequestStream, object]]) -> None:
    """From any thread: hands each (stream, event) to its stream in order, with one wake-up per event loop (a step's
    events for every request at once, not one cross-thread call each)."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for stream, event in batch:
        by_loop.setdefault(stream.loop, []).append((stream, event))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:  # that event loop has closed: nobody is waiting for these requests any more
            pass


def _put_all(items: list[tuple[RequestStream, object]]) -> None:
    for stream, event in items:
        stream._queue.put_nowait(event)
