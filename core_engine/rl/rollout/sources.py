"""Rollout sources: what produces the trainer's next batch, for its one loop
(`GRPOTrainer.train`), each implementing a named interface of `rollout.interfaces`
(`RolloutSource`; the producers `RolloutProducer`). The weight channel
(`core_engine.weight_sync.WeightChannel`) is not theirs: the trainer's parts build it and
the trainer writes through it; a pipelined source only verifies the acknowledgements a
producer brings back.

- `SyncSource` (`pipeline = "sync"`): generated on demand, when the trainer asks; a batch's
  rollout is reused by its further updates (`updates_per_batch`) within `max_policy_lag`.
- `PrefetchSource` (`one_step`, `in_flight`): the next batch is produced one ahead, by a thread
  (`ThreadProducer`, on the trainer's engine) or, for a full-weight CPU job, a child process
  over the trainer's shared weights (`rollout_process.ProcessProducer`), while the trainer
  computes on the current one. `one_step`: before writing version v+1 the trainer waits for the
  next batch (`before_update`), so every sample is whole under v and trained at lag 1.
  `in_flight`: it does not wait; the update lands between two decode steps of the next batch,
  whose sequences go on under v+1 (per-token versions, lag <= 1). Either way a batch starts
  only once the job's staleness rule admits it (`staleness.StalenessManager`, asked before
  every start); one refused is started when the trainer moves on.

A source owns its checkpointable state (`state`): how many batches were drawn and, when it
holds one, the complete next rollout (or the reward error that rejects it, with its rollout),
kept only once its acknowledgements were verified, so an unverified batch is never
checkpointed. A batch the trainer took but whose step a stop interrupted (a cancel while it
waited for the next batch or for the gate; `consumed` never came) is the one kept: the resumed
run trains it first, so a stop loses no batch. A half-generated batch is not kept: a stop ends
it at its next decode step (`rollout.control`) and a resumed run generates it again (samples
are recorded when trained).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from core_engine.rl.config import GRPOConfig
from core_engine.rl.data import collate
from core_engine.rl.rewards import RewardError
from core_engine.rl.rollout.control import BatchCancelled, Heartbeat
from core_engine.rl.rollout.dynamic import draw_until_mixed
from core_engine.rl.rollout.interfaces import RolloutProducer, RolloutSource
from core_engine.rl.rollout.results import RawRollout, RolloutResult
from core_engine.rl.rollout.runner import Produced, RolloutRunner, produce_rollout
from core_engine.rl.rollout.seeds import batch_seed
from core_engine.rl.rollout.staleness import StalenessManager
from core_engine.weight_sync import WeightChannel

Batch = dict[str, list[str]]
JOIN_POLL_S = 0.2  # how often a wait for a batch re-checks a cancel


class BatchPlan:
    """The seeded sequence of prompt batches: batch `index` is the same draw in every run, so a
    resumed run continues it."""

    def __init__(self, records: Sequence[Mapping[str, str]], batch_size: int, seed: int) -> None:
        self.records, self.batch_size, self.seed = list(records), batch_size, seed

    def at(self, index: int) -> Batch:
        order = random.Random(self.seed * 1_000_003 + index)
        return collate(order.sample(self.records, min(self.batch_size, len(self.records))))


class SyncSource(RolloutSource):
    """Batches generated on demand by the trainer's engine, at the trainer's version: nothing
    to admit (lag 0); a batch's rollout is reused while the staleness rule finds it fresh
    (`RolloutRunner`)."""

    def __init__(
        self,
        config: GRPOConfig,
        plan: BatchPlan,
        runner: RolloutRunner,
        state: Mapping[str, Any],
    ) -> None:
        self.config, self.plan, self.runner = config, plan, runner
        self.batches_drawn = state.get("batches_drawn", 0)
        self.updates_done = state.get("updates_done", 0)  # of the current batch
        # the trainer's log-probs of the reused rollout at its version, from its first update
        self.proximal: tuple[RolloutResult, dict[int, list[float]]] | None = None
        pending = state.get("pending")
        if pending is not None and not pending.get("prefetched"):
            rollout = RolloutResult.from_json(pending["rollout"])
            self.runner.keep(self.plan.at(self.batches_drawn - 1), rollout)
            self.proximal = (rollout, {int(k): v for k, v in pending["old_logprobs"].items()})

    def next(self, step_index: int, batch: Batch | None = None) -> Produced:
        """The rollout of the next update: a new batch of prompts (or `batch`), or the current
        one's again while it has updates left; with `dynamic_sampling`, the draws of new
        batches that give it enough groups with mixed rewards (`rollout.dynamic`). A batch a
        cancel interrupted (`BatchCancelled`) is not drawn: a resumed run generates it."""
        counters = self.batches_drawn, self.updates_done
        try:
            if batch is None and self.config.dynamic_sampling:
                cfg = self.config
                return draw_until_mixed(
                    self._draw, cfg.batch_size, cfg.max_sampling_draws, cfg.reject_scope
                )
            if batch is None:
                if self.updates_done == 0:
                    self.batches_drawn += 1
                batch = self.plan.at(self.batches_drawn - 1)
                self.updates_done = (self.updates_done + 1) % self.config.updates_per_batch
            return self.produce(batch, batch_seed(self.config.seed, step_index))
        except BatchCancelled:
            self.batches_drawn, self.updates_done = counters
            raise

    def _draw(self) -> Produced:
        """The rollout of the next batch of the plan, sampled from that batch's seed."""
        self.batches_drawn += 1
        index = self.batches_drawn - 1
        return self.produce(self.plan.at(index), batch_seed(self.config.seed, index))

    def produce(self, batch: Batch, seed: int) -> Produced:
        """The rollout of `batch`, sampled from `seed` (a `ranks.RankSource` splits it)."""
        return produce_rollout(self.runner, batch, seed)

    def known_proximal(self, rollout: RolloutResult, fresh: bool) -> dict[int, list[float]]:
        if fresh or self.proximal is None or self.proximal[0] is not rollout:
            return {}
        return self.proximal[1]

    def keep_proximal(self, rollout: RolloutResult, logprobs: dict[int, list[float]]) -> None:
        self.proximal = (rollout, logprobs)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the counters and, between two updates of one batch, the
        rollout the next update reuses with the trainer's log-probs at its version."""
        state: dict[str, Any] = {
            "batches_drawn": self.batches_drawn,
            "updates_done": self.updates_done,
        }
        if self.updates_done and self.runner.last is not None:
            kept = self.proximal
            old = kept[1] if kept is not None and kept[0] is self.runner.last else {}
            state["pending"] = {"rollout": self.runner.last.to_json(), "old_logprobs": old}
        return state


