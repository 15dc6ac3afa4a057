"""RequestStream: how the engine thread hands one request's events to the asyncio task answering it.

The engine thread calls put() (thread-safe: the event is queued on the request's event loop); the request's task
awaits get(). A request's events are Admitted or Failed first, then Tokens, then exactly one Finished (or a
Failed if the engine stopped under it).
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
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()

    def put(self, event) -> None:
        """From any thread."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody is waiting for this request any more
            pass

    async def get(self):
        return await self._queue.get()
