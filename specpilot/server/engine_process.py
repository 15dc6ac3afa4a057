"""RemoteEngine: the engine in a process of its own, behind the client API that EngineLoop drives.

The server's engine thread and its event loop share one interpreter lock; while the event loop writes a step's
SSE chunks the engine's next step waits for the lock. With the engine in a child process ("spawn"), the step
runs on the child's own interpreter and the server process only mirrors it, as vLLM's engine core does.

The parent sends ("add", ...) (from the thread that submits the request), ("abort", id), ("warmup",) and ("close",)
down one pipe. The child adds and aborts what came, steps while it holds unfinished requests and sends one message
per step up the other pipe: each request's new tokens and finish, the adds it took or refused (ValueError /
NotImplementedError, with the message), each touched request's speculative counters since its last message (so
the parent's mirror SpecStats supports ServerMetrics.step and spec_stats without re-sending growing lists), and the
scheduler's running, waiting and slot counts. The parent's step() hands out the last step's events
(while_verifying) and then blocks in recv, the lock released, for the next message. A child that raises sends its
error and exits; one that dies closes its pipe: either way step() raises and the loop fails every request in
flight (503). The child ignores SIGINT and SIGTERM (the server drains first, then closes it) and exits when the
parent closes it or dies.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.util import Finalize

from specpilot.engine.request import RequestOutput
from specpilot.engine.stats import SpecStats

CLOSE_TIMEOUT_S = 10.0  # a closed child that has not exited by then is terminated


@dataclass(slots=True)
class SchedulerView:
    """The child scheduler's counts as of its last message (what the server's gauges and bound read)."""

    running: range = range(0)
    waiting: range = range(0)
    num_slots: int = 0


@dataclass(slots=True)
class StepMessage:
    """What the child reports of one step (or of adds it took or refused with no step to run)."""

    outputs: list[tuple[str, list[int], bool, str | None]] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    # id -> (steps, emitted, new nodes, new accepted, accepted_per_depth, preempted)
    stats: dict[str, tuple] = field(default_factory=dict)
    running: int = 0
    waiting: int = 0
    slots: int = 0


class RemoteEngine:
    """SpecEngine's client API over an engine that `factory()` builds in a child process. `factory` must be
    picklable (a module-level function, or a functools.partial of one). The constructor returns once the child
    has built the engine (its model config and scheduler config come back); warmup() then allocates its caches."""

    confirms_adds = True  # an add is taken (or refused) by the child; step() reports which (take_verdicts)

    def __init__(self, factory: Callable[[], object], timeout: float | None = None):
        ctx = mp.get_context("spawn")
        down_recv, self._down = ctx.Pipe(duplex=False)
        self._up, up_send = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=_child_main, args=(factory, down_recv, up_send), name="specpilot-engine",
                                   daemon=False)  # a daemonic process may not start the compile workers it needs
        self.process.start()
        down_recv.close()
        up_send.close()
        # at the parent's exit (or this object's collection): the child closed before multiprocessing joins it
        self._finalizer = Finalize(self, _shut, (self.process, self._down, self._up), exitpriority=10)
        self._sending = threading.Lock()
        self.while_verifying: Callable[[], None] | None = None
        self.scheduler: SchedulerView | None = None
        self._live: set[str] = set()  # added and not finished, refused or aborted, as the parent knows
        self._stats: dict[str, SpecStats] = {}
        self._done: list[str] = []  # finished in the last message: their stats are read once more, then dropped
        self._admitted: list[str] = []
        self._refused: list[tuple[str, str]] = []
        built = self._expect("built", timeout, "build the engine")
        self.runner, self.config = _Runner(built["model"]), built["config"]

    # ---- the client API EngineLoop uses ----------------------------------------------------------------------

    def warmup(self) -> dict:
        self._send(("warmup",))
        warm = self._expect("warm", None, "warm up")
        self.scheduler = SchedulerView(num_slots=warm.pop("slots"))
        return warm

    def add_request(self, prompt_ids: list[int], params, request_id: str | None = None, priority: int = 0) -> str:
        """Sends the add (from any thread); the child takes or refuses it (take_verdicts after a step). A child
        that is gone takes nothing: the next step() says so."""
        if request_id is None:
            raise ValueError("a remote engine's requests need a request_id")
        self._stats[request_id] = SpecStats()
        self._live.add(request_id)
        try:
            self._send(("add", list(prompt_ids), params, request_id, priority))
        except RuntimeError:
            pass
        return request_id

    def abort(self, request_id: str) -> None:
        self._live.discard(request_id)
        self._done.append(request_id)  # its stats are read once more (the abort's metrics), then dropped
        self._send(("abort", request_id))
        if self.scheduler is not None:  # no message may follow (an idle child): the counts cannot exceed what lives
            running = min(len(self.scheduler.running), len(self._live))
            waiting = min(len(self.scheduler.waiting), len(self._live) - running)
            self.scheduler = SchedulerView(range(running), range(waiting), self.scheduler.num_slots)

    def has_unfinished(self) -> bool:
        return bool(self._live)

    def stats(self, request_id: str) -> SpecStats:
        return self._stats[request_id]

    def step(self) -> list[RequestOutput]:
        for rid in self._done:
            self._stats.pop(rid, None)
        self._done = []
        if self.while_verifying is not None:  # the child steps meanwhile
            self.while_verifying()
        # a parent that fell behind takes every message waiting as one step: one dispatch and one hand-out for them
        outputs: dict[str, RequestOutput] = {}
        self._take(self._expect("step", None, "step"), outputs)
        while self._up.poll():
            self._take(self._expect("step", None, "step"), outputs)
        return list(outputs.values())

    def _take(self, msg: StepMessage, outputs: dict[str, RequestOutput]) -> None:
        self._admitted += msg.admitted
        self._refused += msg.refused
        for rid, _ in msg.refused:
            self._live.discard(rid)
            self._stats.pop(rid, None)
        for rid, delta in msg.stats.items():
            if rid in self._stats:
                _apply(self._stats[rid], delta)
        self.scheduler = SchedulerView(range(msg.running), range(msg.waiting), msg.slots)
        for rid, tokens, finished, reason in msg.outputs:
            if rid in outputs:
                outputs[rid].new_token_ids += tokens
                outputs[rid].finished, outputs[rid].finish_reason = finished, reason
            else:
                outputs[rid] = RequestOutput(rid, tokens, finished, reason)
            if finished:
                self._live.discard(rid)
                self._done.append(rid)

    def take_verdicts(self) -> tuple[list[str], list[tuple[str, str]]]:
        """The adds the child took and the ones it refused (id, message) since the last call."""
        verdicts = self._admitted, self._refused
        self._admitted, self._refused = [], []
        return verdicts

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    @property
    def error(self) -> str | None:
        """Why the child is gone, once it is."""
        if self.process.is_alive():
            return None
        return f"the engine process exited (exit code {self.process.exitcode})"

    def close(self) -> None:
        """Tells the child to exit and joins it (terminated past CLOSE_TIMEOUT_S)."""
        self._finalizer()

    # ---- the pipes ------------------------------------------------------------------------------------------

    def _send(self, message: tuple) -> None:
        try:
            with self._sending:  # adds come from the submitting threads, the rest from the engine thread
                self._down.send(message)
        except (OSError, ValueError):  # the child is gone (its pipe closed) or this engine was closed
            raise RuntimeError(self.error or "the engine process was closed") from None

    def _expect(self, kind: str, timeout: float | None, doing: str):
        try:
            if timeout is not None and not self._up.poll(timeout):
                raise RuntimeError(f"the engine process did not {doing} within {timeout:g} s")
            got, body = self._up.recv()
        except (EOFError, OSError):
            self.process.join(1.0)
            raise RuntimeError(f"the engine process died while asked to {doing} (exit code "
                               f"{self.process.exitcode})") from None
        if got == "refused":  # a bad input the factory refused (a missing checkpoint, a bad flag)
            self.close()
            raise ValueError(body)
        if got == "error":
            self.close()
            raise RuntimeError(body)
        if got != kind:
            raise RuntimeError(f"the engine process answered {got!r} where {kind!r} was expected")
        return body


class _Runner:
    """What the server reads of the engine's runner: the model config."""

    def __init__(self, config):
        self.config = config


