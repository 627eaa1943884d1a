"""The GRPO loop: generate under the acknowledged version, score, accept or reject, optimise,
publish the next version to the engine and verify its acknowledgement.

Invariants exercised here: versions rise by exactly one per optimizer step; every rollout used
at version v was generated within `max_policy_lag`; a rejected batch (or a step whose loss or
gradients are not finite) never reaches the optimizer; generation never starts before the
engine acknowledged the trainer's version with the trainer's checksum. A run stopped anywhere
and resumed from its checkpoint continues exactly as if it had not stopped.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from core_engine.engine import resolve_device
from core_engine.rl.checkpoint import (
    latest_checkpoint,
    load_optimizer_state,
    prune_checkpoints,
    read_pending_rollout,
    read_trainer_state,
    save_checkpoint,
)
from core_engine.rl.colocate import colocated_engine, rollout_runner, update_settings
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data import collate
from core_engine.rl.footprint import check_room_for, return_large_frees_to_the_os
from core_engine.rl.loss import group_advantages
from core_engine.rl.optimizer import build_optimizer
from core_engine.rl.pipeline import Boundary, batch_seed, run_pipelined
from core_engine.rl.policy_weights import kl_reference, load_policy, published_weights
from core_engine.rl.records import StepRecord, StopReason, TrainerHooks, VersionRecord
from core_engine.rl.rewards import RewardError
from core_engine.rl.rollout import (
    RolloutResult,
    check_policy_lag,
    longest_prompt,
    produce_rollout,
)
from core_engine.rl.screen import screen_groups
from core_engine.rl.step_metrics import (
    lag_metrics,
    mismatch_metrics,
    rollout_metrics,
    token_lags,
    update_metrics,
)
from core_engine.rl.update import TrainSample, UpdateResult, accumulate_gradients, training_mode
from core_engine.weights import update_digest, weights_checksum


class TrainingError(RuntimeError):
    """The run cannot continue (too many rejected batches, a failed weight sync)."""


class GRPOTrainer:
    def __init__(
        self,
        config: GRPOConfig,
        records: list[dict[str, str]],
        hooks: TrainerHooks | None = None,
    ) -> None:
        self.config = config
        self.records = records
        self.hooks = hooks or TrainerHooks()
        self.output_dir = Path(config.output_dir)
        self.device = resolve_device(config.device)
        resume = latest_checkpoint(self.output_dir) if config.resume else None
        state = read_trainer_state(resume) if resume else {"version": 0, "step": 0}
        self.version, self.step_index = state["version"], state["step"]
        self.batches_drawn = state.get("batches_drawn", 0)
        self.updates_done = state.get("updates_done", 0)  # of the current batch
        torch.manual_seed(config.seed + self.version)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model, local_files_only=True)
        self.max_seq_len = longest_prompt(self.tokenizer, records) + config.max_tokens
        if self.max_seq_len > config.max_tokens_per_micro_batch:
            raise ValueError(
                f"max_tokens_per_micro_batch={config.max_tokens_per_micro_batch} cannot hold "
                f"the longest sample: prompt + max_tokens = {self.max_seq_len} tokens"
            )
        check_room_for(config, self.device)  # before anything is loaded
        return_large_frees_to_the_os()
        self.model, self.base_checksum = load_policy(config, resume, self.device)
        self.reference = kl_reference(config, self.model, self.device)
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: adapter
        self.optimizer = build_optimizer(
            trainable, config.lr, config.weight_decay, config.optimizer_state_dtype
        )
        if resume:
            load_optimizer_state(self.optimizer, resume)
        self.engine = colocated_engine(
            config, self.model, self.tokenizer, self.max_seq_len, self.version
        )
        self.update_settings = update_settings(config, self.engine)
        self.runner = rollout_runner(config, self.engine, self.tokenizer, lambda: self.version)
        self._old_logprobs: tuple[RolloutResult, dict[int, list[float]]] | None = None
        self.prefetched: RolloutResult | None = None  # pipelined: the next batch's, produced
        self.boundary = Boundary()  # pipelined: set by `run_pipelined`
        self.version_digests: dict[int, str] = {}  # what a rollout process acknowledges
        pending = read_pending_rollout(resume) if resume else None
        if pending is not None and pending.get("prefetched"):
            self.prefetched = RolloutResult.from_json(pending["rollout"])
        elif pending is not None:
            rollout = RolloutResult.from_json(pending["rollout"])
            self.runner.keep(self.batch_at(self.batches_drawn - 1), rollout)
            old = {int(k): v for k, v in pending["old_logprobs"].items()}
            self._old_logprobs = (rollout, old)
        self._consecutive_failures = self._consecutive_filtered = 0

    # ----------------------------------------------------------------- the loop
    def train(self) -> StopReason:
        """Run until `config.steps` optimizer steps are done, `should_stop`, or stalled. Each
        batch of prompts serves `updates_per_batch` steps; after the first, its rollout is
        reused while within `max_policy_lag` versions (`rollout_fresh` = 0), else generated
        again. A stop between two updates of a batch resumes inside that batch."""
        if self.config.pipeline != "sync":
            return run_pipelined(self)
        reason = StopReason.DONE
        while self.step_index < self.config.steps:
            if (reason := self.stop_reason() or reason) is not StopReason.DONE:
                break
            if self.updates_done == 0:
                self.batches_drawn += 1
            self.step(self.batch_at(self.batches_drawn - 1))
            self.updates_done = (self.updates_done + 1) % self.config.updates_per_batch
        self.save()
        return reason

    def batch_at(self, index: int) -> dict[str, list[str]]:
        """Batch `index` of the prompt sequence: a seeded draw, so a resumed run continues it."""
        order = random.Random(self.config.seed * 1_000_003 + index)
        return collate(order.sample(self.records, min(self.config.batch_size, len(self.records))))

    def next_batch(self) -> dict[str, list[str]]:
        """The next batch of prompts, drawn for a step taken outside `train`."""
        self.batches_drawn += 1
        return self.batch_at(self.batches_drawn - 1)

    def step(self, batch: dict[str, list[str]] | None = None) -> StepRecord:
        """One rollout batch: either an optimizer step (version + 1) or a recorded rejection."""
        batch = batch or self.next_batch()
        seed = batch_seed(self.config.seed, self.step_index)  # sync: indexed by step
        return self.consume(*produce_rollout(self.runner, batch, seed))

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
        advantages, zero_var = group_advantages(rewards)
        trainable = torch.ones(len(rewards), dtype=torch.bool)
        trainable[list(rejected)] = False
        if cfg.drop_zero_variance_groups:
            trainable &= ~zero_var
        rows = trainable.repeat_interleave(g).nonzero().squeeze(1).tolist()
        metrics = rollout_metrics(rollout, rewards, zero_var, fresh, timings["generate_s"])
        if not rows:
            reasons = [*reasons, "filtered: no trainable group (all have zero reward variance)"]
            return self._reject(rollout, reasons, {**timings, **metrics}, rejected, failure=False)
        start = time.perf_counter()
        # Only trainable samples are scored: the others have no weight in the loss. The
        # train/infer mismatch is therefore measured on the samples trained on.
        old = self._known_old_logprobs(rollout, fresh)
        flat_advantages = advantages.view(-1)
        pipelined = cfg.pipeline != "sync"
        samples = [
            TrainSample(
                rollout.prompt_ids[rollout.group_of(i)],
                rollout.response_ids[i],
                rollout.temp_logprobs[i],
                float(flat_advantages[i]),
                old.get(i),
                off_policy=pipelined and max(token_lags(rollout, i, self.version), default=0) > 0,
            )
            for i in rows
        ]
        with self._training_phase():
            update, grad_norm = self._backward(samples)
            stepped = update.finite and math.isfinite(grad_norm)
            if stepped and not pipelined:  # pipelined: at the boundary, under the engine's gate
                self.optimizer.step()
            if not (stepped and pipelined):
                self.optimizer.zero_grad(set_to_none=True)
        if not stepped:
            why = f"non_finite: loss {update.loss} / gradient norm {grad_norm}; step not taken"
            return self._reject(rollout, [*reasons, why], {**timings, **metrics}, rejected)
        if fresh and rollout.policy_version == self.version:
            self._old_logprobs = (rollout, dict(zip(rows, update.logprobs, strict=True)))
            metrics.update(mismatch_metrics(rollout, rows, update.logprobs))
        if pipelined or rollout.policy_version != self.version:
            metrics.update(lag_metrics(rollout, rows, self.version))
        metrics.update(update_metrics(update, grad_norm))
        timings["train_s"] = time.perf_counter() - start
        if pipelined:  # one_step: the next batch's generation ends first
            self.boundary.wait()
            timings["wait_s"] = time.perf_counter() - start - timings["train_s"]
        trained = dict(zip(rows, update.logprobs, strict=True))
        version = self._publish_next_version({**metrics, **timings}, timings)
        self._consecutive_failures = self._consecutive_filtered = 0
        record = StepRecord(
            step=self.step_index - 1,
            rollout=rollout,
            version=version,
            reasons=reasons,
            rejected_groups=rejected,
            advantages=flat_advantages.tolist(),
            trainer_logprobs=[trained.get(i) for i in range(rollout.num_samples)],
            metrics={**metrics, **timings},
        )
        self._emit(record)
        if cfg.keep_last or cfg.keep_every:
            prune_checkpoints(self.output_dir, cfg.keep_last, cfg.keep_every)
        return record

    def _training_phase(self):
        """The engine's KV memory is released while the trainer computes (unless configured
        otherwise, or pipelined: the engine is generating): activations and optimizer state
        get it."""
        if self.config.release_kv_during_training and self.config.pipeline == "sync":
            return self.engine.kv_released()
        return contextlib.nullcontext()

    def _backward(self, samples: list[TrainSample]) -> tuple[UpdateResult, float]:
        """The step's gradients (accumulated over micro-batches) and their clipped norm."""
        self.optimizer.zero_grad(set_to_none=True)
        with training_mode(self.model):
            update = accumulate_gradients(self.model, samples, self.update_settings, self.reference)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        return update, float(norm)

    def _known_old_logprobs(self, rollout: RolloutResult, fresh: bool) -> dict[int, list[float]]:
        """The trainer's log-probs at the rollout's version, kept from its first update (none
        for a fresh rollout: they come from this update's own forward)."""
        if fresh or self._old_logprobs is None or self._old_logprobs[0] is not rollout:
            return {}
        return self._old_logprobs[1]

    def _publish_next_version(self, metrics: dict[str, float], timings) -> VersionRecord:
        """version + 1, pushed to the engine (its ack must match the trainer's weights); when
        pipelined, with the optimizer step, between two generation steps (they share tensors)."""
        start = time.perf_counter()
        parent, self.version = self.version, self.version + 1
        self.step_index += 1
        with self.engine.paused(), self.boundary.gate(self.version):
            if self.config.pipeline != "sync":
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            weights = published_weights(self.model, self.engine.model.lm_head.weight.dtype)
            mode = "in_flight" if self.config.pipeline == "in_flight" else "drain"
            ack = self.engine.update_weights(weights, self.version, mode)
        expected = self.version_digests[self.version] = update_digest(weights)
        self.version_digests.pop(self.version - 4, None)  # acks name the last version or two
        if ack.version != self.version or ack.checksum != expected:
            raise TrainingError(
                f"weight sync failed: engine acknowledged version {ack.version} "
                f"checksum {ack.checksum[:12]}, trainer has {self.version} {expected[:12]}"
            )
        # The checksum of record: on a CPU the digest already is the full SHA-256.
        checksum = expected if self.device.type == "cpu" else weights_checksum(weights)
        timings["sync_s"] = time.perf_counter() - start
        checkpoint = None
        every = self.config.checkpoint_every
        if every and self.version % every == 0:
            checkpoint = str(self.save(updates_done=self.updates_done + 1))
        return VersionRecord(self.version, parent, checksum, dict(metrics), checkpoint)

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
        if self.hooks.should_stop and self.hooks.should_stop():
            return StopReason.STOPPED
        return None

    def save(self, updates_done: int | None = None) -> Path:
        """Checkpoint the current version, with the rollout the next update uses when there is
        one (pipelined: produced ahead; else between two updates of one batch), so a resumed
        run continues exactly."""
        done = self.updates_done if updates_done is None else updates_done
        done %= self.config.updates_per_batch
        pending = None
        if self.prefetched is not None:
            pending = {"rollout": self.prefetched.to_json(), "prefetched": True}
        elif done and self.runner.last is not None:
            kept = self._old_logprobs
            old = kept[1] if kept is not None and kept[0] is self.runner.last else {}
            pending = {"rollout": self.runner.last.to_json(), "old_logprobs": old}
        state = {"batches_drawn": self.batches_drawn, "updates_done": done}
        state["base_checksum"] = self.base_checksum  # LoRA's, verified on resume
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
        )

    def stats(self) -> dict[str, Any]:
        return {"version": self.version, "step": self.step_index, **self.engine.stats()}
