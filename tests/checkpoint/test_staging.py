"""The staging directory (checkpoint/staging.py) of `specpilot compress`: nothing left behind on SIGTERM / SIGINT /
an error, stale ones of dead processes removed by the next run, and the output's permissions set by the umask."""

import copy
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specpilot.weights import compress as compress_module
from specpilot.weights.compress import compress

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bf16_checkpoint(checkpoint_factory, tmp_path_factory):
    _, hf = checkpoint_factory("llama")
    path = tmp_path_factory.mktemp("bf16")
    copy.deepcopy(hf).to(torch.bfloat16).save_pretrained(path)  # why: the factory's model is shared (parity tests)
    return path


def _leftovers(dst: Path) -> list[Path]:
    return list(dst.parent.glob(f".{dst.name}.tmp-*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_compress_leaves_nothing_behind(bf16_checkpoint, tmp_path, sig):
    """The CLI in its own process, stopped after the weights file is written but before the rename: the staging
    directory (holding a file as large as the output) is removed and the exit status is 128 + signal."""
    dst, marker = tmp_path / "out", tmp_path / "written"
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "import specpilot.weights.compress as c\n"
        "real = c.save_file\n"
        "def stalled(*args, **kwargs):\n"
        "    real(*args, **kwargs)\n"
        f"    Path({str(marker)!r}).write_text('written')\n"
        "    time.sleep(300)\n"
        "c.save_file = stalled\n"
        "from specpilot.cli import main\n"
        f"sys.exit(main(['compress', {str(bf16_checkpoint)!r}, {str(dst)!r}]))\n"
    )
    # the default SIGINT disposition, as a process started from a shell has: a pytest-xdist worker ignores SIGINT,
    # and a child would inherit that (Python keeps an ignored SIGINT ignored)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "compress never reached the stall"
            time.sleep(0.1)
        staged = _leftovers(dst)
        assert len(staged) == 1 and (staged[0] / "model.safetensors").stat().st_size > 0
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 128 + sig
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not dst.exists() and _leftovers(dst) == []


def test_a_failing_compress_leaves_nothing_behind(bf16_checkpoint, tmp_path, monkeypatch):
    real = compress_module.save_file

    def disk_full(tensors, path, metadata=None):
        real(tensors, path, metadata=metadata)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(compress_module, "save_file", disk_full)
    dst = tmp_path / "out"
    with pytest.raises(OSError, match="No space left"):
        compress(str(bf16_checkpoint), dst)
    assert not dst.exists() and _leftovers(dst) == []


def test_a_rerun_removes_the_staging_directory_of_a_dead_process(bf16_checkpoint, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    dst, host = tmp_path / "out", socket.gethostname()
    stale = tmp_path / f".out.tmp-{host}-{dead.pid}-k2j4x9"
    alive = tmp_path / f".out.tmp-{host}-{os.getpid()}-a8c1zz"  # a compress still running in this process
    elsewhere = tmp_path / f".out.tmp-other-host-{dead.pid}-q0w9e8"  # a pid of another machine (shared disk)
    for d in (stale, alive, elsewhere):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"\0" * 4096)
    compress(str(bf16_checkpoint), dst)
    assert dst.is_dir() and not stale.exists() and alive.exists() and elsewhere.exists()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_the_output_gets_the_umask_permissions(bf16_checkpoint, tmp_path, umask):
    previous = os.umask(umask)
    try:
        compress(str(bf16_checkpoint), tmp_path / "out")
    finally:
        os.umask(previous)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o777 & ~umask
    files = list((tmp_path / "out").iterdir())
    assert len(files) >= 3 and all(f.stat().st_mode & 0o777 == 0o666 & ~umask for f in files)