def _apply(stats: SpecStats, delta: tuple) -> None:
    stats.steps, stats.emitted, nodes, accepted, per_depth, stats.preempted = delta
    stats.nodes += nodes
    stats.accepted += accepted
    stats.accepted_per_depth = per_depth


def _shut(process, down: Connection, up: Connection) -> None:
    """Closes the child: a close message, a join, then terminate and kill if it lingers (also at the parent's
    exit, through multiprocessing's Finalize)."""
    try:
        down.send(("close",))
    except (OSError, ValueError):
        pass
    process.join(CLOSE_TIMEOUT_S)
    if process.is_alive():
        process.terminate()
        process.join(CLOSE_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join()
    down.close()
    up.close()


# ---- the child ----------------------------------------------------------------------------------------------

def _child_main(factory, down: Connection, up: Connection) -> None:
    # the server drains its requests before it closes the engine: a signal to the process group must not end the
    # engine under them (the child still exits when its parent dies: its pipes close)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        engine = factory()
    except (ValueError, NotImplementedError, FileNotFoundError) as e:  # the CLI's bad-input errors
        up.send(("refused", str(e)))
        return
    except Exception as e:  # noqa: BLE001 (reported to the parent)
        up.send(("error", f"building the engine failed: {type(e).__name__}: {e}"))
        return
    up.send(("built", {"model": engine.runner.config, "config": engine.config}))
    try:
        _Core(engine, down, up).run()
    except (BrokenPipeError, EOFError):  # the parent is gone
        return


class _Core:
    """The child's loop: take the queued commands, step while anything is unfinished, report each step. A step's
    report goes up during the next step's verify (the engine's while_verifying), while the GPU computes, so that
    building and sending it does not lengthen the step; at once when no step follows, when the step launched no
    verify, or when it brought a request's first token (its time to first token does not wait a step prologue)."""

    def __init__(self, engine, down: Connection, up: Connection):
        self.engine, self.down, self.up = engine, down, up
        self.sent: dict[str, int] = {}  # request id -> its SpecStats.nodes entries already sent
        self.fresh: set[str] = set()  # requests with no token reported yet
        self.msg = StepMessage()  # the verdicts since the last report
        self.pending: list[RequestOutput] = []  # the last step's outputs, not reported yet
        self.reported = False  # the running step's verify has sent the report
        self.parent = mp.parent_process()
        engine.while_verifying = self._report_in_step

    def run(self) -> None:
        while True:
            idle = not self.engine.has_unfinished()
            if not self._commands(block=idle and not self._has_news()):
                return
            try:
                if self.engine.has_unfinished():
                    self._step()
                elif self._has_news():
                    self._report()
            except Exception as e:  # noqa: BLE001 (the parent fails the requests in flight)
                self.up.send(("error", f"engine step failed: {type(e).__name__}: {e}"))
                return

    def _has_news(self) -> bool:
        return bool(self.pending or self.msg.admitted or self.msg.refused)

    def _commands(self, block: bool) -> bool:
        """Applies every queued command (waiting for one when idle); False once asked to close."""
        if block:
            ready = wait([self.down] + ([self.parent.sentinel] if self.parent is not None else []))
            if self.down not in ready:  # the parent died
                return False
        while self.down.poll():
            cmd = self.down.recv()
            if cmd[0] == "add":
                self._add(*cmd[1:])
            elif cmd[0] == "abort":
                self._abort(cmd[1])
            elif cmd[0] == "warmup":
                try:
                    report = dict(self.engine.warmup() or {})
                except Exception as e:  # noqa: BLE001 (reported to the parent's warmup)
                    self.up.send(("error", f"engine warmup failed: {type(e).__name__}: {e}"))
                    return False
                self.up.send(("warm", report | {"slots": self.engine.scheduler.num_slots}))
            else:  # close
                return False
        return True

    def _add(self, prompt_ids, params, request_id, priority) -> None:
        try:
            self.engine.add_request(prompt_ids, params, request_id=request_id, priority=priority)
        except (ValueError, NotImplementedError) as e:
            self.msg.refused.append((request_id, str(e)))
            return
        self.msg.admitted.append(request_id)
        self.sent[request_id] = 0
        self.fresh.add(request_id)

    def _abort(self, request_id: str) -> None:
        try:
            self.engine.abort(request_id)
        except KeyError:  # it finished before the abort came
            pass
        self.sent.pop(request_id, None)
        self.fresh.discard(request_id)
        self.pending = [o for o in self.pending if o.request_id != request_id]

    def _step(self) -> None:
        self.reported = False
        outputs = self.engine.step()
        first = self.fresh and any(o.request_id in self.fresh and o.new_token_ids for o in outputs)
        self.pending += outputs  # after a verify's report: this step's alone
        if first or not self.reported:
            self._report()

    def _report_in_step(self) -> None:
        self.reported = True
        if self._has_news():
            self._report()

    def _report(self) -> None:
        """Sends the pending outputs, their requests' speculative counters since the last report, the verdicts and
        the scheduler's counts."""
        msg, outputs = self.msg, self.pending
        self.msg, self.pending = StepMessage(), []
        finished: dict[str, bool] = {}
        for out in outputs:
            msg.outputs.append((out.request_id, out.new_token_ids, out.finished, out.finish_reason))
            if out.new_token_ids:
                self.fresh.discard(out.request_id)
            finished[out.request_id] = finished.get(out.request_id, False) or out.finished
        for rid, done in finished.items():
            seen = self.sent.pop(rid, 0) if done else self.sent.get(rid, 0)
            try:
                st = self.engine.stats(rid)
            except KeyError:
                continue
            msg.stats[rid] = (st.steps, st.emitted, st.nodes[seen:], st.accepted[seen:], list(st.accepted_per_depth),
                              st.preempted)
            if not done:
                self.sent[rid] = len(st.nodes)
        sched = self.engine.scheduler
        if sched is not None:
            msg.running, msg.waiting, msg.slots = len(sched.running), len(sched.waiting), sched.num_slots
        self.up.send(("step", msg))
