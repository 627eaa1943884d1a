"""Environments the sandbox tests register (RLWB_ENVIRONMENTS): each step does what the turn's
content says, so a test can make one episode hang, eat memory, crash or break the contract."""

import os
import signal
import time

HANG_S = 60  # 30x the tests' time limit: a step the sandbox must give up on
SLEEP_S = 1.0  # a slow step well within the tests' time limit
EAT_BYTES = 2 << 30  # 2 GiB: far over the child's memory limit in the tests

MALFORMED = {
    "not_a_dict": [],
    "no_messages": {"reward": 1.0, "done": True},
    "unknown_key": {"messages": [], "rewards": 1.0},
    "nan_reward": {"messages": [], "reward": float("nan")},
    "text_reward": {"messages": [], "reward": "1"},
    "text_done": {"messages": [], "done": "yes"},
    "assistant_role": {"messages": [{"role": "assistant", "content": "x"}]},
    "number_content": {"messages": [{"role": "user", "content": 5}]},
    "extra_field": {"messages": [{"role": "user", "content": "x", "name": "y"}]},
    "too_many": {"messages": [{"role": "user", "content": "x"}] * 65},
    "too_big": {"messages": [{"role": "user", "content": "x" * (2 << 20)}]},
}


class Scripted:
    """Counts its turns (per episode) and answers ``<content> <turn> <pid>``; reset says the
    child's pid."""

    def __init__(self) -> None:
        self.tools = []
        self.turns = 0

    def reset(self, task):
        if task["input"] == "raise":
            raise KeyError("no such task")
        return [{"role": "user", "content": str(os.getpid())}]

    def step(self, turn):
        action = turn["content"]
        if action == "hang":
            time.sleep(HANG_S)
        elif action == "sleep":
            time.sleep(SLEEP_S)
        elif action == "eat":
            self.hog = bytearray(EAT_BYTES)
        elif action == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "raise":
            raise RuntimeError("boom")
        elif action in MALFORMED:
            return MALFORMED[action]
        self.turns += 1
        reply = f"{action} {self.turns} {os.getpid()}"
        return {"messages": [{"role": "user", "content": reply}], "reward": 0.5, "done": False}


class BadTools:
    def __init__(self) -> None:
        self.tools = [{"name": "calculate"}]  # not an OpenAI function tool
