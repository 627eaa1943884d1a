"""A child process that must not outlive the worker that started it (a rank, the chat-template
renderer): a daemon thread ends it once its parent is gone (it is then re-parented)."""

from __future__ import annotations

import os
import threading
import time

PARENT_POLL_S = 0.5  # how often the child looks at its parent


def exit_with_parent() -> None:
    """From now on, end this process (exit code 1) within `PARENT_POLL_S` of its parent's
    death."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
