"""The GRPO loop: generate under the acknowledged version, score, accept or reject, optimise,
publish the next version to the engine and verify its acknowledgement.

Invariants exercised here: versions rise by exactly one per optimizer step; every rollout used
at version v was generated within `max_policy_lag`; a rejected batch never reaches the loss or
the optimizer; generation never starts before the engine acknowledged the trainer's version
with the trainer's checksum.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from core_engine.model import load_model
from core_engine.rl.checkpoint import (
    latest_checkpoint,
    load_optimizer_state,
    read_trainer_state,
    save_checkpoint,
)
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data import collate
from core_engine.rl.loss import group_advantages, grpo_loss, response_logprobs
from core_engine.rl.rewards import RewardError, resolve_reward
from core_engine.rl.rollout import RawRollout, RolloutGenerator, RolloutResult, RolloutRunner
from core_engine.rl.tasks import default_reward
from core_engine.scheduler import EngineConfig, InferenceScheduler
from core_engine.task import SamplingParams
from core_engine.weights import canonical_weights, weights_checksum


class TrainingError(RuntimeError):
    """The run cannot continue (too many rejected batches, a failed weight sync)."""


@dataclass
class BatchRecord:
    """One rollout batch and what became of it (what the queue worker stores)."""

    step: int
    status: str  # "accepted" | "rejected"
    reasons: list[str]
    rollout: RawRollout | None
    advantages: list[float] | None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class VersionRecord:
    version: int
    parent: int
    checksum: str
    metrics: dict[str, float]
    checkpoint: str | None = None


@dataclass
class TrainerHooks:
    on_batch: Callable[[BatchRecord], None] | None = None
    on_version: Callable[[VersionRecord], None] | None = None
    should_stop: Callable[[], bool] | None = None


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
        resume = latest_checkpoint(self.output_dir) if config.resume else None
        state = read_trainer_state(resume) if resume else {"version": 0, "step": 0}
        self.version, self.step_index = state["version"], state["step"]
        torch.manual_seed(config.seed + self.version)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model, local_files_only=True)
        self.model = load_model(resume or config.model, torch.float32, config.device).train()
        # The KL anchor is the starting policy, also when resuming.
        self.reference = (
            load_model(config.model, torch.float32, config.device).eval()
            if config.kl_coef
            else None
        )
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        if resume:
            load_optimizer_state(self.optimizer, resume)
        self.engine = InferenceScheduler(
            copy.deepcopy(self.model).eval(),
            EngineConfig(
                max_batch_size=config.engine_batch_size,
                kv_strategy=config.kv_strategy,
                eos_token_ids=(self.tokenizer.eos_token_id,),
            ),
            self.tokenizer,
            policy_version=self.version,
        )
        params = SamplingParams(
            temperature=config.temperature,
            top_p=config.top_p,
            max_tokens=config.max_tokens,
        )
        generator = RolloutGenerator(self.engine, params, config.group_size, self.tokenizer)
        self.runner = RolloutRunner(
            generator,
            resolve_reward(config.reward or default_reward(config.task)),
            lambda: self.version,
            config.max_policy_lag,
        )
        self.batches_drawn = state.get("batches_drawn", 0)
        self._consecutive_failures = self._consecutive_filtered = 0

    # ----------------------------------------------------------------- the loop
    def train(self) -> list[BatchRecord]:
        """Run until `config.steps` optimizer steps are done (or `should_stop`). Each batch of
        prompts serves `updates_per_batch` steps; after the first, its rollout is reused while
        within `max_policy_lag` versions (`rollout_fresh` = 0), else generated again."""
        history = []
        while self.step_index < self.config.steps:
            batch = self.next_batch()
            for _ in range(self.config.updates_per_batch):
                if self.stalled or (self.hooks.should_stop and self.hooks.should_stop()):
                    self.save()
                    return history
                history.append(self.step(batch))
                if self.step_index >= self.config.steps:
                    break
        self.save()
        return history

    def next_batch(self) -> dict[str, list[str]]:
        """The next prompts: a seeded draw per batch, so a resumed run continues the sequence."""
        order = random.Random(self.config.seed * 1_000_003 + self.batches_drawn)
        self.batches_drawn += 1
        return collate(order.sample(self.records, min(self.config.batch_size, len(self.records))))

    def step(self, batch: dict[str, list[str]] | None = None) -> BatchRecord:
        """One rollout batch: either an optimizer step (version + 1) or a recorded rejection."""
        batch = batch or self.next_batch()
        seed = self.config.seed * 1_000_003 + self.step_index * 10_007
        start = time.perf_counter()
        try:
            result, fresh = self.runner(batch, seed)
        except RewardError as exc:
            return self._reject(getattr(exc, "rollout", None), [str(exc)], {})
        reward_s = self.runner.reward_seconds if fresh else 0.0
        timings = {"generate_s": time.perf_counter() - start - reward_s, "reward_s": reward_s}
        keep, reasons = self._screen(result)
        if not keep:
            return self._reject(result, reasons, timings)
        return self._optimise(result, keep, fresh, reasons, timings)

    def _screen(self, rollout: RolloutResult) -> tuple[list[int], list[str]]:
        """Groups that may be trained on, and why the others may not."""
        bad_groups: dict[int, str] = {}
        for i, (reason, error, ids) in enumerate(
            zip(rollout.finish_reasons, rollout.errors, rollout.response_ids, strict=True)
        ):
            problem = None
            if reason in ("error", "abort"):
                problem = f"sample {i}: {reason}/{error.code.value}: {error.message}"
            elif not ids:
                problem = f"sample {i}: empty response"
            if problem:
                bad_groups.setdefault(rollout.group_of(i), problem)
        groups = range(len(rollout.prompt_ids))
        if bad_groups and self.config.reject_scope == "batch":
            return [], list(bad_groups.values())
        return [g for g in groups if g not in bad_groups], list(bad_groups.values())

    def _optimise(self, rollout, keep, fresh, reasons, timings) -> BatchRecord:
        cfg, g = self.config, rollout.group_size
        rewards = torch.tensor(rollout.rewards).view(-1, g)
        advantages, zero_var = group_advantages(rewards)
        trainable = torch.zeros(len(rewards), dtype=torch.bool)
        trainable[keep] = True
        if cfg.drop_zero_variance_groups:
            trainable &= ~zero_var
        sample_rows = trainable.repeat_interleave(g)
        metrics = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std(unbiased=False)),
            "response_length": sum(map(len, rollout.response_ids)) / rollout.num_samples,
            "zero_variance_groups": int(zero_var.sum()),
            "rollout_version": rollout.policy_version,
            "rollout_fresh": float(fresh),
        }
        metrics["tokens_per_s"] = sum(map(len, rollout.response_ids)) / max(
            timings["generate_s"], 1e-9
        )
        if not bool(sample_rows.any()):
            reasons = [*reasons, "filtered: no trainable group (all have zero reward variance)"]
            return self._reject(rollout, reasons, {**timings, **metrics}, failure=False)
        start = time.perf_counter()
        # Only trainable samples are scored: the others have no weight in the loss. The
        # train/infer mismatch is therefore measured on the samples trained on.
        rows = sample_rows.nonzero().squeeze(1).tolist()
        prompts = [rollout.prompt_ids[rollout.group_of(i)] for i in rows]
        responses = [rollout.response_ids[i] for i in rows]
        logp, mask = response_logprobs(self.model, prompts, responses, rollout.temperature)
        behaviour = torch.zeros_like(logp)
        for j, i in enumerate(rows):
            lp = rollout.temp_logprobs[i]
            behaviour[j, : len(lp)] = torch.tensor(lp, device=logp.device)
        if fresh:
            gap = (logp.detach() - behaviour).abs()[mask]
            metrics["mismatch_mean"] = float(gap.mean())
            metrics["mismatch_max"] = float(gap.max())
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref, _ = response_logprobs(self.reference, prompts, responses, rollout.temperature)
        out = grpo_loss(
            logp,
            behaviour,
            advantages.view(-1)[rows].to(logp.device),
            mask,
            cfg.clip_eps,
            cfg.kl_coef,
            ref,
        )
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        metrics.update(loss=float(out.loss.detach()), kl=out.kl, clip_fraction=out.clip_fraction)
        timings["train_s"] = time.perf_counter() - start
        timings["sync_s"] = self._publish_next_version(metrics)
        self._consecutive_failures = self._consecutive_filtered = 0
        record = BatchRecord(
            self.step_index - 1,
            "accepted",
            reasons,
            rollout,
            advantages.view(-1).tolist(),
            {**metrics, **timings},
        )
        if self.hooks.on_batch:
            self.hooks.on_batch(record)
        return record

    def _publish_next_version(self, metrics: dict[str, float]) -> float:
        """version + 1, pushed to the engine; its ack must match the trainer's weights."""
        start = time.perf_counter()
        parent, self.version = self.version, self.version + 1
        self.step_index += 1
        weights = {k: v.detach() for k, v in canonical_weights(self.model).items()}
        ack = self.engine.update_weights(weights, self.version)
        expected = weights_checksum(weights)
        if ack.version != self.version or ack.checksum != expected:
            raise TrainingError(
                f"weight sync failed: engine acknowledged version {ack.version} "
                f"checksum {ack.checksum[:12]}, trainer has {self.version} {expected[:12]}"
            )
        checkpoint = None
        every = self.config.checkpoint_every
        if every and self.version % every == 0:
            checkpoint = str(self.save())
        if self.hooks.on_version:
            self.hooks.on_version(
                VersionRecord(self.version, parent, expected, dict(metrics), checkpoint)
            )
        return time.perf_counter() - start

    def _reject(self, rollout, reasons, metrics, failure: bool = True) -> BatchRecord:
        """Record a batch that is never trained on. Too many failed batches in a row stop the
        run with an error; too many without any learning signal end it (`stalled`)."""
        record = BatchRecord(self.step_index, "rejected", reasons, rollout, None, dict(metrics))
        if self.hooks.on_batch:
            self.hooks.on_batch(record)
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

    @property
    def stalled(self) -> bool:
        """No batch has had reward variance for a while: nothing left to learn from."""
        return self._consecutive_filtered > self.config.max_consecutive_rejections

    def save(self) -> Path:
        return save_checkpoint(
            self.output_dir,
            self.model,
            self.optimizer,
            self.version,
            self.step_index,
            self.config.model,
            {"batches_drawn": self.batches_drawn},
        )

    def stats(self) -> dict[str, Any]:
        return {"version": self.version, "step": self.step_index, **self.engine.stats()}
