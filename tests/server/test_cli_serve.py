"""`specpilot serve` as a user runs it (a subprocess): SIGTERM drains the streams in flight (each answered in full,
none aborted) and the process exits, with the engine in the server's thread or in a process of its own (which exits
too); bad flags are one `error:` line with status 2, before any weights load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from specpilot.cli import main
from tests.server.conftest import MODEL


def _start(target: str, flags: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str, list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "specpilot", "serve", "--target", target, "--drafter", "none",
                             "--port", "0", "--max-model-len", "256", "--served-model-name", MODEL, *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            # one intra-op thread: the tiny model gains nothing from two, and on a shared CPU a
                            # team of two waits at every op's barrier for its descheduled partner
                            env=os.environ | {"OMP_NUM_THREADS": "1"})
    lines: list[str] = []
    found = threading.Event()

    def read():
        for line in proc.stderr:
            lines.append(line)
            if "serving on http://" in line:
                found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(120):
        proc.kill()
        raise AssertionError("the server did not start:\n" + "".join(lines))
    url = next(line for line in lines if "serving on" in line).split("serving on ")[1].strip()
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url, lines
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
        time.sleep(0.1)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}"):
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("flags", [(), ("--engine-process",)], ids=["engine-thread", "engine-process"])
def test_sigterm_drains_the_streams_in_flight_then_exits(checkpoint_factory, flags):
    path, _ = checkpoint_factory("llama")  # a tiny random model: it loads in a moment; its text does not matter
    proc, url, lines = _start(str(path), flags)
    children = _children(proc.pid)  # the engine process (and multiprocessing's resource tracker) with the flag
    assert bool(children) == bool(flags)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    started = [threading.Event() for _ in range(4)]
    results: list = [None] * 4

    def stream(i: int):
        chunks = []
        try:
            _stream(i, chunks)
            results[i] = chunks
        finally:
            started[i].set()  # also when it failed: the test then fails at once, not after a timeout

    def _stream(i: int, chunks: list):
        for chunk in client.completions.create(model=MODEL, prompt=f"def f{i}(x):\n", max_tokens=120, stream=True,
                                               stream_options={"include_usage": True},
                                               extra_body={"ignore_eos": True}):
            chunks.append(chunk)
            started[i].set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        assert all(e.wait(60) for e in started) and all(t.is_alive() for t in threads)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while True:  # new connections are refused once the shutdown began
            try:
                httpx.get(url + "/health", timeout=1)
            except httpx.ConnectError:
                break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for t in threads:
            t.join(60)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    for chunks in results:
        assert chunks is not None
        assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 120
    log = "".join(lines)
    assert rc == -signal.SIGTERM, log  # uvicorn re-raises the SIGTERM it shut down on, after the drain
    assert log.count("finished (length)") == 4 and "finished (abort)" not in log
    # all four were still running when the shutdown began (each had 119 tokens to go at the signal)
    assert log.index("Shutting down") < min(i for i in range(len(log)) if log.startswith("finished (length)", i))
    assert "engine stopped (0 requests were still held at shutdown, now drained); 4 requests finished" in log
    assert all(_gone(pid) for pid in children), "a child of the server outlived it"


@pytest.mark.parametrize(("flags", "says"), [
    (["--port", "70000"], "--port 70000: must be in 0..65535"),
    (["--chat-template", "missing.jinja"], "--chat-template missing.jinja: no such file"),
    (["--max-waiting", "-1"], "max_waiting=-1: must be >= 0"),
    (["--max-num-seqs", "0"], "max_num_seqs=0: must be >= 1"),
    (["--tree", "chain:x"], "chain:x"),
])
def test_bad_flags_are_one_error_line(zoo_path, capsys, flags, says):
    assert main(["serve", "--target", zoo_path, "--drafter", "ngram", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and says in err
