"""Registered environments in a child process, with a time and a memory limit.

The child (``python -m core_engine.rl.episodes.env_sandbox module:factory memory_bytes``)
limits its address space (``RLIMIT_AS``), imports the factory, reports the tools and then
keeps one environment per episode id. A request is a batch; the child answers one JSON line
per item as soon as it is done, and each item has ``timeout_s`` from the previous answer (or
the request). What the child does never raises here: it becomes the item's `EnvResult.error`,
and an error ends that episode:

- an exception in ``reset``/``step`` (MemoryError included) or a result breaking the contract
  (`environments.check_step`, a reply over `MAX_LINE_BYTES`): ``env_error`` naming it; the
  child goes on;
- an item over the time limit: ``env_timeout``, and the child is killed; a child that exits
  (a crash, killed by the system): ``env_error``. Either way every other episode the child
  held is lost: its next call answers ``env_error: the environment process was restarted
  after episode N timed out`` (or crashed), and the next reset starts a fresh child.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from core_engine.rl.episodes.environments import (
    check_reset,
    check_step,
    check_tools,
    environment_target,
)
from core_engine.rl.registry import limit_address_space

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_BYTES = 1 << 30
START_TIMEOUT_S = 60.0  # the child's start: the operator's import and the tools
MAX_LINE_BYTES = 1 << 20  # one reply
MAX_ERROR_CHARS = 1000
NO_ENVIRONMENT = "has no environment (not reset, closed, or ended by an error)"


@dataclass(frozen=True)
class EnvResult:
    """One episode's answer to a reset (its opening messages) or a step (the observations)."""

    messages: list[dict[str, str]] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    error: str | None = None  # "env_error: ..." or "env_timeout: ..."

    @property
    def code(self) -> str | None:
        return None if self.error is None else self.error.partition(":")[0]


def _failed(error: str) -> EnvResult:
    return EnvResult(done=True, error=error)


