"""The staleness rule, in one object: how far a rollout's policy version may lag the trainer's
(`max_policy_lag`, AReaL's eta, `max_head_offpolicyness`).

`StalenessManager` has the shape of AReaL's (`areal/infra/staleness_manager.py`): the
producer asks before it starts a batch, and a batch starts only while

    accepted + running + batch_size <= (max_staleness + version + 1) * batch_size

(`capacity`, counted in prompts): `running` are the batches started and not produced yet,
`accepted` those produced and not rejected by the trainer (trained, or waiting to be), and
`version` is the trainer's, read when asked (AReaL's `version_provider`). Every trained batch
advances the version by one, so the k-th batch accepted (k = 1, 2, ... from the version a run
starts at) is trained at version k - 1; admitted at version v only while k <= max_staleness +
v + 1, it is trained at most `max_staleness` versions after it started: no batch is generated
that would be too stale to train. A batch the trainer rejects gives its room back
(`on_rejected`), as AReaL's rejected rollouts do. With `max_staleness = 0` the producer is
refused the next batch until the trainer has written the version that trains it.

The same object answers the per-rollout question (`fresh`: may a kept rollout be reused by
the further updates of its batch) and the trainer's consume-time assertion (`check`).
"""

from __future__ import annotations

from collections.abc import Callable


class StaleRolloutError(RuntimeError):
    """A rollout's policy version is outside the allowed lag (or from the future)."""


class StalenessManager:
    """Admission of rollout batches by staleness (module docstring); not thread-safe: the
    trainer's thread asks and reports (`rollout.sources.PrefetchSource`)."""

    def __init__(self, max_staleness: int, batch_size: int, version: Callable[[], int]) -> None:
        self.max_staleness = max_staleness
        self.batch_size = batch_size
        self.version = version  # the trainer's current version
        self.running = 0  # prompts of batches started, not produced
        self.accepted = 0  # prompts of batches produced and not rejected
        self.rejected = 0  # prompts of produced batches the trainer rejected
        self.refused = 0  # admission questions answered no

    def capacity(self) -> int:
        """How many more prompts may start now (AReaL's staleness capacity; negative: over
        it)."""
        limit = (self.max_staleness + self.version() + 1) * self.batch_size
        return limit - (self.accepted + self.running)

    def admit(self) -> bool:
        """May a batch start now? Yes: it counts as running."""
        if self.capacity() < self.batch_size:
            self.refused += 1
            return False
        self.running += self.batch_size
        return True

    def on_produced(self) -> None:
        """The batch started first is produced (a rollout, or the reward error rejecting it)."""
        self.running -= self.batch_size
        self.accepted += self.batch_size

    def on_rejected(self) -> None:
        """The trainer rejected a produced batch: it advances no version; its room is free."""
        self.accepted -= self.batch_size
        self.rejected += self.batch_size

    def on_version_recovered(self, version: int, produced: int = 0) -> None:
        """A run resumed at `version` with `produced` batches kept by its checkpoint (AReaL's
        `on_version_recovered`: the batches trained before count as accepted)."""
        self.accepted = (version + produced) * self.batch_size

    def fresh(self, rollout_version: int) -> bool:
        """Whether a rollout of `rollout_version` may be trained now."""
        return 0 <= self.version() - rollout_version <= self.max_staleness

    def check(self, rollout_version: int) -> None:
        """`fresh`, or `StaleRolloutError` naming why not."""
        if self.fresh(rollout_version):
            return
        trainer_version = self.version()
        if rollout_version > trainer_version:
            raise StaleRolloutError(
                f"rollout from future version {rollout_version} (trainer is at {trainer_version})"
            )
        raise StaleRolloutError(
            f"rollout of version {rollout_version} is {trainer_version - rollout_version} "
            f"versions old (max_policy_lag={self.max_staleness})"
        )
