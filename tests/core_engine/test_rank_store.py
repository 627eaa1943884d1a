"""Issue 45, item 6 and a Low: a job's process group serves its store (c10d's ``TCPStore``, no
authentication) on the rank address alone, loopback for a one-machine job, never on every
interface; how long ranks wait for each other is ``RLWB_RANK_TIMEOUT``, not a fixed 10 minutes.
Ranks here are this process (rank 0), on 127.0.0.1."""

from __future__ import annotations

import ipaddress
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from core_engine.rl.ranks import RankSetupError, init_ranks, leave_ranks, rank_group
from core_engine.rl.ranks.launch import free_port, rank_environment

LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp
HANG_GUARD_S = 300.0  # a guard, not a speed bound: the fixed timeout it replaces is 600 s


def listening_addresses(port: int) -> set[str]:
    """The addresses on which this machine's sockets listen on TCP ``port`` (/proc/net/tcp and
    tcp6: each local address is hex, its words in host order)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == LISTEN and int(hex_port, 16) == port:
                raw = bytes.fromhex(address)
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(str(ipaddress.ip_address(words)))
    return found


def test_a_one_machine_jobs_store_listens_on_loopback_only():
    port = free_port()
    with rank_group("cpu", timedelta(seconds=60), rank_environment(0, 1, port)):
        assert listening_addresses(port) == {"127.0.0.1"}  # was 0.0.0.0 and ::
    assert listening_addresses(port) == set()


def test_ranks_wait_for_each_other_as_long_as_rlwb_rank_timeout_says(monkeypatch):
    monkeypatch.setenv("RLWB_RANK_TIMEOUT", "2")
    port = free_port()
    outcome: list[BaseException | None] = []

    def join() -> None:
        try:
            init_ranks("cpu", environ=rank_environment(0, 2, port))  # rank 1 never comes
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert outcome, "rank 0 still waits for rank 1"
    leave_ranks()
    with pytest.raises(RankSetupError) as refused:
        raise outcome[0]
    assert str(refused.value).startswith(
        f"rank 0: the 2 ranks did not meet at 127.0.0.1:{port} within 2 s (RLWB_RANK_TIMEOUT)"
    )
