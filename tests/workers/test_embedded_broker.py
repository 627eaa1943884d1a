"""The embedded broker's exchange tables under processes that bind at the same moment (as
``rlwb up``'s two workers do on a fresh data dir): no binding is lost, no reader sees a partial
table, and an unbind removes only its own entry. Its message files appear whole to a consumer
polling the folder."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
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

PUT = """
import sys
from pathlib import Path
from kombu import Connection
folder = Path(sys.argv[1])
options = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
with Connection("filesystem://localhost/", transport=sys.argv[2],
                transport_options=options) as connection:
    channel = connection.default_channel
    for i in range(int(sys.argv[3])):
        channel._put("big", {"i": i, "body": "x" * 4_000_000})
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


@pytest.mark.slow
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


def test_a_consumer_polling_the_folder_never_reads_a_message_half_written(tmp_path):
    """A process puts 4 MB messages; this one reads every ``*.big.msg`` file it finds, as a
    consumer would, while they are being put: each one it can open parses whole."""
    count = 12
    writer = subprocess.Popen([sys.executable, "-c", PUT, str(tmp_path), TRANSPORT, str(count)])
    whole, torn = set(), 0
    deadline = time.monotonic() + 120
    while writer.poll() is None or len(whole) < count:
        assert time.monotonic() < deadline, f"read {sorted(whole)} of {count}"
        for path in tmp_path.glob("*.big.msg"):
            try:
                whole.add(json.loads(path.read_bytes())["i"])
            except ValueError:
                torn += 1
        assert writer.poll() in (None, 0)
    assert torn == 0 and whole == set(range(count))
