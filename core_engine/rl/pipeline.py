"""Generation overlapped with training: the rollout of the next batch is produced by a thread
or, on a CPU, a child process (`rollout_process`), with its own intra-op threads, while the
trainer computes on the current one.

`one_step`: batch k+1 is generated under version v while the trainer computes batch k's
gradients; at the boundary the trainer waits for it, then steps the optimizer and publishes
v+1 between two engine steps (`GRPOTrainer._publish_next_version`). Every sample is whole-
sequence stamped and trained at lag <= 1, and the boundary's rollout is complete, so a
checkpoint keeps it (`GRPOTrainer.prefetched`): a resumed run equals an uninterrupted one.

`in_flight`: the trainer does not wait; the update lands between two decode steps of batch
k+1, whose running sequences go on under v+1 (per-token versions, lag <= 1). A checkpoint
taken then cannot hold the half-generated batch: a run resumed from it generates that batch
again (its samples were recorded nowhere: they are recorded when trained). A stop between two
steps keeps the completed next rollout, as `one_step` does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from core_engine.rl.config import GRPOConfig
from core_engine.rl.records import StopReason
from core_engine.rl.rollout import Produced, RolloutResult, RolloutRunner, produce_rollout


class Boundary:
    """What a trainer does around an optimizer step: `wait` before it, the weight change
    inside `gate(new_version)`. Synchronous: nothing (the engine's own gate suffices)."""

    def wait(self) -> None:
        """Before the step (one_step: until the next batch is produced)."""

    def gate(self, new_version: int) -> AbstractContextManager[None]:
        """Around the weight change: no generation step runs meanwhile."""
        return contextlib.nullcontext()


class PipelinedTrainer(Protocol):
    """What the pipeline drives: `core_engine.rl.trainer.GRPOTrainer`."""

    config: GRPOConfig
    runner: RolloutRunner
    step_index: int
    batches_drawn: int
    prefetched: RolloutResult | None
    boundary: Boundary
    version_digests: dict[int, str]
    device: torch.device
    model: Any
    max_seq_len: int
    version: int

    def batch_at(self, index: int) -> dict[str, list[str]]: ...
    def consume(self, result: Any, fresh: bool, timings: dict[str, float]) -> Any: ...
    def stop_reason(self) -> StopReason | None: ...
    def save(self) -> Any: ...


class RolloutProducer:
    """One batch's rollout at a time, on a thread with `threads` intra-op threads."""

    def __init__(self, runner: RolloutRunner, threads: int) -> None:
        self.runner = runner
        self.threads = threads
        self._thread: threading.Thread | None = None
        self._outcome: Produced | BaseException | None = None
        self.acks: list[tuple[int, str]] = []  # it serves the trainer's engine: none of its own

    @property
    def busy(self) -> bool:
        """A batch was started and its outcome not taken yet."""
        return self._thread is not None

    def start(self, batch: Mapping[str, Sequence[str]], seed: int) -> None:
        assert self._thread is None, "one batch at a time"
        self._outcome = None
        self._thread = threading.Thread(
            target=self._produce, args=(batch, seed), name="rollout-producer", daemon=True
        )
        self._thread.start()

    def gate(self, new_version: int) -> AbstractContextManager[None]:
        return contextlib.nullcontext()  # the engine's gate (`paused`) is the one

    def close(self) -> None:
        self.join()

    def _produce(self, batch: Mapping[str, Sequence[str]], seed: int) -> None:
        torch.set_num_threads(self.threads)
        try:
            self._outcome = produce_rollout(self.runner, batch, seed)
        except BaseException as exc:  # re-raised on the trainer's thread by `take`
            self._outcome = exc

    def join(self) -> None:
        """Wait until the started batch is produced (its outcome stays to be taken)."""
        if self._thread is not None:
            self._thread.join()

    def finished_rollout(self) -> RolloutResult | None:
        """The produced rollout once joined (None: none, or it failed)."""
        outcome = self._outcome
        if self._thread is None or self._thread.is_alive() or not isinstance(outcome, tuple):
            return None
        return outcome[0] if isinstance(outcome[0], RolloutResult) else None

    def take(self) -> Produced:
        self.join()
        outcome, self._thread, self._outcome = self._outcome, None, None
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome


def batch_seed(seed: int, index: int) -> int:
    """The sampling seed of batch `index` (pipelined: known before the trainer reaches it)."""
    return seed * 1_000_003 + index * 10_007


class _PipelineBoundary(Boundary):
    def __init__(self, trainer: PipelinedTrainer, producer: Any) -> None:
        self.trainer, self.producer = trainer, producer

    def wait(self) -> None:
        if self.trainer.config.pipeline == "one_step":
            self.producer.join()
            self.trainer.prefetched = self.producer.finished_rollout()  # a checkpoint keeps it

    def gate(self, new_version: int) -> AbstractContextManager[None]:
        return self.producer.gate(new_version)


def start_producer(trainer: PipelinedTrainer, threads: int) -> Any:
    """A child process over the trainer's shared weights on a CPU (threads would take turns
    on the interpreter lock), else a thread; LoRA keeps the thread (its adapter is injected
    where the policy is loaded)."""
    if trainer.config.generates_in_process(trainer.device.type):
        from core_engine.rl.rollout_process import ProcessProducer

        return ProcessProducer(
            trainer.config, trainer.model, trainer.max_seq_len, trainer.version, threads
        )
    return RolloutProducer(trainer.runner, threads)


def run_pipelined(trainer: PipelinedTrainer) -> StopReason:
    """`trainer.train()` in a pipeline mode: until `steps` optimizer steps, a stop or a stall.
    Generation and training each get half of the intra-op threads (at least one)."""
    own_threads = torch.get_num_threads()
    threads = max(1, own_threads // 2)
    producer = start_producer(trainer, threads)
    trainer.boundary = _PipelineBoundary(trainer, producer)
    torch.set_num_threads(threads)
    try:
        return _loop(trainer, producer)
    finally:
        producer.close()  # no generation outlives the loop, also on an error
        trainer.boundary = Boundary()
        torch.set_num_threads(own_threads)


def _loop(trainer: PipelinedTrainer, producer: RolloutProducer) -> StopReason:
    config = trainer.config
    outcome: Produced | None = None
    if trainer.prefetched is not None:  # kept by the checkpoint this run resumed from
        outcome = (trainer.prefetched, True, {"generate_s": 0.0, "reward_s": 0.0})
    reason = StopReason.DONE
    while trainer.step_index < config.steps:
        if (reason := trainer.stop_reason() or reason) is not StopReason.DONE:
            break
        index = trainer.batches_drawn
        if outcome is None:  # nothing produced ahead (the first batch, or after a failure)
            producer.start(trainer.batch_at(index), batch_seed(config.seed, index))
            outcome = producer.take()
        if trainer.step_index + 1 < config.steps:
            producer.start(trainer.batch_at(index + 1), batch_seed(config.seed, index + 1))
        trainer.batches_drawn += 1
        trainer.prefetched = None
        trainer.consume(*outcome)
        outcome = producer.take() if producer.busy else None
        check_acks(producer.acks, trainer.version_digests)
        rollout = outcome[0] if outcome is not None else None
        trainer.prefetched = rollout if isinstance(rollout, RolloutResult) else None
    trainer.save()
    return reason


def check_acks(acks: list[tuple[int, str]], digests: dict[int, str]) -> None:
    """The versions a rollout process served must be the trainer's, checksum for checksum."""
    for version, checksum in acks:
        if digests.get(version) != checksum:
            expected = str(digests.get(version))[:12]
            raise RuntimeError(
                f"weight sync failed: the rollout process served version {version} with "
                f"checksum {checksum[:12]}, the trainer's is {expected}"
            )
