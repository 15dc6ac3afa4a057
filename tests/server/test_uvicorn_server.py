"""The listener: bound before the model loads, so a bad or busy port is one clear error at once."""

from __future__ import annotations

import socket

import pytest

from specpilot.server.uvicorn_server import address, bind


def test_port_zero_picks_a_free_port():
    with bind("127.0.0.1", 0) as sock:
        assert address(sock).startswith("http://127.0.0.1:") and sock.getsockname()[1] > 0


def test_a_busy_port_is_refused_in_one_line():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ValueError, match=f"--port {port}: 127.0.0.1:{port} is in use; pick another port"):
            bind("127.0.0.1", port)


@pytest.mark.parametrize(("host", "port", "says"), [("127.0.0.1", 70000, "--port 70000: must be in 0..65535"),
                                                    ("no-such-host.invalid", 0, "--host no-such-host.invalid: ")])
def test_bad_addresses_are_refused(host, port, says):
    with pytest.raises(ValueError, match=says):
        bind(host, port)
