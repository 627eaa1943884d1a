"""The environment sandbox's child process as the worker holds it: started in a session of
its own (so every process the environment starts is in its process group) with a scrubbed
environment and a lifeline (`env_child` kills its group when the worker's end closes), and
killed as a group.

What the isolation covers and does not: docs/environments-security.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from core_engine.rl.episodes import env_child

EXIT_WAIT_S = 1.0  # for a child whose pipe closed to exit by itself
# What the child's environment keeps of the worker's (HOME and TMPDIR: a directory of its own,
# PYTHONPATH: the worker's import path); nothing else, so no DATABASE_URL, HF_TOKEN, API key.
KEPT_VARIABLES = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "OMP_NUM_THREADS")


def child_variables(home: str) -> dict[str, str]:
    """The child's environment variables: `KEPT_VARIABLES` and ``PYTHON*`` of the worker's,
    ``HOME`` and ``TMPDIR`` the child's own directory, ``PYTHONPATH`` the worker's path."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if name in KEPT_VARIABLES or name.startswith("PYTHON")
    }
    path = os.pathsep.join(os.path.abspath(p) for p in sys.path if p)
    return {**kept, "HOME": home, "TMPDIR": home, "PYTHONPATH": path}


@dataclass
class ChildProcess:
    """A running child: its process (leading its process group), the worker's end of its
    lifeline and its home directory."""

    process: subprocess.Popen
    lifeline: int
    home: str
    status: int | None = field(default=None)

    @classmethod
    def start(cls, target: str, memory_bytes: int) -> ChildProcess:
        """`env_child` serving `target` within `memory_bytes`, in a new session (its own
        process group) with a scrubbed environment and a lifeline to this process."""
        home = tempfile.mkdtemp(prefix="rlwb-env-")
        lifeline, held = os.pipe()
        command = [sys.executable, "-m", env_child.__name__, target]
        command += [str(memory_bytes), str(lifeline)]
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=child_variables(home),
                pass_fds=(lifeline,),
                start_new_session=True,
            )
        except BaseException:
            os.close(held)
            shutil.rmtree(home, ignore_errors=True)
            raise
        finally:
            os.close(lifeline)
        return cls(process, held, home)

    def await_exit(self, timeout_s: float = EXIT_WAIT_S) -> None:
        """Wait up to `timeout_s` for the child to exit, leaving it unreaped (so its id still
        names its process group)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                return
            time.sleep(0.01)

    def kill(self) -> int:
        """Kill the whole process group, reap the child, release the rest; its exit status."""
        if self.status is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)  # the child unreaped: still its id
            self.process.kill()  # the child itself, whatever became of its group
            self.status = self.process.wait()
            self.process.stdin.close()
            self.process.stdout.close()
            os.close(self.lifeline)
            shutil.rmtree(self.home, ignore_errors=True)
        return self.status
