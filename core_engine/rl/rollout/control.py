"""What a batch in production is asked and watched by: whether to stop, and whether it still
makes progress.

Generation asks "stop now?" before every decode step (`InferenceScheduler.run_batch`'s
`cancelled`) and an episode batch asks it between turns; a yes ends the batch there
(`BatchCancelled`: the batch is dropped, never trained, and a resumed run generates it again).
The same question is the batch's sign of life: `Heartbeat` records when it was last asked, in
shared memory, so the trainer waiting for a pipelined producer (a thread, or the rollout
process) sees a producer that is alive but makes no progress, and fails the job after the
job's `rollout_timeout_s`, else the worker's ``RLWB_ROLLOUT_TIMEOUT``, else
`DEFAULT_ROLLOUT_TIMEOUT_S` (`ProducerHungError`).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

from core_engine.rl.config import GRPOConfig

DEFAULT_ROLLOUT_TIMEOUT_S = 600.0


class BatchCancelled(RuntimeError):
    """A cancel arrived while a batch was generated, or while the trainer waited for one."""


class ProducerHungError(RuntimeError):
    """A rollout producer, alive, made no progress for the job's rollout timeout."""


def rollout_timeout(config: GRPOConfig) -> float:
    """The longest a pipelined producer may go without progress (module docstring)."""
    if config.rollout_timeout_s is not None:
        return config.rollout_timeout_s
    configured = os.environ.get("RLWB_ROLLOUT_TIMEOUT")
    return float(configured) if configured else DEFAULT_ROLLOUT_TIMEOUT_S


def never() -> bool:
    return False


class Heartbeat:
    """Generation's "stop now?" (`stop`), whose every asking is recorded as a sign of life in
    `last` (a shared `RawValue` of `time.monotonic()`, which a spawned rollout process writes
    and its parent reads; the clock is the machine's)."""

    def __init__(self, stop: Callable[[], bool] = never, last: Any = None) -> None:
        self.stop = stop
        self.last = last if last is not None else multiprocessing.RawValue("d", 0.0)
        self.beat()

    def __call__(self) -> bool:
        self.beat()
        return self.stop()

    def beat(self) -> None:
        self.last.value = time.monotonic()

    def hung(self, timeout_s: float, producer: str) -> ProducerHungError | None:
        """The error naming `producer` once no progress came for `timeout_s`, else None."""
        silent = time.monotonic() - self.last.value
        if silent <= timeout_s:
            return None
        return ProducerHungError(
            f"the {producer} made no progress for {silent:.0f} s (alive, no decode step "
            f"and no turn); the limit is {timeout_s:g} s (rollout_timeout_s, "
            "RLWB_ROLLOUT_TIMEOUT)"
        )
