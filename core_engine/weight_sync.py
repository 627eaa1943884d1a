"""The one weight channel: the only way the weights an engine serves change.

A writer (the trainer) changes weights only inside `writing(version)`; every engine step holds
the same gate, so an update lands between two steps by construction, and the gate is released
at the end of every step (never held through detokenizing, rewards or anything else).

- `StepGate`: the gate of an engine in this process (`InferenceScheduler.lock`). Steps and
  queue changes take it plainly; a writer takes it with priority (no new step starts while one
  waits) and may run steps itself (an update's drain), so it is reentrant for its holder.
- `LocalChannel`: a trainer and its engine in one process (the same tensors, or the engine's
  converted copy): the trainer writes under the engine's `StepGate`, and the update and its
  acknowledgement happen before the gate is let go.
- `ProcessChannel` / `ProcessGate`: a trainer and an engine in a child process over shared
  memory. The trainer takes it with a timeout and a liveness check of the child (a child that
  died holding it fails the job within seconds, naming it; a cancel is honoured while waiting);
  the child's engine polls it first thing in each step (`InferenceScheduler.weight_source`),
  converting the shared weights to its own dtype when the version moved, and acknowledges;
  the acknowledgements come back with the rollout and must equal the trainer's digests.

Either way the trainer holds, for each version it wrote, the digest of what it published
(`update_digest` of `published_weights`), and nothing generated under a version whose
acknowledgement does not match it is ever trained on.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from core_engine.weights import published_weights, update_digest, weights_checksum

GATE_POLL_S = 0.2  # how often a waiting side re-checks its peer and a cancel
GATE_TIMEOUT_S = 600.0  # a live peer holding the gate longer is hung (a CPU prefill is shorter)
DIGESTS_KEPT = 4  # acknowledgements name the last version or two


class WeightSyncError(RuntimeError):
    """An engine acknowledged weights other than the ones the trainer wrote."""


class PeerDiedError(RuntimeError):
    """The other side of a weight channel is gone (or hung holding the gate)."""


class GateWaitCancelled(RuntimeError):
    """A cancel arrived while a writer waited for the gate: nothing was written."""


@runtime_checkable
class WeightChannel(Protocol):
    """The trainer's side of the channel to the engines that generate its rollouts: one per
    job, built and owned by the trainer's parts (`rl.trainer.parts.weight_channel`), written by
    the trainer alone; the rollout sources and producers only verify what it recorded."""

    def writing(self, version: int) -> contextlib.AbstractContextManager[None]:
        """The block that changes the weights: no engine step runs for its duration; after
        it, the engines serve `version` and their acknowledgements were checked (or, a child
        process's, come back with its rollouts: `check_acks`)."""
        ...

    def check_acks(self, acks: list[tuple[int, str]]) -> None:
        """Every (version, checksum) an engine acknowledged is what the trainer wrote, else
        `WeightSyncError`."""
        ...

    def checksum_of_record(self, version: int) -> str:
        """The full SHA-256 of what `version` serves (recorded with the version)."""
        ...


class WeightSource(Protocol):
    """Where an engine's weights come from between its steps (`ChildWeights`):
    `InferenceScheduler.step` runs inside `serving(engine)`."""

    def serving(self, engine: Any) -> contextlib.AbstractContextManager[None]: ...


class StepGate:
    """The lock of one engine: held by each step and queue change; a writer has priority and
    may run steps while it holds it (reentrant for the holding thread)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._writers = 0
        self._no_writer = threading.Condition(threading.Lock())
        self._held = threading.local()

    def _depth(self) -> int:
        return getattr(self._held, "depth", 0)

    def __enter__(self) -> StepGate:
        if self._writers and self._depth() == 0:  # a holder (a drain) never waits for itself
            with self._no_writer:
                self._no_writer.wait_for(lambda: self._writers == 0)
        self._lock.acquire()
        self._held.depth = self._depth() + 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._held.depth = self._depth() - 1
        self._lock.release()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Exclusive, ahead of any step not yet started."""
        with self._no_writer:
            self._writers += 1
        try:
            self._lock.acquire()
            self._held.depth = self._depth() + 1
            try:
                yield
            finally:
                self._held.depth = self._depth() - 1
                self._lock.release()
        finally:
            with self._no_writer:
                self._writers -= 1
                self._no_writer.notify_all()


def _acquire(lock: Any, alive: Callable[[], bool], cancelled: Callable[[], bool], who: str) -> None:
    """Take a process lock, giving up on a dead or hung peer or a cancel."""
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not lock.acquire(timeout=GATE_POLL_S):
        if not alive():
            raise PeerDiedError(f"{who} died while holding the generation gate")
        if cancelled():
            raise GateWaitCancelled(f"cancelled while waiting for {who} to release the gate")
        if time.monotonic() > deadline:
            raise PeerDiedError(f"{who} has held the generation gate for {GATE_TIMEOUT_S:.0f} s")


class ProcessGate:
    """The generation gate between a trainer and the engine of a child process (picklable to a
    spawned child). Fair to the trainer: while it waits, the child starts no new step."""

    def __init__(self, context: Any, version: int) -> None:
        self.lock = context.Lock()
        self.wanted = context.Event()  # the trainer waits for the gate
        self.version = context.Value("q", version)  # the version the shared weights hold

    @contextlib.contextmanager
    def writing(
        self,
        version: int,
        child_alive: Callable[[], bool],
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Iterator[None]:
        """Trainer side: no engine step runs in the child for the duration; the shared weights
        are `version`'s when the block ends without an error."""
        self.wanted.set()
        try:
            _acquire(self.lock, child_alive, cancelled, "the rollout process")
        except BaseException:
            self.wanted.clear()
            raise
        self.wanted.clear()
        try:
            yield
            self.version.value = version
        finally:
            self.lock.release()


class ChildWeights:
    """Child side of a `ProcessGate`: the engine's `weight_source`. Around each engine step it
    takes the gate and, when the shared version moved, serves it (`update_weights` in flight:
    the shared weights converted to the engine's dtype, the prefix invalidated, the checksum
    acknowledged); `acks` collects (version, checksum) for the trainer to verify."""

    def __init__(self, gate: ProcessGate, shared: Callable[[], Mapping[str, torch.Tensor]]) -> None:
        self.gate = gate
        self.shared = shared  # the trainer's weights in shared memory, in the engine's dtype
        self.parent = os.getppid()
        self.acks: list[tuple[int, str]] = []

    def _parent_alive(self) -> bool:
        return os.getppid() == self.parent

    @contextlib.contextmanager
    def serving(self, engine: Any) -> Iterator[None]:
        while self.gate.wanted.is_set() and self._parent_alive():
            time.sleep(0.0005)  # the trainer goes first
        _acquire(self.gate.lock, self._parent_alive, lambda: False, "the trainer")
        try:
            target = self.gate.version.value
            if target > engine.version:
                ack = engine.update_weights(self.shared(), target, mode="in_flight")
                self.acks.append((ack.version, ack.checksum))
            yield
        finally:
            self.gate.lock.release()


class LocalChannel(WeightChannel):
    """A trainer and its engine in one process. `mode` is how running requests meet an update
    (`InferenceScheduler.update_weights`). Keeps the digest of every recent version written."""

    def __init__(self, engine: Any, model: torch.nn.Module, mode: str = "drain") -> None:
        self.engine, self.model, self.mode = engine, model, mode
        self.engine_dtype = engine.model.lm_head.weight.dtype
        self.digests: dict[int, str] = {}

    def _written(self, version: int, published: Mapping[str, torch.Tensor]) -> None:
        self.digests[version] = update_digest(published)
        self.digests.pop(version - DIGESTS_KEPT, None)

    def checksum_of_record(self, version: int) -> str:
        """The full SHA-256 of what `version` serves (on a CPU the digest already is it)."""
        digest = self.digests[version]
        if not any(t.is_cuda for t in self.model.parameters()):
            return digest
        return weights_checksum(published_weights(self.model, self.engine_dtype))

    def check_acks(self, acks: list[tuple[int, str]]) -> None:
        """Every (version, checksum) an engine acknowledged must be the trainer's."""
        for version, checksum in acks:
            expected = self.digests.get(version)
            if expected != checksum:
                raise WeightSyncError(
                    f"weight sync failed: the engine acknowledged version {version} with "
                    f"checksum {checksum[:12]}, the trainer wrote {str(expected)[:12]}"
                )

    @contextlib.contextmanager
    def writing(self, version: int) -> Iterator[None]:
        """No engine step runs for the duration; then the engine serves `version` and its
        acknowledgement is checked."""
        with self.engine.lock.writing():
            yield
            published = published_weights(self.model, self.engine_dtype)
            ack = self.engine.update_weights(published, version, self.mode)
        self._written(version, published)
        self.check_acks([(ack.version, ack.checksum)])


class ProcessChannel(LocalChannel):
    """The trainer's side of a `ProcessGate`; its own engine (evaluation) is updated as by a
    `LocalChannel`, and the child acknowledges what it served with its rollouts
    (`check_acks`). The child that serves the gate is `connect`ed once it is spawned
    (`rl.rollout.process.ProcessProducer`); until then no one else holds the gate."""

    def __init__(
        self, engine: Any, model: torch.nn.Module, context: Any, cancelled: Callable[[], bool]
    ) -> None:
        super().__init__(engine, model, "drain")
        self.gate = ProcessGate(context, engine.version)
        self.cancelled = cancelled
        self.child_alive: Callable[[], bool] = lambda: True

    def connect(self, child_alive: Callable[[], bool]) -> None:
        """The gate's other side is a child process, alive while `child_alive()`."""
        self.child_alive = child_alive

    @contextlib.contextmanager
    def writing(self, version: int) -> Iterator[None]:
        with super().writing(version), self.gate.writing(version, self.child_alive, self.cancelled):
            yield
