"""The UI of a real deployment, reached as a script would: a free port to serve it on, a
`gradio_client` once it answers, and the rows of the tables it returns."""

import socket
from subprocess import Popen
from typing import Any

from gradio_client import Client

from tests.workers.helpers import wait_for

HOST = "127.0.0.1"


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


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
