"""RequestStream: how the engine thread hands one request's events to the asyncio task answering it.

The engine thread hands a step's events to deliver() (thread-safe: they are queued on the requests' event loop);
the request's task awaits get(), which merges the Tokens events queued since its last call. A request's events are Admitted or Failed first, then Tokens, then exactly one
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
        self._next = None  # an event read past a run of Tokens, returned by the next get()

    async def get(self):
        """The next event; Tokens events already queued behind it come merged into one, so a reader that fell
        behind the engine answers with one chunk, not one per step."""
        event, self._next = (self._next, None) if self._next is not None else (await self._queue.get(), None)
        if not isinstance(event, Tokens):
            return event
        ids = event.ids
        while not self._queue.empty():
            queued = self._queue.get_nowait()
            if not isinstance(queued, Tokens):
                self._next = queued
                break
            ids = ids + queued.ids
        return event if ids is event.ids else Tokens(ids)


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
