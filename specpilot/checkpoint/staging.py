"""The staging directory an output directory (a model `specpilot compress` writes) is written into before it is
renamed into place.

It sits beside the output as `.{name}.tmp-{host}-{pid}-{random}` and is removed on an error, SIGINT or SIGTERM
(then a signal with its default action ends the process with status 128 + signal, 143 for SIGTERM, unwinding
through `finally` blocks; SIGINT under Python's own handler raises KeyboardInterrupt); one left by a killed
process (SIGKILL, power loss) is removed by the next run for the same output once its process is gone. The
published directory and its files get the permissions the umask gives (tempfile makes 0700).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Signalled(BaseException):
    """Raised by the handler so that the staging directory is removed on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _prefix(dst: Path) -> str:
    return f".{dst.name}.tmp-"


@contextmanager
def staging_dir(dst: Path) -> Iterator[Path]:
    """A fresh staging directory for `dst` (stale ones of dead processes removed first), gone on the way out."""
    remove_stale(dst)
    previous = _trap()
    signum, tmp = None, None
    try:
        tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f"{_prefix(dst)}{socket.gethostname()}-{os.getpid()}-"))
        yield tmp
    except _Signalled as e:
        signum = e.signum
    finally:
        for s in previous:  # why: a second signal must not cut the clean-up short
            signal.signal(s, signal.SIG_IGN)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for s, handler in previous.items():
            signal.signal(s, handler)
    if signum is not None:
        if callable(previous[signum]):  # Python's SIGINT handler (KeyboardInterrupt) or the caller's own
            signal.raise_signal(signum)
        raise SystemExit(128 + signum)


def publish(tmp: Path, dst: Path) -> None:
    """Gives the staged directory and its files the umask's permissions, then renames it to `dst`."""
    mask = os.umask(0)
    os.umask(mask)
    for f in tmp.rglob("*"):
        f.chmod((0o777 if f.is_dir() else 0o666) & ~mask)
    tmp.chmod(0o777 & ~mask)
    tmp.rename(dst)


def remove_stale(dst: Path) -> list[Path]:
    """Removes the staging directories of `dst` that this host's dead processes left; returns them."""
    prefix, host, removed = _prefix(dst), socket.gethostname(), []
    for path in dst.parent.glob(glob.escape(prefix) + "*"):
        owner = path.name[len(prefix):].rsplit("-", 2)
        if len(owner) != 3 or owner[0] != host or not owner[1].isdigit() or not path.is_dir():
            continue
        if not _alive(int(owner[1])):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _trap() -> dict:
    """Handlers for SIGINT / SIGTERM that raise _Signalled; returns the previous ones, to restore. A signal the
    process ignores stays ignored (a background job's SIGINT). Handlers can only be set on the main thread:
    elsewhere nothing is trapped (errors still clean up)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        raise _Signalled(signum)

    previous = {}
    for s in SIGNALS:
        current = signal.getsignal(s)
        if current is not signal.SIG_IGN:
            previous[s] = signal.SIG_DFL if current is None else current  # None: set outside Python
            signal.signal(s, handler)
    return previous
