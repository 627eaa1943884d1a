"""The embedded broker's files (issue 32, item 6): a file in its queue that is no message is
set aside (it stopped the worker at its start), and message names sort in the order the
messages were put, also when the clock's count gains a digit (kombu's milliseconds did after
27.8 hours, and newer messages went first)."""

from types import SimpleNamespace

import pytest
from kombu import Connection

from db import JobStatus
from tests.workers.helpers import train_config, wait_for
from workers import embedded_broker

# Named to sort before any message, so a worker meets them first.
GARBAGE = {
    "0-not-json.gpu.msg": b"\x00\xffnot a message",
    "0-no-properties.gpu.msg": b'{"body": "e30=", "headers": {}}',
    "0-a-list.gpu.msg": b"[1, 2, 3]",
}


@pytest.mark.slow
def test_a_queue_file_that_is_no_message_is_set_aside_and_the_worker_runs_on(
    embedded_stack, tiny_model
):
    stack = embedded_stack
    [job] = stack.submit(train_config(tiny_model, steps=1))
    queue = stack.root / "data" / "broker" / "queue"
    for name, data in GARBAGE.items():
        (queue / name).write_bytes(data)

    with stack.worker("gpu0"):
        wait_for(lambda: stack.status(job).is_terminal, 120, "the queued job to end")

    assert stack.status(job) is JobStatus.SUCCEEDED, stack.log("gpu0")
    bad = stack.root / "data" / "broker" / "bad"
    assert {path.name: path.read_bytes() for path in bad.iterdir()} == GARBAGE
    assert list(queue.glob("*.gpu.msg")) == []
    for name in GARBAGE:
        assert f"{name} in the embedded broker's queue is not a message" in stack.log("gpu0")


def test_messages_are_taken_in_the_order_put_when_the_clock_gains_a_digit(tmp_path, monkeypatch):
    stamps = iter([99_999_999_999_999_999, 100_000_000_000_000_000])  # one more digit
    monkeypatch.setattr(embedded_broker, "time", SimpleNamespace(time_ns=lambda: next(stamps)))
    options = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path)}
    with Connection(
        "filesystem://", transport="workers.embedded_broker:Transport", transport_options=options
    ) as connection:
        channel = connection.default_channel
        for order in ("first", "second"):
            channel._put("gpu", {"properties": {"delivery_tag": order}})
        taken = [channel._get("gpu")["properties"]["delivery_tag"] for _ in range(2)]
    assert taken == ["first", "second"]
