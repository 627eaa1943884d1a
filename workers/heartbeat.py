"""The running attempt's heartbeat: a thread that writes ``heartbeat_at`` (fenced) every
``interval`` seconds, whatever the job is doing, until the attempt ends or loses the job.
Recovery (`workers.recovery`) re-queues a running job whose heartbeat is older than the
timeout."""

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from db import Repository, StaleOwner

log = logging.getLogger(__name__)


@contextmanager
def heartbeat(repo: Repository, job_id: int, fence: int, interval: float) -> Iterator[None]:
    """Beat while the block runs."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            try:
                repo.heartbeat(job_id, fence)
            except StaleOwner:
                return  # the job was taken: the runner sees it at its next stop check
            except Exception as exc:  # the database is briefly unreachable: try again
                log.warning("job %s: heartbeat failed: %s", job_id, exc)

    thread = threading.Thread(target=beat, name=f"heartbeat-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
