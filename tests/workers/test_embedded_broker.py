"""The embedded broker's exchange tables under processes that bind at the same moment (as
``rlwb up``'s two workers do on a fresh data dir): no binding is lost, no reader sees a partial
table, and an unbind removes only its own entry."""

import subprocess
import sys
import time
from pathlib import Path

from kombu import Connection, Exchange, Queue

ROOT = Path(__file__).resolve().parents[2]
TRANSPORT = "workers.embedded_broker:Transport"
BIND = """
import sys, time
from pathlib import Path
from kombu import Connection, Exchange, Queue
folder, name = Path(sys.argv[1]), sys.argv[2]
options = {"data_folder_in": str(folder), "data_folder_out": str(folder),
           "control_folder": str(folder / "control")}
with Connection("filesystem://localhost/", transport=sys.argv[3],
                transport_options=options) as connection:
    channel = connection.channel()
    (folder / f"{name}.ready").touch()
    while not (folder / "go").exists():
        pass
    Queue(name, Exchange("celery.pidbox", type="fanout"), channel=channel).declare()
"""


def _options(folder: Path) -> dict[str, str]:
    return {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(folder / "control"),
    }


def _bind_together(folder: Path, names: list[str]) -> None:
    """Each name bound by its own process, all released at once."""
    folder.mkdir()
    argv = [sys.executable, "-c", BIND, str(folder)]
    processes = [subprocess.Popen([*argv, name, TRANSPORT], cwd=ROOT) for name in names]
    deadline = time.monotonic() + 60
    while not all((folder / f"{name}.ready").exists() for name in names):
        assert time.monotonic() < deadline, "the binding processes did not start"
        time.sleep(0.01)
    (folder / "go").touch()
    assert [process.wait(60) for process in processes] == [0] * len(names)


def test_processes_binding_at_once_keep_every_binding(tmp_path):
    names = ["gpu", "chat", "ui", "inspect"]
    for round_ in range(5):
        folder = tmp_path / str(round_)
        _bind_together(folder, names)
        with Connection(
            "filesystem://", transport=TRANSPORT, transport_options=_options(folder)
        ) as connection:
            table = connection.default_channel.get_table("celery.pidbox")
        assert sorted(entry.queue for entry in table) == sorted(names)


def test_a_broadcast_reaches_every_queue_and_an_unbind_only_its_own(tmp_path):
    broadcast = Exchange("test.broadcast", type="fanout")
    with Connection(
        "filesystem://", transport=TRANSPORT, transport_options=_options(tmp_path)
    ) as connection:
        channel = connection.default_channel
        queues = [Queue(name, broadcast, channel=channel) for name in ("a", "b", "c")]
        for queue in queues:
            queue.declare()
        queues[1].delete()
        assert sorted(entry.queue for entry in channel.get_table("test.broadcast")) == ["a", "c"]

        connection.Producer(channel).publish({"ping": 1}, exchange=broadcast)
        assert queues[0].get(no_ack=True).payload == {"ping": 1}
        assert queues[2].get(no_ack=True).payload == {"ping": 1}
        assert not list((tmp_path / "control").glob(".*.tmp"))
