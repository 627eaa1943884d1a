"""Policy versions: the weight-update barrier of the scheduler and its acknowledgement."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from core_engine.task import ErrorCode
from core_engine.weights import (
    WeightUpdateError,
    canonical_weights,
    validate_update,
    weights_checksum,
)


@dataclass(frozen=True)
class WeightUpdateAck:
    """What the engine serves after an update: the trainer checks version and checksum."""

    version: int
    prefix_entries_invalidated: int
    requests_aborted: int
    checksum: str
    seconds: float  # the whole update: validation, barrier, copy, invalidation, checksum
    control_seconds: float  # the barrier, invalidation and version switch alone


class PolicyUpdates:
    """`update_weights` for `InferenceScheduler` (mixed in): it uses the scheduler's lock,
    queues, `step`, `abort`, model and KV pool. Updates take priority over the next batch or
    loop step, because the engine lock itself is not fair."""

    def _init_policy(self, version: int) -> None:
        self.version = version
        self.no_update_pending = threading.Event()
        self.no_update_pending.set()
        self._updates_pending = 0
        self._updates_guard = threading.Lock()

    def update_weights(
        self, weights: Mapping[str, torch.Tensor], version: int, mode: str = "drain"
    ) -> WeightUpdateAck:
        """Serve `weights` as policy `version`, at a step boundary, and acknowledge it.

        Refuses (nothing changed) a version not above the current one or a weight set that
        does not fit. Requests that already have tokens are drained under the old weights
        (`mode="drain"`) or ended `abort/policy_updated` (`mode="abort"`); queued requests
        that have not started run later under the new version. Every prefix-cache entry is
        invalidated, and weights are copied in place (captured graphs stay valid).
        """
        start = time.perf_counter()
        if mode not in ("drain", "abort"):
            raise WeightUpdateError(f"mode must be 'drain' or 'abort', got {mode!r}")
        with self._update_priority(), self.lock:
            if not isinstance(version, int) or version <= self.version:
                raise WeightUpdateError(
                    f"policy version {version!r} is not greater than the served {self.version}"
                )
            served = canonical_weights(self.model)
            validate_update(served, weights)
            control_start = time.perf_counter()
            aborted = self._barrier(mode)
            copy_start = time.perf_counter()
            with torch.no_grad():
                for name, tensor in served.items():
                    tensor.copy_(weights[name])
            copy_seconds = time.perf_counter() - copy_start
            invalidated = self.pool.strategy.invalidate()
            self.version = version
            control = time.perf_counter() - control_start - copy_seconds
            checksum = weights_checksum(served)
        return WeightUpdateAck(
            version, invalidated, aborted, checksum, time.perf_counter() - start, control
        )

    @contextlib.contextmanager
    def _update_priority(self):
        """Hold back new batches and loop steps until this update has the lock and is done."""
        with self._updates_guard:
            self._updates_pending += 1
            self.no_update_pending.clear()
        try:
            yield
        finally:
            with self._updates_guard:
                self._updates_pending -= 1
                if self._updates_pending == 0:
                    self.no_update_pending.set()

    def _barrier(self, mode: str) -> int:
        """Leave no started request behind; returns how many were aborted."""
        started = [*self.running, *(t for t in self.waiting if t.output_ids)]
        if mode == "abort":
            for task in started:
                self.abort(task, ErrorCode.POLICY_UPDATED, "the policy was updated mid-request")
            return len(started)
        while self.running or any(t.output_ids for t in self.waiting):
            self.step(admit_fresh=False)
        return 0
