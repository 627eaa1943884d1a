"""A job on N devices of one machine: the caller is rank 0, ranks 1..N-1 are child processes.

`job_ranks(config, records)` starts the children (spawned: each loads its own torch and
model), waits until each is about to join, joins the process group itself and yields rank 0's
`RankInfo`; the caller runs its `GRPOTrainer` with it (and its hooks: rank 0 alone records,
checkpoints and reads the cancel, which every rank obeys at the same step). The children run
the same trainer without hooks. A child that fails or dies fails the job with its rank named; a
rank 0 that dies takes its children with it (each watches its parent). Several machines: run
one process per device with ``torchrun`` (the same environment variables) instead.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

from core_engine.rl.config import GRPOConfig, torch_device_type
from core_engine.rl.ranks.group import RankInfo, rank_group, rank_timeout

READY_POLL_S = 0.2
PARENT_POLL_S = 0.5
DEATH_NOTICE_S = 2.0  # how long a failed collective waits to learn which rank died
EXIT_GRACE_S = 30.0  # how long a finished rank 0 waits for the others to exit


class RankFailedError(RuntimeError):
    """A rank of the job failed or died."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_environment(rank: int, world: int, port: int) -> dict[str, str]:
    """The torchrun variables of `rank` of a `world`-rank job on this machine."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def run_rank(
    config: GRPOConfig,
    records: list[dict[str, str]],
    environ: dict[str, str],
    ready: Any,
    timeout: timedelta,
) -> None:
    """A child rank: join the group, train without hooks, leave; exit 0, or 1 on an error."""
    parent = os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch_parent, daemon=True).start()
    try:
        from core_engine.rl.trainer.grpo import GRPOTrainer

        ready.set()
        device_type = torch_device_type(config.device)
        with rank_group(device_type, timeout, environ) as info:
            GRPOTrainer(config, records, ranks=info).train()
    except BaseException:
        print(f"rank {environ['RANK']}: {traceback.format_exc()}", file=sys.stderr, flush=True)
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: torch's native threads may abort it (SIGABRT)


class RankProcesses:
    """Ranks 1..N-1 as child processes."""

    def __init__(
        self,
        config: GRPOConfig,
        records: Sequence[dict[str, str]],
        port: int,
        timeout: timedelta,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.ready = [context.Event() for _ in range(config.devices - 1)]
        self.processes = [
            context.Process(
                target=run_rank,
                args=(config, list(records), rank_environment(r, config.devices, port), e, timeout),
                name=f"rank-{r}",
                daemon=True,
            )
            for r, e in zip(range(1, config.devices), self.ready, strict=True)
        ]

    def start(self) -> None:
        """Start every child and wait until each is about to join (or one failed)."""
        for process in self.processes:
            process.start()
        while not all(event.is_set() for event in self.ready):
            self.raise_if_failed()
            time.sleep(READY_POLL_S)

    def failed(self) -> str | None:
        """The first child that ended with an error, as "rank r ... (exit code c)"."""
        for rank, process in enumerate(self.processes, start=1):
            code = process.exitcode
            if code is not None and code != 0:
                how = f"was killed (signal {-code})" if code < 0 else f"failed (exit code {code})"
                return f"rank {rank} {how}"
        return None

    def raise_if_failed(self) -> None:
        if (problem := self.failed()) is not None:
            raise RankFailedError(problem)

    def wait_for_an_exit(self, seconds: float) -> None:
        """Until a child has exited or `seconds` passed (a peer's failure reaches rank 0's
        collective before its exit code is known)."""
        ended = multiprocessing.connection.wait([p.sentinel for p in self.processes], seconds)
        for process in self.processes:
            if process.sentinel in ended:  # exiting: its exit code follows its closed pipes
                process.join(seconds)

    def finish(self, ok: bool) -> None:
        """Wait for the children to end (`ok`: rank 0 finished), else end them now."""
        deadline = time.monotonic() + (EXIT_GRACE_S if ok else 0.0)
        for process in (p for p in self.processes if p.pid is not None):  # started
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()


@contextlib.contextmanager
def job_ranks(
    config: GRPOConfig, records: Sequence[dict[str, str]], timeout: timedelta | None = None
) -> Iterator[RankInfo]:
    """Rank 0 of a `config.devices`-rank job in this process, the others in children, for the
    duration (the group's store on 127.0.0.1: `rank_environment`); an error in a collective is
    reported as the failed rank's when one failed. `timeout`: `rank_timeout` by default."""
    timeout = timeout or rank_timeout()
    port = free_port()
    children = RankProcesses(config, records, port, timeout)
    ok = False
    try:
        children.start()
        environ = rank_environment(0, config.devices, port)
        with rank_group(torch_device_type(config.device), timeout, environ) as info:
            try:
                yield info
            except Exception as exc:
                children.wait_for_an_exit(DEATH_NOTICE_S)
                if (problem := children.failed()) is not None:
                    raise RankFailedError(problem) from exc
                raise
        ok = True
    finally:
        children.finish(ok)
    children.raise_if_failed()
