"""Issue 45: an environment's child process as the worker holds it. Every process an
environment starts dies with its session, its child or the worker; each reply answers its own
request and episode (a forked copy's or a hand-written line is that episode's error, never
another's answer); a reply's size is counted decoded; a batch has one deadline; the child sees
none of the worker's secrets."""

import os
import re
import subprocess
import sys
import time

import pytest

from core_engine.rl.episodes.env_sandbox import EnvironmentSession

from .envs_for_tests import SCRIPTED
from .test_environments import pids, turn

POLL_S, PATIENCE_S = 0.05, 30.0  # a bounded wait for a state, never a timing assertion


def running(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def all_gone(pids_: list[int]) -> bool:
    """Wait (bounded) until none of `pids_` runs; whether that state was reached."""
    end = time.monotonic() + PATIENCE_S
    while any(map(running, pids_)) and time.monotonic() < end:
        time.sleep(POLL_S)
    return not any(map(running, pids_))


def spawned(session: EnvironmentSession, episode: int) -> int:
    (reply,) = session.step([episode], [turn("spawn")])
    return int(reply.messages[0]["content"])


def test_closing_a_session_kills_what_its_environment_started(scripted):
    session = scripted()
    (child,) = pids(session.reset([0], [{"input": "a"}]))
    grandchild = spawned(session, 0)
    assert running(grandchild) and os.getpgid(grandchild) == session.process_group == child
    session.close()
    assert all_gone([child, grandchild])


def test_a_timed_out_child_takes_its_grandchildren_with_it(scripted):
    session = scripted(timeout_s=5)
    (child,) = pids(session.reset([0], [{"input": "a"}]))
    grandchild = spawned(session, 0)
    (hung,) = session.step([0], [turn("hang")])
    assert hung.code == "env_timeout"
    assert all_gone([child, grandchild])


WORKER = """
import sys
from core_engine.rl.episodes.env_sandbox import EnvironmentSession
session = EnvironmentSession("scripted", timeout_s=600)
session.reset([0], [{"input": "a"}])
action = "spawn_and_hang:" + sys.argv[1]
session.step([0], [{"content": action, "tool_calls": [], "text": action}])  # until killed
"""


def test_a_killed_worker_takes_its_environments_processes_with_it(monkeypatch, tmp_path):
    """The worker is killed while its environment is busy in a step (so only the lifeline,
    not the end of its requests, can tell the child)."""
    monkeypatch.setenv("RLWB_ENVIRONMENTS", SCRIPTED)
    written = tmp_path / "pids"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(written)])
    try:
        end = time.monotonic() + PATIENCE_S
        while not (written.exists() and written.read_text()) and time.monotonic() < end:
            time.sleep(POLL_S)
        child, grandchild = map(int, written.read_text().split())
        assert running(child) and running(grandchild)
        worker.kill()
        worker.wait()
        assert all_gone([child, grandchild])
    finally:
        worker.kill()
        worker.wait()


def test_a_forked_copys_reply_is_an_error_never_another_episodes_answer(scripted):
    session = scripted()
    child, _ = pids(session.reset([0, 1], [{"input": "a"}, {"input": "b"}]))
    (forked,) = session.step([0], [turn("fork")])  # the copy answers first, the original later
    copy = int(forked.messages[0]["content"].split()[-1])
    assert forked.error is None and copy != child
    for _ in range(5):  # the original's late answer is the next line read, once written
        (reply,) = session.step([1], [turn("sleep")])
        if reply.error is not None:
            break
        assert reply.messages[0]["content"].startswith("sleep ")  # episode 1's own answer
    assert reply.code == "env_error"
    assert re.search(r"answers request 1 episode 0, not request \d+ episode 1", reply.error)
    assert all_gone([child, copy])  # both copies are in the killed process group


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "a JSON list, not an object"),
        ('{"id": 7, "episode": 0, "messages": []}', "answers request 7 episode 0, not request 1"),
        ('{"id": 1, "episode": 0, "messages": 5}', "messages must be a list, got int"),
        ('{"id": 1, "episode": 0, "messages": [], "reward": "x"}', "reward must be a finite"),
    ],
)
def test_a_hand_written_line_on_the_protocol_pipe_is_an_episode_error(scripted, line, why):
    session = scripted()
    child, _ = pids(session.reset([0, 1], [{"input": "a"}, {"input": "b"}]))
    (written,) = session.step([0], [turn(f"write:{line}")])
    assert written.code == "env_error" and "reply was unreadable" in written.error
    assert why in written.error, written.error
    (other,) = session.step([1], [turn("x")])
    assert other.error.startswith("env_error: the environment process was restarted")
    assert all_gone([child])


def test_the_reply_limit_counts_the_reply_not_its_escaped_json(scripted):
    """200,000 emoji: 800,000 bytes decoded (within 1 MiB), 2.4 MB as escaped JSON."""
    session = scripted()
    (opened,) = session.reset([0], [{"input": "long:200000:\U0001f600"}])
    assert opened.error is None and opened.messages[0]["content"] == "\U0001f600" * 200_000
    (over,) = session.reset([1], [{"input": "long:300000:\U0001f600"}])
    assert re.search(r"the reply is 1200\d{3} bytes, more than the 1048576 allowed", over.error)


def test_a_batch_has_one_deadline_not_one_per_item(scripted):
    """Four 1 s steps, each far within the 30 s item limit, against a 2.5 s batch limit."""
    session = scripted(timeout_s=30, batch_timeout_s=2.5)
    session.reset([0, 1, 2, 3], [{"input": "a"}] * 4)
    results = session.step([0, 1, 2, 3], [turn("sleep")] * 4)
    timed_out = [r for r in results if r.code == "env_timeout"]
    assert len(timed_out) == 1 and "the batch's step took longer than 2.5 s" in timed_out[0].error


def test_the_child_sees_none_of_the_workers_secrets(scripted, monkeypatch):
    for secret in ("DATABASE_URL", "HF_TOKEN", "RLWB_API_KEY", "REDIS_URL"):
        monkeypatch.setenv(secret, "secret")
    session = scripted()
    session.reset([0], [{"input": "a"}])
    (reply,) = session.step([0], [turn("variables")])
    seen = set(reply.messages[0]["content"].split())
    assert not seen & {"DATABASE_URL", "HF_TOKEN", "RLWB_API_KEY", "REDIS_URL"}
    assert {"HOME", "PATH", "PYTHONPATH"} <= seen
