"""Environments the sandbox tests register (RLWB_ENVIRONMENTS): each step does what the turn's
content says, so a test can make one episode hang, eat memory, crash or break the contract."""

import contextlib
import fcntl
import os
import signal
import stat
import subprocess
import sys
import time

HANG_S = 60  # 30x the tests' time limit: a step the sandbox must give up on
SLEEP_S = 1.0  # a slow step well within the tests' time limit
EAT_BYTES = 2 << 30  # 2 GiB: far over the child's memory limit in the tests
# the registration of `Scripted`, as an operator writes it
SCRIPTED = "scripted=tests.core_engine.envs_for_tests:Scripted"

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
    "nul": {"messages": [{"role": "user", "content": "a\x00b"}]},
    "surrogate": {"messages": [{"role": "user", "content": "a\ud800b"}]},
}
FORKED_REPLY_DELAY_S = 0.3  # the original's reply after its forked copy's: a stray line
SPINNER = "import time\nwhile True: time.sleep(0.05)"


def protocol_fd() -> int:
    """The child's protocol pipe, as an environment can find it: its one write-only pipe
    besides stdout and stderr."""
    for fd in map(int, os.listdir("/proc/self/fd")):
        with contextlib.suppress(OSError):
            pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
            if fd > 2 and pipe and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                return fd
    raise LookupError("no protocol pipe")


class Scripted:
    """Counts its turns (per episode) and answers ``<content> <turn> <pid>``; reset says the
    child's pid."""

    def __init__(self) -> None:
        self.tools = []
        self.turns = 0

    def reset(self, task):
        if task["input"] == "raise":
            raise KeyError("no such task")
        if task["input"].startswith("long:"):  # "long:<count>:<character>"
            _, count, character = task["input"].split(":")
            return [{"role": "user", "content": character * int(count)}]
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
        elif action == "spawn":  # a grandchild that spins until killed: its pid is the reply
            spinner = subprocess.Popen([sys.executable, "-c", SPINNER])
            return {"messages": [{"role": "user", "content": str(spinner.pid)}]}
        elif action == "fork":  # both copies answer and go on serving
            if os.fork():
                time.sleep(FORKED_REPLY_DELAY_S)
        elif action.startswith("spawn_and_hang:"):  # the pids to that file, then hang
            spinner = subprocess.Popen([sys.executable, "-c", SPINNER])
            with open(action.removeprefix("spawn_and_hang:"), "w") as f:
                f.write(f"{os.getpid()} {spinner.pid}")
            time.sleep(HANG_S)
        elif action.startswith("write:"):  # a hand-written line on the protocol pipe
            os.write(protocol_fd(), action.removeprefix("write:").encode() + b"\n")
        elif action == "variables":
            return {"messages": [{"role": "user", "content": " ".join(sorted(os.environ))}]}
        self.turns += 1
        reply = f"{action} {self.turns} {os.getpid()}"
        return {"messages": [{"role": "user", "content": reply}], "reward": 0.5, "done": False}


class BadTools:
    def __init__(self) -> None:
        self.tools = [{"name": "calculate"}]  # not an OpenAI function tool
