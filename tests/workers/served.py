"""The UI of a real deployment, reached as a script would: a free port to serve it on, a
`gradio_client` once it answers, and the rows of the tables it returns."""

import itertools
import os
import random
import re
import socket
from pathlib import Path
from subprocess import Popen
from typing import Any

from gradio_client import Client

from tests.workers.helpers import wait_for

HOST = "127.0.0.1"
# The ports of the servers the tests start as processes lie below the kernel's ephemeral range
# (every outgoing connection and every bind to port 0 on the machine takes its port from it, so
# a port found free there may be taken before a process started seconds later binds it), in a
# slice of their own for each pytest-xdist worker: gw0 20000-20999, gw1 21000-21999, ...
PORTS_FROM, PORTS_PER_WORKER = 20_000, 1_000
_next_offset = itertools.count(random.randrange(PORTS_PER_WORKER))


def _ephemeral_ports_from() -> int:
    """The first port of the kernel's ephemeral range (Linux's default if it cannot tell)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A loopback port nothing listens on now, from this test process's slice."""
    worker = re.search(r"\d+$", os.environ.get("PYTEST_XDIST_WORKER", ""))
    first = PORTS_FROM + PORTS_PER_WORKER * (int(worker.group()) if worker else 0)
    if first + PORTS_PER_WORKER > _ephemeral_ports_from():  # no room below it: any free port
        with socket.socket() as probe:
            probe.bind((HOST, 0))
            return probe.getsockname()[1]
    for _ in range(PORTS_PER_WORKER):
        port = first + next(_next_offset) % PORTS_PER_WORKER
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:  # in use (or lingering): the next one
                continue
        return port
    raise AssertionError(f"no free port among {first}-{first + PORTS_PER_WORKER - 1}")


def _answers(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((HOST, port)) == 0


def ui_client(port: int, process: Popen, timeout: float = 120) -> Client:
    """A client of the UI that ``process`` serves on ``port``, once it answers."""

    def up() -> bool:
        assert process.poll() is None, f"the UI's process exited ({process.returncode})"
        return _answers(port)

    wait_for(up, timeout, f"the UI on port {port}", interval=0.5)
    return Client(f"http://{HOST}:{port}/", verbose=False)


def table_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """A Dataframe's value (``headers`` and ``data``) as one dict per row."""
    return [dict(zip(table["headers"], row, strict=True)) for row in table["data"]]
