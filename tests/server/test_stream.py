"""RequestStream: events in order, queued Tokens merged into one, deliver() from another thread."""

import asyncio
import threading

from specpilot.server.stream import Admitted, Finished, RequestStream, Tokens, deliver


def _read_all(events):
    async def main():
        stream = RequestStream(asyncio.get_running_loop())
        for e in events:
            stream._queue.put_nowait(e)
        out = []
        while not out or not isinstance(out[-1], Finished):
            out.append(await stream.get())
        return out

    return asyncio.run(main())


def test_queued_tokens_come_merged_and_the_terminal_event_stays_last():
    out = _read_all([Admitted(), Tokens([1]), Tokens([2, 3]), Tokens([4]), Finished("length")])
    assert out == [Admitted(), Tokens([1, 2, 3, 4]), Finished("length")]


def test_a_run_of_tokens_stops_at_the_next_other_event():
    out = _read_all([Tokens([5]), Admitted(), Tokens([6]), Tokens([7]), Finished("eos")])
    assert out == [Tokens([5]), Admitted(), Tokens([6, 7]), Finished("eos")]


def test_deliver_from_another_thread_keeps_order():
    async def main():
        stream = RequestStream(asyncio.get_running_loop())
        batches = [[(stream, Tokens([i]))] for i in range(50)] + [[(stream, Finished("length"))]]
        thread = threading.Thread(target=lambda: [deliver(b) for b in batches])
        thread.start()
        ids, event = [], None
        while not isinstance(event, Finished):
            event = await stream.get()
            ids += event.ids if isinstance(event, Tokens) else []
        thread.join()
        return ids

    assert asyncio.run(main()) == list(range(50))
