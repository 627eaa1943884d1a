"""The process group of a job's ranks: joined from torchrun-style environment variables, with a
timeout on every collective, and left cleanly.

torchrun (or the worker, for one node) starts one process per device and sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; multi-node jobs rendezvous
the same way through ``torchrun --nnodes``. The backend follows the device: ``nccl`` on CUDA
(one device per rank, ``cuda:LOCAL_RANK``), ``gloo`` on CPU. A rank that dies or stops
answering makes the others' next collective raise within the timeout instead of hanging
(DESIGN.md, invariant 8): the job's ``collective_timeout_s``, else the worker's
``RLWB_RANK_TIMEOUT``, else 600 s (`collective_timeout`, `rank_timeout`).

NCCL's error handling is set explicitly (`NCCL_ENVIRONMENT`, unless the operator set it):
``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` makes a rank whose collective fails or outlives the
timeout abort its communicator and end its own process, so a rank never hangs on a dead peer;
the ranks are child processes of the worker (`launch.supervised_ranks`), which sees the exit
and fails the job naming the rank, and keeps running. ``TORCH_NCCL_BLOCKING_WAIT=0`` leaves the
watchdog thread, not the training thread, to detect the timeout.

Rank 0 serves the group's store (c10d's ``TCPStore``, which has no authentication) on
``MASTER_ADDR`` only, never on every interface: a one-machine job's is ``127.0.0.1``. A
multi-node job's ``MASTER_ADDR`` is the operator's choice of an address on a private network
that only the job's machines reach (see docs/security.md).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from core_engine.rl.config import GRPOConfig

# The longest a rank waits in one collective by default: above the slowest rank's step, also
# the share one rank computes while the others wait at the gradient reduction.
DEFAULT_TIMEOUT = timedelta(minutes=10)
NCCL_ENVIRONMENT = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_BLOCKING_WAIT": "0"}
T = TypeVar("T")
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class RankSetupError(RuntimeError):
    """The environment does not describe a rank of a process group."""


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job: its rank among `world_size`, its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def rank_timeout() -> timedelta:
    """The longest a rank waits to join the group or in one collective: ``RLWB_RANK_TIMEOUT``
    (seconds), default `DEFAULT_TIMEOUT`."""
    configured = os.environ.get("RLWB_RANK_TIMEOUT")
    return timedelta(seconds=float(configured)) if configured else DEFAULT_TIMEOUT


def rank_from_environment(environ: Mapping[str, str], device_type: str) -> RankInfo:
    """The rank the torchrun-style variables in `environ` describe (`RankSetupError` when one
    is missing or out of range)."""
    missing = [name for name in RANK_VARIABLES if not environ.get(name)]
    if missing:
        raise RankSetupError(f"a rank needs the environment variables {', '.join(missing)}")
    try:
        rank, world, local = (int(environ[n]) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
        int(environ["MASTER_PORT"])
    except ValueError as exc:
        raise RankSetupError(f"rank environment: {exc}") from None
    if world < 1 or not 0 <= rank < world or not 0 <= local <= rank:
        raise RankSetupError(f"no rank {rank} (local {local}) in a world of {world}")
    device = torch.device("cuda", local) if device_type == "cuda" else torch.device("cpu")
    return RankInfo(rank, world, local, device)


def collective_timeout(config: GRPOConfig) -> timedelta:
    """The job's collective timeout: its ``collective_timeout_s``, else `rank_timeout`."""
    if config.collective_timeout_s is not None:
        return timedelta(seconds=config.collective_timeout_s)
    return rank_timeout()


def init_ranks(
    device_type: str,
    timeout: timedelta | None = None,
    environ: Mapping[str, str] = os.environ,
) -> RankInfo:
    """Join the job's process group (``nccl`` on CUDA, ``gloo`` on CPU) as the rank `environ`
    names; joining and every collective of the group raise after `timeout` (default
    `rank_timeout`)."""
    info = rank_from_environment(environ, device_type)
    timeout = timeout or rank_timeout()
    # under torchrun its agent serves the store (torchrun's own, on its own terms)
    serve = info.rank == 0 and environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = group_store(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), info, serve, timeout)
    if device_type == "cuda":
        for name, value in NCCL_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
        torch.cuda.set_device(info.device)
    dist.init_process_group(
        "nccl" if device_type == "cuda" else "gloo",
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
        device_id=info.device if device_type == "cuda" else None,
    )
    return info


def group_store(
    host: str, port: int, info: RankInfo, serve: bool, timeout: timedelta
) -> dist.TCPStore:
    """The group's store: served (``serve``: by rank 0) on ``host`` alone (a socket bound to
    that address, handed to the store), reached there by the others; `RankSetupError` when a
    rank does not reach it, or its server is not joined by every rank, within `timeout`."""
    try:
        if not serve:
            return dist.TCPStore(host, port, info.world_size, False, timeout)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((host, port), family=family)
        return dist.TCPStore(
            host, port, info.world_size, True, timeout, master_listen_fd=listener.detach()
        )
    except dist.DistStoreError as exc:
        raise RankSetupError(
            f"rank {info.rank}: the {info.world_size} ranks did not meet at {host}:{port} "
            f"within {timeout.total_seconds():g} s (RLWB_RANK_TIMEOUT): {exc}"
        ) from None


def leave_ranks() -> None:
    """Leave the process group, if this process is in one (also after a failed collective)."""
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def rank_group(
    device_type: str,
    timeout: timedelta | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Iterator[RankInfo]:
    """`init_ranks` for the duration, then `leave_ranks`, however the block ends."""
    info = init_ranks(device_type, timeout, environ)
    try:
        yield info
    finally:
        leave_ranks()


def rank0_decides(flag: bool) -> bool:
    """Rank 0's `flag` on every rank (a stop every rank takes at the same step)."""
    return bool(from_rank0(flag))


def from_rank0(value: T) -> T:
    """Rank 0's `value` on every rank (e.g. the directory it stages a checkpoint in)."""
    sent = [value]
    dist.broadcast_object_list(sent, src=0)
    return sent[0]
