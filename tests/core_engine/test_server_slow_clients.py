"""Streaming clients that stop reading (issue 32, item 5): each stream write has a deadline,
so a stalled stream is cancelled and its share of the sequence budget serves others."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import httpx

from core_engine.engine import load_engine
from core_engine.network import create_app
from core_engine.network.limits import ServerLimits
from core_engine.scheduler import EngineConfig
from core_engine.toy import save_tiny_checkpoint

from .http_server import running_server

MODEL = "tiny"
CONTEXT = 1024
STALLED = 4  # the clients of the report: together they hold the whole budget
LIMITS = ServerLimits(
    max_sequences_in_flight=STALLED,
    stream_write_timeout_s=0.5,  # what a stalled stream is granted before it is cancelled
)
HANG_GUARD_S = 120  # waits for a state of the server (quiet: seconds); only a hang fails
SOCKET_BUFFER = 4096  # the kernel's buffers of each connection, both ends: a few chunks


def stalled_stream(host: str, port: int) -> socket.socket:
    """A client that sends a long streaming request and then reads nothing."""
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": "ab",
            "max_tokens": CONTEXT - 16,  # some 350 kB of chunks: more than every buffer
            "stream": True,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 1,
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)  # before connect
    sock.settimeout(HANG_GUARD_S)
    sock.connect((host, port))
    sock.sendall(head + body)
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    received = bytearray()
    while chunk := sock.recv(1 << 16):
        received += chunk
    return bytes(received)


def test_streams_that_stop_reading_are_cancelled_and_free_the_budget(tmp_path):
    path = save_tiny_checkpoint(tmp_path / "tiny", max_position_embeddings=CONTEXT)
    engine = load_engine(path, EngineConfig(max_batch_size=8))
    app = create_app(engine, MODEL, limits=LIMITS)
    with running_server(app, send_buffer=SOCKET_BUFFER) as url:
        address = urlsplit(url)
        clients = [stalled_stream(address.hostname, address.port) for _ in range(STALLED)]
        try:
            budget = app.state.sequence_budget
            deadline = time.monotonic() + HANG_GUARD_S
            while budget.in_flight < STALLED:  # every stalled stream holds its share
                assert time.monotonic() < deadline, "the stalled streams were never admitted"
                time.sleep(0.01)

            # Waits in the admission queue (up to queue_timeout_s, 60 s) for room.
            answer = httpx.post(
                f"{url}/v1/completions",
                json={"model": MODEL, "prompt": "ab", "max_tokens": 2},
                timeout=HANG_GUARD_S,
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 2
            # Read nothing before every stalled stream is cancelled: a stream whose buffers a
            # loaded machine has not filled yet would otherwise be read to its end.
            deadline = time.monotonic() + HANG_GUARD_S
            while budget.in_flight > 0:
                assert time.monotonic() < deadline, "a stalled stream was never cancelled"
                time.sleep(0.01)

            for client in clients:  # each stream was cut short: sent as far as it got, no end
                stream = read_to_end(client)
                assert stream.startswith(b"HTTP/1.1 200") and b"data: {" in stream
                assert b"data: [DONE]" not in stream
        finally:
            for client in clients:
                client.close()
