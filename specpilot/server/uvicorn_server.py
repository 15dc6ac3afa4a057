"""The HTTP listener: the socket bound before the model loads (a busy port fails at once, and port 0 picks a
free one), then uvicorn serving the app on it until SIGTERM or SIGINT (a graceful shutdown: new connections
refused, in-flight responses finished, then the app's shutdown drains the engine)."""

from __future__ import annotations

import errno
import logging
import socket

import uvicorn

log = logging.getLogger("specpilot.server")


def bind(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port}: must be in 0..65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: {e.strerror}; pass an address such as 127.0.0.1 or 0.0.0.0") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"--port {port}: {host}:{port} is in use; pick another port (or stop what holds it)") \
                from None
        raise ValueError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None
    sock.set_inheritable(True)
    return sock


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"


def serve(app, sock: socket.socket, log_level: str = "info", access_log: bool = True) -> None:
    """Runs uvicorn on the bound socket until shutdown (blocking; signals are handled on the main thread)."""
    config = uvicorn.Config(app, log_level=log_level, access_log=access_log, timeout_keep_alive=5)
    log.info("serving on %s", address(sock))
    uvicorn.Server(config).run(sockets=[sock])
