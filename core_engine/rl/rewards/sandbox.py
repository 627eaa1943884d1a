"""Operator-registered reward functions, scored in a child process with a time limit and a
memory limit.

The child (``python -m core_engine.rl.rewards.sandbox module:function MEMORY``) imports the
function once and answers one JSON line per batch. The time limit covers the whole call:
writing the request (a child that does not read blocks a large one on the pipe), the function
and reading the reply. A batch that runs over kills the child (the next batch starts a fresh
one) and raises `RewardError` with ``reward_timeout``, so a slow or stuck reward never blocks
the worker (cancel, shutdown, broker replies). The memory limit bounds the child's address
space (``RLIMIT_AS``, set in the child before it imports the function): an allocation past it
fails in the child alone, never in the worker. A function that lets the `MemoryError` through
fails its batch (`RewardError` naming the limit), and the child answers the next one; one that
catches it (math-verify reads a failed evaluation as no answer) just scores what it could.
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
from collections.abc import Sequence

from core_engine.rl.registry import limit_address_space

DEFAULT_MEMORY_BYTES = 1 << 30  # 1 GiB of address space: the sandbox's own ~70 MiB, then data


class RewardError(RuntimeError):
    """The reward function failed or returned unusable values (the batch is rejected)."""


class SandboxedReward:
    """A reward function ``module:function`` that runs in a child process."""

    def __init__(
        self, target: str, timeout: float, memory_bytes: int = DEFAULT_MEMORY_BYTES
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.memory_bytes = memory_bytes  # the child's address space
        self._child: subprocess.Popen | None = None

    def __repr__(self) -> str:
        return (
            f"SandboxedReward({self.target!r}, timeout={self.timeout}, "
            f"memory_bytes={self.memory_bytes})"
        )

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, self.target, str(self.memory_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        weakref.finalize(self, _kill, child)
        return child

    def close(self) -> None:
        if self._child is not None:
            _kill(self._child)
            self._child = None

    def __call__(
        self, completions: Sequence[str], references: Sequence[str], prompts: Sequence[str]
    ) -> list[float]:
        deadline = time.monotonic() + self.timeout
        if self._child is None or self._child.poll() is not None:
            self._child = self._start()
        request = {"completions": list(completions), "references": list(references)}
        request["prompts"] = list(prompts)
        try:
            line = _exchange(self._child, json.dumps(request).encode() + b"\n", deadline)
        except TimeoutError:
            self.close()
            raise RewardError(
                f"reward_timeout: reward {self.target} took longer than {self.timeout:g} s"
            ) from None
        except OSError as exc:
            self.close()
            raise RewardError(f"reward {self.target} stopped: {exc}") from None
        if not line:
            self.close()
            raise RewardError(
                f"reward {self.target} exited (import, crash or its memory limit; see worker log)"
            )
        reply = json.loads(line)
        if "error" in reply:
            raise RewardError(f"reward function raised {reply['error']}")
        return reply["scores"]


def _exchange(child: subprocess.Popen, request: bytes, deadline: float) -> bytes:
    """Write ``request`` to the child and read its one-line reply, both before ``deadline``
    (`time.monotonic`; `TimeoutError` after it): nothing here blocks on the pipes. Returns
    b"" when the child exits first."""
    to_child, from_child = child.stdin.fileno(), child.stdout.fileno()
    os.set_blocking(to_child, False)
    pending, reply = memoryview(request), bytearray()
    while not reply.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        writers = [to_child] if pending else []
        readable, writable, _ = select.select([from_child], writers, [], remaining)
        if writable:
            with contextlib.suppress(BlockingIOError):  # no room after all: wait again
                pending = pending[os.write(to_child, pending) :]
        if readable:
            chunk = os.read(from_child, 1 << 16)
            if not chunk:
                return b""
            reply += chunk
    return bytes(reply)


def _kill(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()
        child.wait()


# The child's entry: `serve` imported, not this module run as `__main__` (which imports it a
# second time through its package, with runpy's warning in every child's stderr).
_CHILD = f"import sys; from {__name__} import serve; serve(sys.argv[1], int(sys.argv[2]))"


def serve(target: str, memory_bytes: int) -> None:
    """The child: within ``memory_bytes`` of address space, answer one JSON line per request
    on the original stdout; anything the function prints goes to stderr."""
    limit_address_space(memory_bytes)
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    module_name, _, attr = target.partition(":")
    fn = getattr(importlib.import_module(module_name), attr)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            values = fn(request["completions"], request["references"], request["prompts"])
            reply = {"scores": [float(v) for v in values]}
        except MemoryError:
            reply = {"error": f"MemoryError: over its memory limit of {memory_bytes:,} bytes"}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()
