"""EngineLoop: the one thread that drives the SpecEngine for the server.

HTTP handlers never touch the engine: they submit a Job (or an abort) to the loop's inbox and read the job's
RequestStream. The loop adds what the inbox holds, runs engine.step() while anything is unfinished (else sleeps
until the inbox wakes it), hands each request's new tokens to its stream and counts the metrics. A step's events
go out during the next step's verify (SpecEngine.while_verifying), while the GPU computes, so the event loop's
Python work on them does not hold the interpreter lock between steps; with no step to follow, at once. Every
submitted job gets exactly one terminal event (Finished, or Failed). stop() lets the requests in flight finish,
then ends the thread; a step that raises fails every request in flight and ends it too (health turns 503).
An engine in a process of its own (engine_process.RemoteEngine, confirms_adds) gets each add at submit(), from
the submitting thread, so that it joins the child's next step rather than the one after the engine thread's next
message; the child takes or refuses it, and the request's Admitted (or its 400) goes out with the step that
reports it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from specpilot.engine.engine import SpecEngine
from specpilot.engine.request import RequestOutput
from specpilot.engine.stats import SpecStats
from specpilot.server.job import Job
from specpilot.server.metrics import ServerMetrics
from specpilot.server.stream import Admitted, Failed, Finished, Tokens, deliver

log = logging.getLogger("specpilot.server")

_STOP = object()


class EngineLoop:
    def __init__(self, engine: SpecEngine, metrics: ServerMetrics):
        self.engine, self.metrics = engine, metrics
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._jobs: dict[str, Job] = {}  # the engine thread's own: added and not finished
        self._held = 0  # submitted and not finished (the 429 bound counts these)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="specpilot-engine", daemon=True)
        self._ready = threading.Event()
        self._out: list = []  # (stream, event) pairs of this iteration, delivered together
        self.error: str | None = None  # why the loop died, if it did
        self.stopping = False
        self._closed = False  # the thread has ended (or is ending): nothing more is accepted
        self.finished = 0  # requests finished since start (any reason)
        self._flushed = False  # the running step's verify has handed out the held events
        self._confirms = getattr(engine, "confirms_adds", False)  # adds are taken or refused by a later step

    # ---- any thread -------------------------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Starts the thread and waits until the engine's caches are allocated (and on a GPU its verify graphs
        captured), so that no request pays for that."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the engine did not warm up in time")
        if self.error is not None:
            raise RuntimeError(self.error)

    def submit(self, job: Job, capacity: int) -> str | None:
        """Queues the job (None), or says why not: "full" (`capacity` jobs are held already: the caller answers
        429) or "closed" (the loop has stopped or failed: 503)."""
        with self._lock:
            if self._closed or self.stopping or self.error is not None:
                return "closed"
            if self._held >= capacity:
                return "full"
            self._held += 1
            self._inbox.put(job)  # before the add: a step that reports the request finds its job queued
            if self._confirms:  # errors (a dead engine process) surface at the engine thread's next step
                self.engine.add_request(job.prompt_ids, job.params, request_id=job.request_id)
        self._wake.set()
        return None

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Lets every held request finish, then ends the thread (waits up to timeout)."""
        self.stopping = True
        self._inbox.put(_STOP)
        self._wake.set()
        self._thread.join(timeout)

    @property
    def held(self) -> int:
        return self._held

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None and getattr(self.engine, "alive", True)

    @property
    def reason(self) -> str | None:
        """Why the loop cannot serve: its error, or its engine process's exit (even while idle)."""
        return self.error or getattr(self.engine, "error", None)

    # ---- the engine thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.engine.warmup()
        except Exception as e:  # noqa: BLE001 (reported to start())
            self.error = f"engine warmup failed: {type(e).__name__}: {e}"
            self._closed = True
        self._ready.set()
        if self.error is not None:
            return
        stop = False
        try:
            self.engine.while_verifying = self._flush_in_step
            while True:
                stop = self._drain_inbox() or stop
                if self._jobs:
                    # the events held since the last step (its tokens, admissions, refusals) go out while this
                    # step's verify runs on the GPU, so the event loop's work on them does not lengthen the step
                    self._flushed = False
                    outputs = self.engine.step()
                    if not self._flushed:  # the step launched no verify
                        self._flush()
                    if self._confirms:
                        stop = self._drain_inbox() or stop  # the jobs whose adds this step may report
                        self._verdicts(*self.engine.take_verdicts())
                    self._dispatch(outputs)
                    if self._jobs and not self.engine.has_unfinished():
                        raise RuntimeError(f"the engine holds none of the {len(self._jobs)} requests it was given")
                    if not self._jobs:  # no step follows to hand these out
                        self._flush()
                elif stop:
                    self._flush()
                    return
                else:
                    self._flush()
                    self._wake.wait()
                    self._wake.clear()
        except Exception as e:  # noqa: BLE001 (the server stays up to say so: health 503)
            log.exception("engine step failed; failing %d requests in flight", len(self._jobs))
            self.error = f"engine step failed: {type(e).__name__}: {e}"
            for job in list(self._jobs.values()):
                self._release(job, Failed(503, self.error))
        finally:
            with self._lock:  # after this no submit() queues anything, so the drain below answers every job
                self._closed = True
            while True:  # whatever is still queued gets its answer too
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, Job):
                    self._release(item, Failed(503, self.error or "the server is shutting down"), added=False)
            self._flush()
            self._update_gauges()

    def _drain_inbox(self) -> bool:
        """Adds queued jobs and applies aborts; True once stop() was asked."""
        stop = False
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return stop
            if item is _STOP:
                stop = True
            elif isinstance(item, Job):
                self._add(item)
            else:
                self._abort(item[1])

    def _add(self, job: Job) -> None:
        self._jobs[job.request_id] = job  # an add that fails (not a refusal) is failed with the requests in flight
        if self._confirms:  # added at submit()
            self._update_gauges()
            return
        try:
            self.engine.add_request(job.prompt_ids, job.params, request_id=job.request_id)
        except (ValueError, NotImplementedError) as e:
            self._release(job, Failed(400, str(e)))
            return
        self._out.append((job.stream, Admitted()))
        self._update_gauges()

    def _verdicts(self, admitted: list[str], refused: list[tuple[str, str]]) -> None:
        """The adds the engine process took (Admitted) and refused (400), ahead of the step's tokens."""
        for rid in admitted:
            job = self._jobs.get(rid)
            if job is not None:
                self._out.append((job.stream, Admitted()))
        for rid, message in refused:
            job = self._jobs.get(rid)
            if job is not None:
                self._release(job, Failed(400, message))

    def _abort(self, request_id: str) -> None:
        job = self._jobs.get(request_id)
        if job is None:  # finished before the abort came
            return
        self.engine.abort(request_id)
        self._finish(job, "abort", time.perf_counter())

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        now = time.perf_counter()
        for out in outputs:
            job = self._jobs.get(out.request_id)
            if job is None:
                continue
            if out.new_token_ids:
                if job.first_token is None:
                    job.first_token = now
                else:
                    self.metrics.emitted(now - job.last_token, len(out.new_token_ids))
                job.last_token = now
                job.tokens += len(out.new_token_ids)
                self.metrics.generation_tokens.inc(len(out.new_token_ids))
                self._out.append((job.stream, Tokens(out.new_token_ids)))
            job.steps_seen, job.per_pos_seen = self.metrics.step(self._stats(job), job.steps_seen, job.per_pos_seen)
            if out.finished:
                self._finish(job, out.finish_reason, now)
        self._update_gauges()

    def _finish(self, job: Job, reason: str, now: float) -> None:
        stats = self._stats(job)
        job.steps_seen, job.per_pos_seen = self.metrics.step(stats, job.steps_seen, job.per_pos_seen)
        ttft = job.first_token - job.arrival if job.first_token is not None else None
        decode = now - job.first_token if job.first_token is not None else None
        self.metrics.finished("stop" if reason == "eos" else reason, len(job.prompt_ids), job.tokens,
                              now - job.arrival, ttft, decode, stats.preempted)
        spec = spec_stats(stats)
        log.info("request %s finished (%s): prompt %d tokens, completion %d tokens, tau %.2f, latency %.3f s, "
                 "ttft %s", job.request_id, reason, len(job.prompt_ids), job.tokens, stats.tau, now - job.arrival,
                 f"{ttft:.3f} s" if ttft is not None else "-")
        self.finished += 1
        self._release(job, Finished(reason, spec))

    def _release(self, job: Job, event, added: bool = True) -> None:
        """The job's terminal event; its place in the bound is free."""
        if added:
            self._jobs.pop(job.request_id, None)
        with self._lock:
            self._held -= 1
        self._out.append((job.stream, event))

    def _flush_in_step(self) -> None:
        self._flushed = True
        self._flush()

    def _flush(self) -> None:
        if self._out:
            out, self._out = self._out, []
            deliver(out)

    def _stats(self, job: Job) -> SpecStats:
        try:
            return self.engine.stats(job.request_id)
        except KeyError:  # aborted before the engine's first step: it has no record of the request
            return SpecStats()

    def _update_gauges(self) -> None:
        sched = self.engine.scheduler
        running = len(sched.running) if sched is not None else 0
        self.metrics.scheduler(running, len(self._jobs) - running, sched.num_slots if sched is not None else 0)


def spec_stats(stats: SpecStats) -> dict:
    """A response's spec_stats: target steps, tau (tokens per step, bonus included), drafts (steps that verified
    draft tokens), draft and accepted tokens, accepted tokens per draft position, preemptions."""
    return {"steps": stats.steps, "tau": round(stats.tau, 4), "drafts": sum(1 for n in stats.nodes if n > 0),
            "draft_tokens": sum(stats.nodes), "accepted_tokens": sum(stats.accepted),
            "accepted_per_pos": list(stats.accepted_per_depth), "preempted": stats.preempted}
