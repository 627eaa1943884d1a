"""The environment sandbox's child process (started by `env_sandbox.EnvironmentSession`):
``python -m core_engine.rl.episodes.env_child module:factory memory_bytes lifeline_fd``.

It leads its own process group (every process the environment starts is in it), limits its
address space, imports the factory, reports the tools, then keeps one environment per episode
id. A request ``{"id", "op", "items", "close"}`` is answered item by item, each reply one JSON
line ``{"id": request id, "episode": episode id, ...}`` on the original stdout (what the
environment prints goes to stderr). When the worker holding the other end of `lifeline_fd`
exits, however it ends, or closes the request pipe, the whole process group is killed.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
from typing import Any, BinaryIO

from core_engine.rl.episodes.environments import check_reset, check_step, check_tools
from core_engine.rl.registry import limit_address_space

MAX_REPLY_BYTES = 1 << 20  # one reply, decoded (`decoded_bytes`)
MAX_ERROR_CHARS = 1000


def decoded_bytes(value: Any) -> int:
    """The size of a JSON value as decoded: its strings' UTF-8 bytes, plus one per value and
    per key (so a reply's line is at most 6 bytes per decoded byte: ``\\u001f``)."""
    if isinstance(value, str):
        return 1 + len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, dict):
        return 1 + sum(decoded_bytes(k) + decoded_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return 1 + sum(map(decoded_bytes, value))
    return len(json.dumps(value))


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    return text.encode("utf-8", "backslashreplace").decode("utf-8")  # no lone surrogate


def _send(protocol: BinaryIO, reply: dict) -> None:
    """Write a reply as one JSON line; ValueError (nothing written) over `MAX_REPLY_BYTES`."""
    size = decoded_bytes(reply)
    if size > MAX_REPLY_BYTES:
        raise ValueError(f"the reply is {size} bytes, more than the {MAX_REPLY_BYTES} allowed")
    protocol.write(json.dumps(reply, ensure_ascii=False).encode("utf-8") + b"\n")
    protocol.flush()


def _watch(lifeline: int) -> None:
    """Kill the process group once the worker's end of `lifeline` is closed (it exited)."""
    while os.read(lifeline, 1):
        pass
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _answer(request: dict, instances: dict[int, Any], factory: Any, protocol: BinaryIO) -> None:
    for episode_id in request["close"]:
        instances.pop(episode_id, None)
    for episode_id, payload in request["items"]:
        tag = {"id": request["id"], "episode": episode_id}
        try:
            if request["op"] == "reset":
                instances.pop(episode_id, None)
                instance = factory()
                reply = {"messages": check_reset(instance.reset(payload)), "reward": None}
                reply["done"] = False
                instances[episode_id] = instance
            else:
                reply = check_step(instances[episode_id].step(payload))
            _send(protocol, {**tag, **reply})
        except Exception as exc:
            instances.pop(episode_id, None)
            _send(protocol, {**tag, "error": _describe(exc)})


def serve(target: str, memory_bytes: int, lifeline: int) -> None:
    """The child's main loop (module docstring)."""
    threading.Thread(target=_watch, args=(lifeline,), daemon=True).start()
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    limit_address_space(memory_bytes)
    try:
        module_name, _, attr = target.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        _send(protocol, {"tools": check_tools(factory().tools)})
    except Exception as exc:
        _send(protocol, {"error": _describe(exc)})
        return
    instances: dict[int, Any] = {}
    for request in map(json.loads, sys.stdin):
        _answer(request, instances, factory, protocol)


if __name__ == "__main__":
    try:
        serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    finally:  # the worker closed the pipe, or is gone: nothing the environment started stays
        os.killpg(os.getpgrp(), signal.SIGKILL)
