"""The named interfaces of rollout production (AReaL's `engine_api.py` style), each
implementation declaring the one it implements (`class SyncSource(RolloutSource)`), and
`tests/core_engine/test_interfaces.py` checking every implementation against it:

- `RolloutSource`: what the trainer's loop asks for its next batch (`rollout.sources`:
  `SyncSource`, `PrefetchSource`; `ranks.rollouts.RankSource`).
- `RolloutProducer`: what makes one batch at a time beside the trainer (`sources.ThreadProducer`,
  `process.ProcessProducer`, `ranks.rollouts.RankProducer`).

The third, the weight channel, is the engine's: `core_engine.weight_sync.WeightChannel`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from core_engine.rl.rollout.results import RolloutResult
from core_engine.rl.rollout.runner import Produced


@runtime_checkable
class RolloutSource(Protocol):
    """What the trainer's loop asks of a source; the bodies are the defaults of a source with
    nothing running between two batches and nothing reused."""

    batches_drawn: int

    def next(self, step_index: int) -> Produced:
        """The rollout the step `step_index` trains (or the reward error rejecting it), whether
        it is fresh, and its timings."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps to resume the source exactly."""
        ...

    def open(self) -> None:
        """Start what runs beside the trainer."""

    def close(self) -> None:
        """Stop it; no generation outlives the run, also on an error."""

    def before_update(self) -> None:
        """Called before the trainer writes the next version."""

    def consumed(self, trained: bool) -> None:
        """The batch taken last is done with: trained (the trainer's version is the one its
        update wrote), or its rejection recorded; nothing of it is pending any more."""

    def settle(self) -> None:
        """At the end of a run: complete (and verify) what is in progress."""

    def known_proximal(self, rollout: RolloutResult, fresh: bool) -> dict[int, list[float]]:
        """The trainer's log-probs of a reused rollout at its version (none known)."""
        return {}

    def keep_proximal(self, rollout: RolloutResult, logprobs: dict[int, list[float]]) -> None:
        """Keep them for the rollout's next update (nothing is reused)."""


@runtime_checkable
class RolloutProducer(Protocol):
    """One batch's rollout at a time beside the trainer (a thread, a child process, a rank's
    share): started, then taken with the acknowledgements of the updates its engine served."""

    @property
    def busy(self) -> bool:
        """A batch was started and its outcome not taken yet."""
        ...

    def start(self, batch: Mapping[str, Sequence[str]], seed: int) -> None:
        """Start producing `batch`'s rollout, sampled from `seed` (one batch at a time)."""
        ...

    def take(self, cancelled: Callable[[], bool]) -> tuple[Produced, list[tuple[int, str]]]:
        """The started batch's outcome once produced, and the (version, checksum) updates
        acknowledged while producing it; `BatchCancelled` once `cancelled()`."""
        ...

    def close(self) -> None:
        """Stop producing; nothing outlives the run."""
        ...
