"""The GRPO loop, one for every pipeline mode: take a batch from the rollout source, score,
accept or reject, optimise, write the next version through the source's weight channel and
verify its acknowledgement.

Invariants exercised here: versions rise by exactly one per optimizer step; every rollout used
at version v was generated within `max_policy_lag`; a rejected batch (or a step whose loss or
gradients are not finite) never reaches the optimizer; generation never starts before the
engine acknowledged the trainer's version with the trainer's checksum. A run stopped anywhere
and resumed from its checkpoint continues exactly as if it had not stopped.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from pathlib import Path
from typing import Any

import torch

from core_engine.rl.config import GRPOConfig
from core_engine.rl.objective.advantages import zero_variance_groups
from core_engine.rl.objective.update import (
    TrainSample,
    UpdateResult,
    accumulate_gradients,
    training_mode,
)
from core_engine.rl.ranks import RankInfo, is_sharded, rank0_decides, rank_share
from core_engine.rl.ranks.state import save_sharded_state
from core_engine.rl.ranks.step import clip_gradients, distributed_backward
from core_engine.rl.rewards import RewardError
from core_engine.rl.rollout.results import RolloutResult
from core_engine.rl.rollout.sources import (
    BatchCancelled,
    SyncSource,
)
from core_engine.rl.rollout.staleness import check_policy_lag
from core_engine.rl.trainer import screen
from core_engine.rl.trainer.checkpoint import (
    checkpoint_dir,
    prune_checkpoints,
    save_checkpoint,
)
from core_engine.rl.trainer.metrics import (
    kv_mixture_metrics,
    lag_metrics,
    mismatch_metrics,
    rollout_metrics,
    update_metrics,
)
from core_engine.rl.trainer.parts import build_parts
from core_engine.rl.trainer.records import StepRecord, StopReason, TrainerHooks, VersionRecord
from core_engine.rl.trainer.screen import screen_groups, step_samples, trainable_rows
from core_engine.weight_sync import GateWaitCancelled, WeightSyncError


class TrainingError(RuntimeError):
    """The run cannot continue (too many rejected batches, a failed weight sync)."""


class GRPOTrainer:
    def __init__(
        self,
        config: GRPOConfig,
        records: list[dict[str, str]],
        hooks: TrainerHooks | None = None,
        ranks: RankInfo | None = None,
    ) -> None:
        """`ranks`: this process's rank of a job on several devices (`core_engine.rl.ranks`:
        the process group is up); rank 0 alone writes checkpoints, the hooks are its."""
        if config.devices != (world := ranks.world_size if ranks else 1):
            raise ValueError(f"devices = {config.devices}: this trainer is one of {world} ranks")
        self.config, self.ranks = config, ranks
        self.hooks = hooks or TrainerHooks()
        self.output_dir = Path(config.output_dir)
        parts = build_parts(config, records, ranks, lambda: self.version, self._cancelled)
        state = parts.state
        self.version, self.step_index = state["version"], state["step"]
        self.device, self.tokenizer = parts.device, parts.tokenizer
        self.max_seq_len = parts.max_seq_len
        trained = parts.trained
        self.model, self.whole_model = trained.model, trained.whole_model
        self.optimizer, self.reference = trained.optimizer, trained.reference
        self.base_checksum = trained.base_checksum
        self.engine, self.update_settings = parts.engine, parts.update_settings
        self.runner, self.plan, self.source = parts.runner, parts.plan, parts.source
        # rejected batches in a row (failed; without learning signal), and those with a
        # rollout since the latest version: a stop's checkpoint keeps them (`save`)
        rejections = state.get("rejections", {})
        self._consecutive_failures = rejections.get("failures", 0)
        self._consecutive_filtered = rejections.get("filtered", 0)
        self.rejected_since_version = rejections.get("since_version", 0)

    def _cancelled(self) -> bool:
        return bool(self.hooks.should_stop and self.hooks.should_stop())

    # ----------------------------------------------------------------- the loop
    def train(self) -> StopReason:
        """Run until `config.steps` optimizer steps are done, `should_stop`, or stalled: one
        loop for every pipeline mode, each batch from the source. A stop between two updates
        of a batch resumes inside that batch; a cancel that arrives while the trainer waits
        (for a batch, or for the generation gate) stops the run there, the batch whose step it
        interrupted kept for the resumed run (`RolloutSource.consumed`)."""
        reason = StopReason.DONE
        self.source.open()
        try:
            while self.step_index < self.config.steps:
                if (reason := self.stop_reason() or reason) is not StopReason.DONE:
                    break
                self.consume(*self.source.next(self.step_index))
            self.source.settle()
        except (BatchCancelled, GateWaitCancelled):
            reason = StopReason.STOPPED
        finally:
            self.source.close()
            self.runner.close()
        self.save()
        return reason

    def next_batch(self) -> dict[str, list[str]]:  # a step's prompts, drawn outside `train`
        self.source.batches_drawn += 1
        return self.plan.at(self.source.batches_drawn - 1)

    def step(self, batch: dict[str, list[str]] | None = None) -> StepRecord:
        """One synchronous rollout batch (the next one, or `batch`): either an optimizer step
        (version + 1) or a recorded rejection."""
        if not isinstance(self.source, SyncSource):
            raise RuntimeError(f"step() is synchronous; a {self.config.pipeline} run uses train()")
        return self.consume(*self.source.next(self.step_index, batch))

    def consume(
        self, result: RolloutResult | RewardError, fresh: bool, timings: dict[str, float]
    ) -> StepRecord:
        """Train on a produced rollout (or record why it cannot be)."""
        if isinstance(result, RewardError):
            return self._reject(getattr(result, "rollout", None), [str(result)], {})
        check_policy_lag(result.policy_version, self.version, self.config.max_policy_lag)
        screened = screen_groups(result, self.config.reject_scope)
        if screened.rejected_all:
            return self._reject(result, screened.reasons, timings, screened.rejected)
        return self._optimise(result, screened.rejected, fresh, screened.reasons, timings)

    def _optimise(self, rollout, rejected, fresh, reasons, timings) -> StepRecord:
        cfg, g = self.config, rollout.group_size
        rewards = torch.tensor(rollout.rewards).view(-1, g)
        zero_var = zero_variance_groups(rewards)
        rows = trainable_rows(zero_var, rejected, g, cfg.drop_zero_variance_groups)
        metrics = rollout_metrics(rollout, rewards, zero_var, fresh, timings["generate_s"])
        if not rows:
            reasons = [*reasons, *screen.untrained_reasons(rollout)]
            return self._reject(rollout, reasons, {**timings, **metrics}, rejected, failure=False)
        start = time.perf_counter()
        # Only trainable samples are scored: the others have no weight in the loss. The
        # train/infer mismatch is therefore measured on the samples trained on.
        old = self.source.known_proximal(rollout, fresh)
        flat_advantages, samples = step_samples(rollout, rewards, rows, old, self.version, cfg)
        with self._training_phase():
            update, grad_norm = self._backward(samples)
            stepped = update.finite and math.isfinite(grad_norm)
            if not stepped:
                self.optimizer.zero_grad(set_to_none=True)
                why = f"non_finite: loss {update.loss} / gradient norm {grad_norm}; step not taken"
                return self._reject(rollout, [*reasons, why], {**timings, **metrics}, rejected)
            if fresh and rollout.policy_version == self.version:
                self.source.keep_proximal(rollout, dict(zip(rows, update.logprobs, strict=True)))
                metrics.update(mismatch_metrics(rollout, rows, update.logprobs))
            if cfg.pipeline != "sync" or rollout.policy_version != self.version:
                metrics.update(lag_metrics(rollout, rows, self.version))
                metrics.update(kv_mixture_metrics(rollout, rows, update.logprobs, self.version))
            metrics.update(update_metrics(update, grad_norm, self.optimizer.param_groups[0]["lr"]))
            timings["train_s"] = time.perf_counter() - start
            version = self._publish_next_version(metrics, timings)
        self._consecutive_failures = self._consecutive_filtered = 0
        self.rejected_since_version = 0
        trained = dict(zip(rows, update.logprobs, strict=True))
        records = dict(zip(rows, update.token_records, strict=True))
        record = StepRecord(
            step=self.step_index - 1,
            rollout=rollout,
            version=version,
            reasons=reasons,
            rejected_groups=rejected,
            advantages=flat_advantages,
            trainer_logprobs=[trained.get(i) for i in range(rollout.num_samples)],
            loss_records=[records.get(i) for i in range(rollout.num_samples)],
            metrics={**metrics, **timings},
        )
        self._emit(record)
        if (cfg.keep_last or cfg.keep_every) and self.writes_files:
            span = cfg.sample_version_span
            prune_checkpoints(self.output_dir, cfg.keep_last, cfg.keep_every, span)
        return record

    def _training_phase(self):
        """The engine's KV memory goes to activations and optimizer state while the trainer
        computes (unless configured otherwise, or pipelined: the engine is generating)."""
        if self.config.release_kv_during_training and self.config.pipeline == "sync":
            return self.engine.kv_released()
        return contextlib.nullcontext()

    def _backward(self, samples: list[TrainSample]) -> tuple[UpdateResult, float]:
        """The step's gradients (accumulated over micro-batches) and their clipped norm. The
        policy is in training mode for its forwards only when no engine serves it meanwhile
        (pipelined: never; its modules are the engine's)."""
        self.optimizer.zero_grad(set_to_none=True)
        cfg, served = self.config, self.config.pipeline != "sync"
        settings, reference = self.update_settings, self.reference
        with contextlib.nullcontext() if served else training_mode(self.model):
            if self.ranks is not None:  # this rank's share, the gradients summed over ranks
                share = rank_share(samples, cfg.group_size, self.ranks.rank, self.ranks.world_size)
                update = distributed_backward(self.model, share, settings, reference)
                return update, clip_gradients(self.model, cfg.max_grad_norm)
            update = accumulate_gradients(self.model, samples, settings, reference)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        return update, float(norm)

    def _publish_next_version(self, metrics: dict[str, float], timings) -> VersionRecord:
        """version + 1: the optimizer step written through the source's weight channel (the
        only place weights change), whose acknowledgement must match the trainer's weights.
        `one_step`: the next batch's generation ends first."""
        start = time.perf_counter()
        self.source.before_update()
        timings["wait_s"] = time.perf_counter() - start
        start = time.perf_counter()
        channel = self.source.channel
        try:
            with channel.writing(self.version + 1):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        except WeightSyncError as exc:
            raise TrainingError(str(exc)) from exc
        self.source.consumed()
        parent, self.version = self.version, self.version + 1
        self.step_index += 1
        checksum = channel.checksum_of_record(self.version)
        timings["sync_s"] = time.perf_counter() - start
        checkpoint = None
        every = self.config.checkpoint_every
        if every and self.version % every == 0:
            checkpoint = str(self.save())
        return VersionRecord(self.version, parent, checksum, {**metrics, **timings}, checkpoint)

    def _reject(self, rollout, reasons, metrics, rejected=None, failure=True) -> StepRecord:
        """Record a batch that is never trained on. Too many failed batches in a row stop the
        run with an error; too many without any learning signal end it (`stalled`)."""
        record = StepRecord(
            step=self.step_index,
            rollout=rollout,
            version=None,
            reasons=list(reasons),
            rejected_groups=dict(rejected or {}),
            metrics=dict(metrics),
        )
        self._emit(record)
        self.source.consumed()
        self.rejected_since_version += rollout is not None
        limit = self.config.max_consecutive_rejections
        if failure:
            self._consecutive_failures += 1
            if self._consecutive_failures > limit:
                raise TrainingError(
                    f"{self._consecutive_failures} consecutive rejected batches; last: "
                    + "; ".join(reasons[:3])
                )
        else:
            self._consecutive_filtered += 1
        return record

    def _emit(self, record: StepRecord) -> None:
        if self.hooks.on_step:
            self.hooks.on_step(record)

    def stop_reason(self) -> StopReason | None:
        """Why the run stops before its next batch: stalled (no batch has had reward variance
        for a while: nothing left to learn from) or asked to; None: it goes on."""
        if self._consecutive_filtered > self.config.max_consecutive_rejections:
            return StopReason.STALLED
        asked = self._cancelled()
        if self.ranks is not None:  # every rank stops at the same step
            asked = rank0_decides(asked)
        return StopReason.STOPPED if asked else None

    def save(self) -> Path:
        """Checkpoint the current version with its source's state: the rollout the next update
        uses when there is one (pipelined: produced ahead and verified; else between two
        updates of one batch), so a resumed run continues exactly; and the rejected batches
        since the version, which the stored rows keep (`workers.training.reconcile`)."""
        state = self.source.state()
        pending = state.pop("pending", None)
        state["base_checksum"] = self.base_checksum  # LoRA's, verified on resume
        state["rejections"] = {
            "failures": self._consecutive_failures,
            "filtered": self._consecutive_filtered,
            "since_version": self.rejected_since_version,
        }
        sharded = None  # FSDP2: every rank writes its shards (`ranks.state`)
        if is_sharded(self.model):
            sharded = functools.partial(save_sharded_state, self.model, self.optimizer)
        if not self.writes_files:
            if sharded is not None:
                sharded(None)  # into rank 0's staging directory
            return checkpoint_dir(self.output_dir, self.version)
        return save_checkpoint(
            self.output_dir,
            self.model,
            self.optimizer,
            self.version,
            self.step_index,
            self.config.model,
            state,
            pending,
            self.hooks.checkpoint_writer,
            sharded,
        )

    @property
    def writes_files(self) -> bool:
        """Whether this process writes the job's checkpoints (one rank does)."""
        return self.ranks is None or self.ranks.rank == 0

    def stats(self) -> dict[str, Any]:
        return {"version": self.version, "step": self.step_index, **self.engine.stats()}
