"""The staleness rule: how far a rollout's policy version may lag the trainer's."""

from __future__ import annotations


class StaleRolloutError(RuntimeError):
    """A rollout's policy version is outside the allowed lag (or from the future)."""


def check_policy_lag(rollout_version: int, trainer_version: int, max_policy_lag: int) -> None:
    lag = trainer_version - rollout_version
    if lag < 0:
        raise StaleRolloutError(
            f"rollout from future version {rollout_version} (trainer is at {trainer_version})"
        )
    if lag > max_policy_lag:
        raise StaleRolloutError(
            f"rollout of version {rollout_version} is {lag} versions old "
            f"(max_policy_lag={max_policy_lag})"
        )