class ThreadProducer(RolloutProducer):
    """One batch's rollout at a time, on a thread with `threads` intra-op threads, on the
    trainer's own engine (updated by the trainer's `LocalChannel`). `heartbeat` is the one
    `runner` generates with: a batch without progress for `timeout_s` fails the wait
    (`control.ProducerHungError`), and a thread so stuck is abandoned, not joined."""

    def __init__(
        self, runner: RolloutRunner, threads: int, heartbeat: Heartbeat, timeout_s: float
    ) -> None:
        self.runner, self.threads = runner, threads
        self.heartbeat, self.timeout_s = heartbeat, timeout_s
        self._thread: threading.Thread | None = None
        self._outcome: Produced | BaseException | None = None
        self._hung = False

    @property
    def busy(self) -> bool:
        return self._thread is not None

    def start(self, batch: Batch, seed: int) -> None:
        if self._thread is not None:
            raise RuntimeError("a rollout producer makes one batch at a time")
        self._outcome = None
        self.heartbeat.beat()
        self._thread = threading.Thread(
            target=self._produce, args=(batch, seed), name="rollout-producer", daemon=True
        )
        self._thread.start()

    def _produce(self, batch: Batch, seed: int) -> None:
        torch.set_num_threads(self.threads)
        try:
            self._outcome = produce_rollout(self.runner, batch, seed)
        except BaseException as exc:  # re-raised on the trainer's thread by `take`
            self._outcome = exc

    def take(self, cancelled: Callable[[], bool]) -> tuple[Produced, list[tuple[int, str]]]:
        """The started batch's outcome once produced, and the acknowledgements it carries
        (none: its engine's updates were checked when written)."""
        assert self._thread is not None
        while self._thread.is_alive():
            self._thread.join(JOIN_POLL_S)
            if cancelled():  # the batch is abandoned; its thread ends at its next step
                raise BatchCancelled("cancelled while a rollout batch was generated")
            if (hung := self.heartbeat.hung(self.timeout_s, "rollout thread")) is not None:
                self._hung = True
                raise hung
        outcome, self._thread, self._outcome = self._outcome, None, None
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome, []

    def close(self) -> None:
        if self._thread is not None and not self._hung:
            self._thread.join()
        self._thread = None


