"""``rlwb up``'s workers as child processes kept running: one that exits while ``up`` runs is
started again (its job, if it held one, is recovered by the worker's own recovery), after a
delay that doubles, up to `MAX_RESTART_DELAY_S`, while it keeps dying within `STEADY_S` of
its start; each restart is said on stderr with how the worker ended."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

WATCH_POLL_S = 0.5
RESTART_DELAY_S = 1.0
MAX_RESTART_DELAY_S = 60.0
STEADY_S = 60.0  # a worker that ran this long before it ended restarts after the first delay
STOP_TIMEOUT_S = 90


class Supervised:
    """The children ``commands`` names (role -> argv), started now and watched by a thread
    until `stop`."""

    def __init__(self, commands: Mapping[str, Sequence[str]]) -> None:
        self._commands = {role: list(argv) for role, argv in commands.items()}
        self._lock = threading.Lock()  # a child is never started once `stop` has begun
        self._stopping = threading.Event()
        self.children = {role: subprocess.Popen(argv) for role, argv in self._commands.items()}
        self._started = dict.fromkeys(self.children, time.monotonic())
        self._delays = dict.fromkeys(self.children, RESTART_DELAY_S)
        self._watcher = threading.Thread(target=self._watch, name="supervise", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stopping.wait(WATCH_POLL_S):
            for role, child in list(self.children.items()):
                if child.poll() is not None:
                    self._restart(role, child)

    def _restart(self, role: str, child: subprocess.Popen) -> None:
        code = child.returncode
        how = f"was killed (signal {-code})" if code < 0 else f"exited (code {code})"
        ran = time.monotonic() - self._started[role]
        delay = RESTART_DELAY_S if ran >= STEADY_S else self._delays[role]
        self._delays[role] = min(2 * delay, MAX_RESTART_DELAY_S)
        print(
            f"rlwb up: the {role} worker (pid {child.pid}) {how}: starting it again in {delay:g} s",
            file=sys.stderr,
            flush=True,
        )
        if self._stopping.wait(delay):
            return
        with self._lock:
            if not self._stopping.is_set():
                self.children[role] = subprocess.Popen(self._commands[role])
                self._started[role] = time.monotonic()

    def stop(self) -> None:
        """No more restarts; each child is stopped warmly (SIGTERM: its job goes back to the
        queue), killed after `STOP_TIMEOUT_S`."""
        with self._lock:
            self._stopping.set()
        self._watcher.join()
        for child in reversed(self.children.values()):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