class EnvironmentSession:
    """One child process hosting the environments of many episodes (a context manager).
    `timeout_s` per item (default ``RLWB_ENV_TIMEOUT`` or 10 s), `memory_bytes` of address
    space for the child (default ``RLWB_ENV_MEMORY`` or 1 GiB). ValueError for a name the
    operator did not register; RuntimeError if the environment does not start."""

    def __init__(
        self, name: str, *, timeout_s: float | None = None, memory_bytes: int | None = None
    ) -> None:
        self.name = name
        self.target = environment_target(name)
        if timeout_s is None:
            timeout_s = float(os.environ.get("RLWB_ENV_TIMEOUT", DEFAULT_TIMEOUT_S))
        if memory_bytes is None:
            memory_bytes = int(os.environ.get("RLWB_ENV_MEMORY", DEFAULT_MEMORY_BYTES))
        self.timeout_s, self.memory_bytes = timeout_s, memory_bytes
        self._child: subprocess.Popen | None = None
        self._buffer = bytearray()
        self._live: set[int] = set()  # episodes whose environment the child holds
        self._lost: dict[int, str] = {}  # episodes a failed child took with it -> why
        self._closing: list[int] = []  # told to the child with the next request
        self.tools: list[dict] = self._start()

    def __enter__(self) -> EnvironmentSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self, episode_ids: list[int], tasks: list[dict[str, str]]) -> list[EnvResult]:
        """Start (or restart) each episode's environment on its task: the opening messages."""
        items = list(zip(episode_ids, tasks, strict=True))
        if not items:
            return []
        if self._child is None:
            try:
                self._start()
            except RuntimeError as exc:
                return [_failed(f"env_error: {exc}") for _ in items]
        return self._call("reset", items)

    def step(self, episode_ids: list[int], turns: list[dict]) -> list[EnvResult]:
        """Each episode's environment answers its assistant turn."""
        results: list[EnvResult | None] = []
        items = []
        for episode_id, turn in zip(episode_ids, turns, strict=True):
            if episode_id in self._live:
                results.append(None)
                items.append((episode_id, turn))
            else:
                why = self._lost.get(
                    episode_id, f"env_error: episode {episode_id} {NO_ENVIRONMENT}"
                )
                results.append(_failed(why))
        answers = iter(self._call("step", items) if items else [])
        return [result or next(answers) for result in results]

    def close(self, episode_ids: list[int] | None = None) -> None:
        """Drop these episodes' environments (None: all of them, and stop the child)."""
        if episode_ids is None:
            self._stop()
            self._live.clear()
            self._lost.clear()
            return
        for episode_id in episode_ids:
            self._lost.pop(episode_id, None)
            if episode_id in self._live:
                self._live.discard(episode_id)
                self._closing.append(episode_id)

    def _start(self) -> list[dict]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        command = [sys.executable, "-m", __name__, self.target, str(self.memory_bytes)]
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        weakref.finalize(self, _kill, child)
        os.set_blocking(child.stdin.fileno(), False)
        self._child, self._buffer = child, bytearray()
        try:
            hello = json.loads(self._read_line(time.monotonic() + START_TIMEOUT_S))
        except TimeoutError:
            why = f"it took longer than {START_TIMEOUT_S:g} s"
        except (OSError, EOFError, ValueError):
            why = "the process exited (see the worker log)"
        else:
            if "tools" in hello:
                return hello["tools"]
            why = hello["error"]
        self._stop()
        raise RuntimeError(f"environment {self.name!r} ({self.target}) did not start: {why}")

    def _stop(self) -> int | None:
        """Kill the child (if any); its exit status."""
        child, self._child = self._child, None
        self._closing.clear()
        return None if child is None else _kill(child)

    def _call(self, op: str, items: list[tuple[int, Any]]) -> list[EnvResult]:
        """Send a batch and read one answer per item, each within the time limit; a child
        that fails is stopped and takes its episodes with it."""
        request = {"op": op, "items": items, "close": self._closing}
        self._closing = []
        results: list[EnvResult] = []
        current = items[0][0]
        deadline = time.monotonic() + self.timeout_s
        try:
            self._write(json.dumps(request).encode() + b"\n", deadline)
            for current, _ in items:
                results.append(self._answer(op, current, self._read_line(deadline)))
                deadline = time.monotonic() + self.timeout_s
            return results
        except TimeoutError:
            what = "timed out"
            error = f"env_timeout: episode {current}'s {op} took longer than {self.timeout_s:g} s"
        except (OSError, EOFError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._child.wait(timeout=1)  # exiting: its own status, unless it lingers
            what, status = "crashed", _exit_status(self._stop())
            error = (
                f"env_error: the environment process exited ({status}) "
                f"during episode {current}'s {op} (a crash, or killed by the system for "
                "memory; see the worker log)"
            )
        except ValueError as exc:
            what = "sent an unreadable reply"
            error = f"env_error: episode {current}'s {op} reply was unreadable: {exc}"
        self._stop()
        lost = f"env_error: the environment process was restarted after episode {current} {what}"
        unanswered = [episode_id for episode_id, _ in items[len(results) :]]
        self._lost.update(dict.fromkeys([*self._live, *unanswered], lost))
        self._live.clear()
        return [*results, _failed(error), *(_failed(lost) for _ in unanswered[1:])]

    def _answer(self, op: str, episode_id: int, line: bytes) -> EnvResult:
        reply = json.loads(line)
        if "error" in reply:
            self._live.discard(episode_id)
            return _failed(f"env_error: {reply['error']}")
        if op == "reset":
            self._live.add(episode_id)
            self._lost.pop(episode_id, None)
        return EnvResult(reply["messages"], reply["reward"], reply["done"])

    def _write(self, data: bytes, deadline: float) -> None:
        to_child = self._child.stdin.fileno()
        pending = memoryview(data)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if select.select([], [to_child], [], remaining)[1]:
                with contextlib.suppress(BlockingIOError):  # no room after all: wait again
                    pending = pending[os.write(to_child, pending) :]

    def _read_line(self, deadline: float) -> bytes:
        """The child's next line (TimeoutError after `deadline`, EOFError if it exited,
        ValueError over `MAX_LINE_BYTES`)."""
        from_child = self._child.stdout.fileno()
        while (end := self._buffer.find(b"\n", 0, MAX_LINE_BYTES)) < 0:
            if len(self._buffer) >= MAX_LINE_BYTES:
                raise ValueError(f"longer than {MAX_LINE_BYTES} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([from_child], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(from_child, 1 << 16)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line


def _exit_status(returncode: int) -> str:
    return f"signal {-returncode}" if returncode < 0 else f"code {returncode}"


def _kill(child: subprocess.Popen) -> int:
    if child.poll() is None:
        child.kill()
    child.wait()
    child.stdin.close()
    child.stdout.close()
    return child.returncode


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def _send(protocol: BinaryIO, reply: dict) -> None:
    """Write a reply as one JSON line; ValueError (nothing written) over `MAX_LINE_BYTES`."""
    line = json.dumps(reply).encode() + b"\n"
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"the reply is {len(line)} bytes, more than the {MAX_LINE_BYTES} allowed")
    protocol.write(line)
    protocol.flush()


def _serve(target: str, memory_bytes: int) -> None:
    """The child: one JSON line per item on the original stdout; what the environment prints
    goes to stderr."""
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
        for episode_id in request["close"]:
            instances.pop(episode_id, None)
        for episode_id, payload in request["items"]:
            try:
                if request["op"] == "reset":
                    instances.pop(episode_id, None)
                    instance = factory()
                    reply = {
                        "messages": check_reset(instance.reset(payload)),
                        "reward": None,
                        "done": False,
                    }
                    instances[episode_id] = instance
                else:
                    reply = check_step(instances[episode_id].step(payload))
                _send(protocol, reply)
            except Exception as exc:
                instances.pop(episode_id, None)
                _send(protocol, {"error": _describe(exc)})


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
