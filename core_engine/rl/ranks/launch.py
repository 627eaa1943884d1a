"""A job on N devices of one machine, its ranks started here.

`supervised_ranks(config, records, lead, args)`: every rank a child process of the caller (the
worker), which supervises them: rank 0 runs `lead(info, send, *args)` (the job's recording
side: checkpoints, database, the cancel every rank obeys at the same step), the others the same
trainer without hooks. The caller receives what rank 0 sends (progress) and returns what `lead`
returned. A rank that fails, dies or hangs ends the job with its rank named, never the caller:
a collective that waits longer than the job's collective timeout raises on the ranks waiting
in it, and on CUDA NCCL's watchdog tears a rank down (``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``,
`group.init_ranks`), a child's exit the supervisor reports.

`job_ranks(config, records)` (the command line): the caller is rank 0, ranks 1..N-1 children.
Each child watches its parent and ends with it. Several machines: run one process per device
with ``torchrun`` (the same environment variables) instead.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

from core_engine.rl.config import GRPOConfig, torch_device_type
from core_engine.rl.parent_watch import exit_with_parent
from core_engine.rl.ranks.group import RankInfo, collective_timeout, rank_group

READY_POLL_S = 0.2
DEATH_NOTICE_S = 2.0  # how long a failed collective waits to learn which rank died
EXIT_GRACE_S = 30.0  # how long a finished rank 0 waits for the others to exit


# What a supervised job's rank 0 sends its supervisor: a progress ping, its result, its error.
PROGRESS, RESULT, ERROR = "progress", "result", "error"


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
    lead: Callable[..., Any] | None = None,
    args: tuple = (),
    messages: Any = None,
) -> None:
    """A child rank: join the group, train (rank 0 of a supervised job: `lead`, whose result
    it sends last), leave; exit 0, or 1 on an error (sent too)."""
    exit_with_parent()
    try:
        from core_engine.rl.trainer.grpo import GRPOTrainer

        ready.set()
        device_type = torch_device_type(config.device)
        with rank_group(device_type, timeout, environ) as info:
            if lead is None:
                GRPOTrainer(config, records, ranks=info).train()
            else:
                messages.send(
                    (RESULT, lead(info, lambda ping: messages.send((PROGRESS, ping)), *args))
                )
    except BaseException as exc:
        print(f"rank {environ['RANK']}: {traceback.format_exc()}", file=sys.stderr, flush=True)
        if messages is not None:
            messages.send((ERROR, f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: torch's native threads may abort it (SIGABRT)


class RankProcesses:
    """Ranks 1..N-1 as child processes, or all N when rank 0 runs a `lead` (a supervised job)."""

    def __init__(
        self,
        config: GRPOConfig,
        records: Sequence[dict[str, str]],
        port: int,
        timeout: timedelta,
        lead: Callable[..., Any] | None = None,
        args: tuple = (),
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.ranks = list(range(0 if lead else 1, config.devices))
        self.ready = [context.Event() for _ in self.ranks]
        # rank 0's messages: a pipe, each message one synchronous write (a queue's feeder thread
        # would lose the last one to the child's `os._exit`)
        self.messages, sender = context.Pipe(duplex=False) if lead else (None, None)
        self.stopping = context.Event()  # set by the supervisor: rank 0 stops at the next step
        self.processes = [
            context.Process(
                target=run_rank,
                args=(
                    config,
                    list(records),
                    rank_environment(rank, config.devices, port),
                    ready,
                    timeout,
                    *((lead, (self.stopping, *args), sender) if rank == 0 else ()),
                ),
                name=f"rank-{rank}",
                daemon=True,
            )
            for rank, ready in zip(self.ranks, self.ready, strict=True)
        ]

    def start(self) -> None:
        """Start every child and wait until each is about to join (or one failed)."""
        for process in self.processes:
            process.start()
        while not all(event.is_set() for event in self.ready):
            self.raise_if_failed()
            time.sleep(READY_POLL_S)

    def failed(self, error: str | None = None) -> str | None:
        """The child that ended with an error, as "rank r ... (exit code c)": one killed by a
        signal first (the others' collectives failed after it), with rank 0's `error`, and the
        ranks still running when it failed (a rank that stopped answering is one of them)."""
        codes = {rank: p.exitcode for rank, p in zip(self.ranks, self.processes, strict=True)}
        ended = {rank: code for rank, code in codes.items() if code not in (None, 0)}
        if not ended:
            return None
        rank = min(ended, key=lambda r: (ended[r] > 0, r))  # a signal first
        code = ended[rank]
        how = f"was killed (signal {-code})" if code < 0 else f"failed (exit code {code})"
        problem = f"rank {rank} {how}"
        if rank == 0 and error:
            problem += f": {error}"
        if running := [r for r, c in codes.items() if c is None]:
            problem += f"; still running: {', '.join(f'rank {r}' for r in running)}"
        return problem

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

    def supervise(self, on_progress: Callable[[Any], None], stop: Callable[[], bool]) -> Any:
        """Rank 0's result, passing on its progress and `stop` (asked between messages);
        `RankFailedError` naming the rank as soon as one fails (after `DEATH_NOTICE_S`, for
        the others' exits to follow theirs), or when rank 0 ends without a result."""
        error = None
        while True:
            if stop():
                self.stopping.set()
            for kind, value in self.received(READY_POLL_S):
                if kind == RESULT:
                    return value
                if kind == PROGRESS:
                    on_progress(value)
                else:
                    error = value
            if any(p.exitcode not in (None, 0) for p in self.processes):
                time.sleep(DEATH_NOTICE_S)
                errors = [value for kind, value in self.received(0.0) if kind == ERROR]
                raise RankFailedError(self.failed(errors[-1] if errors else error))
            if self.processes[0].exitcode == 0:
                raise RankFailedError("rank 0 ended without a result")

    def received(self, seconds: float) -> Iterator[tuple[str, Any]]:
        """Rank 0's messages that arrive within `seconds`, then any already sent (none once
        its end of the pipe is closed)."""
        try:
            while self.messages.poll(seconds):
                yield self.messages.recv()
        except (EOFError, OSError):  # rank 0 ended
            return

    def finish(self, ok: bool) -> None:
        """Wait for the children to end (`ok`: rank 0 finished), else end them now."""
        deadline = time.monotonic() + (EXIT_GRACE_S if ok else 0.0)
        for process in (p for p in self.processes if p.pid is not None):  # started
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()


def supervised_ranks(
    config: GRPOConfig,
    records: Sequence[dict[str, str]],
    lead: Callable[..., Any],
    args: tuple,
    on_progress: Callable[[Any], None],
    stop: Callable[[], bool],
) -> Any:
    """All `config.devices` ranks of a job as children (module docstring); returns what rank 0's
    `lead(info, send, stopping, *args)` returned: `send` passes a progress ping to
    `on_progress` here, `stopping` is set once `stop()` said so. `RankFailedError` names a
    rank that failed, died or stopped answering; every child is ended before this returns."""
    ranks = RankProcesses(config, records, free_port(), collective_timeout(config), lead, args)
    ok = False
    try:
        ranks.start()
        result = ranks.supervise(on_progress, stop)
        ok = True
    finally:
        ranks.finish(ok)
    ranks.raise_if_failed()
    return result


@contextlib.contextmanager
def job_ranks(
    config: GRPOConfig, records: Sequence[dict[str, str]], timeout: timedelta | None = None
) -> Iterator[RankInfo]:
    """Rank 0 of a `config.devices`-rank job in this process, the others in children, for the
    duration (the group's store on 127.0.0.1: `rank_environment`); an error in a collective is
    reported as the failed rank's when one failed. `timeout`: the job's by default
    (`group.collective_timeout`)."""
    timeout = timeout or collective_timeout(config)
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
