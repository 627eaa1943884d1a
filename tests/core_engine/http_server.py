"""Run an app under a real uvicorn server on a free loopback port, for the HTTP tests."""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

HANG_GUARD_S = 120  # starting or stopping the server (quiet: milliseconds); only a hang fails


@contextlib.contextmanager
def running_server(app: FastAPI, send_buffer: int | None = None) -> Iterator[str]:
    """Serve `app` on a background thread; yields its base URL, shuts it down on exit.
    `send_buffer`: the bytes of the kernel's send buffer of each connection (default: the
    kernel's, which grows to megabytes on loopback)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error")
    server = uvicorn.Server(config)
    run = server.run
    if send_buffer is not None:  # accepted connections inherit the listener's buffer size
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        listener.bind(("127.0.0.1", 0))
        run = functools.partial(server.run, sockets=[listener])
    thread = threading.Thread(target=run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + HANG_GUARD_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=HANG_GUARD_S)
        assert not thread.is_alive()