class PrefetchSource(RolloutSource):
    """The next batch produced one ahead by `make_producer(threads)` (module docstring), each
    started only once `staleness` admits it: a batch refused is started when the trainer has
    moved on (`consumed`). The producer's acknowledgements are checked against `channel`."""

    def __init__(
        self,
        config: GRPOConfig,
        plan: BatchPlan,
        make_producer: Callable[[int], RolloutProducer],
        channel: WeightChannel,
        state: Mapping[str, Any],
        cancelled: Callable[[], bool],
        staleness: StalenessManager,
    ) -> None:
        self.config, self.plan, self.make_producer = config, plan, make_producer
        self.channel, self.cancelled, self.staleness = channel, cancelled, staleness
        self.batches_drawn = state.get("batches_drawn", 0)
        self.producer: Any = None
        self._ready: Produced | None = None  # the next batch's, produced and verified
        self._current: Produced | None = None  # taken by the trainer, its step not finished
        self._wanted: int | None = None  # the batch to start once admitted
        pending = state.get("pending")
        if pending is not None and pending.get("prefetched"):  # kept by the checkpoint resumed
            self._ready = (pending_outcome(pending), True, {"generate_s": 0.0, "reward_s": 0.0})
        staleness.on_version_recovered(state.get("version", 0), int(self._ready is not None))
        self._own_threads = torch.get_num_threads()

    def open(self) -> None:
        """Start the producer; generation and training each get half of the intra-op threads
        (at least one)."""
        threads = max(1, self._own_threads // 2)
        self.producer = self.make_producer(threads)
        torch.set_num_threads(threads)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()
        torch.set_num_threads(self._own_threads)

    def next(self, step_index: int) -> Produced:
        index = self.batches_drawn
        outcome, self._ready = self._ready, None
        if outcome is None and not self.producer.busy:  # the first batch, or after a failure
            self._wanted = index
            if not self._start_admitted():  # nothing is outstanding: never refused
                raise RuntimeError(f"the staleness rule refused batch {index}, awaited")
        if outcome is None:
            outcome = self._take()
        self._wanted = index + 1 if step_index + 1 < self.config.steps else None
        self._start_admitted()
        self.batches_drawn += 1
        self._current = outcome
        return outcome

    def consumed(self, trained: bool) -> None:
        if not trained:
            self.staleness.on_rejected()
        self._current = None
        self._start_admitted()  # the trainer moved on: a refused batch may start now

    def _start_admitted(self) -> bool:
        """Start the wanted batch if the producer is free and the staleness rule admits it."""
        index = self._wanted
        if index is None or self.producer.busy or not self.staleness.admit():
            return False
        self.producer.start(self.plan.at(index), batch_seed(self.config.seed, index))
        self._wanted = None
        return True

    def _take(self) -> Produced:
        """The started batch's outcome, its acknowledgements verified."""
        outcome, acks = self.producer.take(self.cancelled)
        self.staleness.on_produced()
        self.channel.check_acks(acks)
        return outcome

    def before_update(self) -> None:
        """`one_step`: the next batch's generation ends under the version being trained."""
        if self.config.pipeline == "one_step" and self.producer.busy:
            self._ready = self._take()

    def settle(self) -> None:
        """At the end of a run: the batch in progress is completed and verified, so the
        checkpoint keeps it; a stop ends it at its next decode step instead (`BatchCancelled`),
        and a resumed run generates it again."""
        if self.producer.busy:
            self._ready = self._take()

    def state(self) -> dict[str, Any]:
        """The batches drawn and the one the next step takes: the batch whose step a stop
        interrupted (drawn again), else the produced next one."""
        drawn, pending = self.batches_drawn, self._ready
        if self._current is not None:
            drawn, pending = drawn - 1, self._current
        state: dict[str, Any] = {"batches_drawn": drawn}
        if pending is not None and (kept := pending_json(pending[0])) is not None:
            state["pending"] = kept
        return state


def pending_json(outcome: RolloutResult | RewardError) -> dict[str, Any] | None:
    """A produced batch as a checkpoint keeps it: the rollout, or the reward error rejecting it
    with its rollout (None: an error with no rollout, which a resumed run produces again)."""
    if isinstance(outcome, RolloutResult):
        return {"rollout": outcome.to_json(), "prefetched": True}
    raw = getattr(outcome, "rollout", None)
    if raw is None:
        return None
    return {"rollout": raw.to_json(), "prefetched": True, "reward_error": str(outcome)}


def pending_outcome(pending: Mapping[str, Any]) -> RolloutResult | RewardError:
    """`pending_json`'s inverse."""
    if "reward_error" not in pending:
        return RolloutResult.from_json(pending["rollout"])
    error = RewardError(pending["reward_error"])
    error.rollout = RawRollout.from_json(pending["rollout"])
    return error
