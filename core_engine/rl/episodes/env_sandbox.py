"""Registered environments in a child process (`env_child`), with time and memory limits.

The child (`env_process.ChildProcess`) runs with a scrubbed environment (no secret of the
worker's), leads its own process group and has a lifeline to the worker: closing a session, a
child failing, or the worker exiting in any way kills the whole group, whatever the
environment started. A request is a batch; the child answers one JSON line per item as soon as it is
done, tagged with the request's id and the item's episode id, and each item has
``timeout_s`` from the previous answer (or the request), the whole batch ``batch_timeout_s``.
What the child does never raises here: it becomes the item's `EnvResult.error`, and an error
ends that episode:

- an exception in ``reset``/``step`` (MemoryError included) or a result breaking the contract
  (`environments.check_step`, a reply over `env_child.MAX_REPLY_BYTES` decoded): ``env_error``
  naming it; the child goes on;
- an item over the time limit: ``env_timeout``, and the child is killed; a child that exits
  (a crash, killed by the system), or a reply that is unreadable, breaks the contract or
  answers another request or episode (a stray line, a forked copy answering too):
  ``env_error``. Either way every other episode the child held is lost: its next call answers
  ``env_error: the environment process was restarted after episode N timed out`` (or crashed,
  or sent an unreadable reply), and the next reset starts a fresh child.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from core_engine.rl.episodes import env_child
from core_engine.rl.episodes.env_process import ChildProcess
from core_engine.rl.episodes.environments import check_reset, check_step, environment_target

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_BATCH_TIMEOUT_S = 120.0
DEFAULT_MEMORY_BYTES = 1 << 30
START_TIMEOUT_S = 60.0  # the child's start: the operator's import and the tools
MAX_LINE_BYTES = 6 * env_child.MAX_REPLY_BYTES + 1024  # a reply's line, escaped (\u001f: 6x)
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
    `timeout_s` per item (default ``RLWB_ENV_TIMEOUT`` or 10 s), `batch_timeout_s` per call
    (default ``RLWB_ENV_BATCH_TIMEOUT`` or 120 s), `memory_bytes` of address space for the
    child (default ``RLWB_ENV_MEMORY`` or 1 GiB). ValueError for a name the operator did not
    register; RuntimeError if the environment does not start."""

    def __init__(
        self,
        name: str,
        *,
        timeout_s: float | None = None,
        batch_timeout_s: float | None = None,
        memory_bytes: int | None = None,
    ) -> None:
        self.name = name
        self.target = environment_target(name)
        if timeout_s is None:
            timeout_s = float(os.environ.get("RLWB_ENV_TIMEOUT", DEFAULT_TIMEOUT_S))
        if batch_timeout_s is None:
            batch_timeout_s = float(
                os.environ.get("RLWB_ENV_BATCH_TIMEOUT", DEFAULT_BATCH_TIMEOUT_S)
            )
        if memory_bytes is None:
            memory_bytes = int(os.environ.get("RLWB_ENV_MEMORY", DEFAULT_MEMORY_BYTES))
        self.timeout_s, self.batch_timeout_s = timeout_s, batch_timeout_s
        self.memory_bytes = memory_bytes
        self._child: ChildProcess | None = None
        self._buffer = bytearray()
        self._requests = itertools.count()
        self._live: set[int] = set()  # episodes whose environment the child holds
        self._lost: dict[int, str] = {}  # episodes a failed child took with it -> why
        self._closing: list[int] = []  # told to the child with the next request
        self.tools: list[dict] = self._start()

    def __enter__(self) -> EnvironmentSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def process_group(self) -> int | None:
        """The child's process group (every process the environment started), if running."""
        return None if self._child is None else self._child.process.pid

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
        """Drop these episodes' environments (None: all of them, and kill the child's
        process group)."""
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
        child = ChildProcess.start(self.target, self.memory_bytes)
        weakref.finalize(self, child.kill)
        os.set_blocking(child.process.stdin.fileno(), False)
        self._child, self._buffer = child, bytearray()
        try:
            hello = json.loads(self._read_line(time.monotonic() + START_TIMEOUT_S))
        except TimeoutError:
            why = f"it took longer than {START_TIMEOUT_S:g} s"
        except (OSError, EOFError, ValueError):
            why = "the process exited (see the worker log)"
        else:
            if isinstance(hello, dict) and isinstance(hello.get("tools"), list):
                return hello["tools"]
            why = hello.get("error") if isinstance(hello, dict) else None
            why = str(why or "its first reply was not its tools")
        self._stop()
        raise RuntimeError(f"environment {self.name!r} ({self.target}) did not start: {why}")

    def _stop(self) -> int | None:
        """Kill the child's process group (if any); the child's exit status."""
        child, self._child = self._child, None
        self._closing.clear()
        return None if child is None else child.kill()

    def _call(self, op: str, items: list[tuple[int, Any]]) -> list[EnvResult]:
        """Send a batch and read one answer per item, each within the time limits; a child
        that fails is stopped and takes its episodes with it."""
        request_id = next(self._requests)
        request = {"id": request_id, "op": op, "items": items, "close": self._closing}
        self._closing = []
        results: list[EnvResult] = []
        current = items[0][0]
        batch_end = time.monotonic() + self.batch_timeout_s
        deadline = min(time.monotonic() + self.timeout_s, batch_end)
        try:
            self._write(json.dumps(request).encode() + b"\n", deadline)
            for current, _ in items:
                reply = _reply(self._read_line(deadline), request_id, current)
                results.append(self._answer(op, current, reply))
                deadline = min(time.monotonic() + self.timeout_s, batch_end)
            return results
        except TimeoutError:
            what = "timed out"
            error = f"env_timeout: episode {current}'s {op} took longer than {self.timeout_s:g} s"
            if time.monotonic() >= batch_end:
                error = (
                    f"env_timeout: the batch's {op} took longer than {self.batch_timeout_s:g} s "
                    f"(RLWB_ENV_BATCH_TIMEOUT), at episode {current}"
                )
        except (OSError, EOFError):
            self._child.await_exit()  # exiting: its own status, unless it lingers
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

    def _answer(self, op: str, episode_id: int, reply: dict) -> EnvResult:
        """The item's result from its (checked) reply; ValueError for one breaking the
        contract (only a write past the child's checks can)."""
        if "error" in reply:
            self._live.discard(episode_id)
            return _failed(f"env_error: {str(reply['error'])[: env_child.MAX_ERROR_CHARS]}")
        if op == "reset":
            result = EnvResult(check_reset(reply.get("messages")))
            self._live.add(episode_id)
            self._lost.pop(episode_id, None)
            return result
        checked = check_step({k: v for k, v in reply.items() if k not in ("id", "episode")})
        return EnvResult(checked["messages"], checked["reward"], checked["done"])

    def _write(self, data: bytes, deadline: float) -> None:
        to_child = self._child.process.stdin.fileno()
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
        from_child = self._child.process.stdout.fileno()
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


def _reply(line: bytes, request_id: int, episode_id: int) -> dict:
    """A reply line as a dict answering this request's item; ValueError naming what is
    wrong (not JSON, not an object, a reply to another request or episode)."""
    try:
        reply = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(reply, dict):
        raise ValueError(f"a JSON {type(reply).__name__}, not an object")
    if reply.get("id") != request_id or reply.get("episode") != episode_id:
        raise ValueError(
            f"it answers request {reply.get('id')!r} episode {reply.get('episode')!r}, not "
            f"request {request_id} episode {episode_id} (a stray write, or a forked process)"
        )
    return reply


def _exit_status(returncode: int) -> str:
    return f"signal {-returncode}" if returncode < 0 else f"code {returncode}"
