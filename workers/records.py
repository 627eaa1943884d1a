"""Trainer and evaluation results -> the storage records of `db` (pure conversions)."""

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from core_engine.rl.objective.loss import SampleLossRecord
from core_engine.rl.rollout import RawRollout
from core_engine.rl.trainer.records import StepRecord
from db import (
    METRIC_TYPES,
    BatchRecord,
    BatchStatus,
    FinishReason,
    LossFlag,
    PolicyMetrics,
    SampleRecord,
)

# The trainer's key of each recorded metric (`db.METRIC_TYPES`' floats) where the names differ.
_TRAINER_KEYS = {"train_infer_mismatch": "mismatch_max", "tokens_per_second": "tokens_per_s"}
_RECORDED_METRICS = {
    _TRAINER_KEYS.get(name, name): name for name, kind in METRIC_TYPES.items() if kind is float
}


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def sample_records(
    rollout: RawRollout,
    rewards: Sequence[float] | None = None,
    advantages: Sequence[float] | None = None,
    prompt_offset: int = 0,
    trainer_logprobs: Sequence[Sequence[float] | None] | None = None,
    loss_records: Sequence[SampleLossRecord | None] | None = None,
) -> list[SampleRecord]:
    """One record per sample: prompt ``prompt_offset + i // G``, sample ``i % G`` of its group;
    ``trainer_logprobs`` and ``loss_records`` (per sample, None where not trained) as the
    trainer scored them and what its loss did; the rank that generated it (``rollout.ranks``;
    none listed: one rank, 0)."""
    records = []
    for i in range(rollout.num_samples):
        group = rollout.group_of(i)
        error = rollout.errors[i]
        loss = _loss_columns(None if loss_records is None else loss_records[i])
        records.append(
            SampleRecord(
                prompt_index=prompt_offset + group,
                group_index=i % rollout.group_size,
                policy_version=rollout.sample_version(i),
                prompt_text=rollout.prompts[group],
                prompt_messages=rollout.messages[group],
                reference_output=rollout.references[group],
                response_text=rollout.completions[i],
                response_token_ids=rollout.response_ids[i],
                behaviour_logprobs=rollout.behaviour_logprobs[i],
                temperature_logprobs=rollout.temp_logprobs[i],
                trainer_logprobs=None if trainer_logprobs is None else trainer_logprobs[i],
                finish_reason=rollout.finish_reasons[i],
                error_code=None if error is None else error.code.value,
                error_message=None if error is None else error.message,
                reward=None if rewards is None else _finite(rewards[i]),
                advantage=None if advantages is None else _finite(advantages[i]),
                cached_prompt_tokens=rollout.cached_prompt_tokens[i],
                seed=rollout.seeds[i],
                reward_components=_components(rollout, i),
                token_versions=_token_versions(rollout, i),
                resumed_at=(rollout.resumed_at[i] or None) if rollout.resumed_at else None,
                segments=rollout.segments[i] if rollout.segments else None,
                episode_finish=rollout.episode_finishes[i] if rollout.episode_finishes else None,
                rank=rollout.ranks[i] if rollout.ranks else 0,
                **loss,
            )
        )
    return records


def _loss_columns(record: SampleLossRecord | None) -> dict[str, list | None]:
    """A sample's loss record as `SampleRecord`'s three arrays (None: not trained)."""
    if record is None:
        return {"loss_ratios": None, "loss_weights": None, "loss_flags": None}
    bits = zip(record.trained, record.corrected, record.clipped, strict=True)
    return {
        "loss_ratios": record.ratios,
        "loss_weights": record.weights,
        "loss_flags": [LossFlag.of(*token) for token in bits],
    }


def _components(rollout: RawRollout, sample: int) -> dict[str, float] | None:
    """Sample ``sample``'s score of each of the job's rewards (None: one reward)."""
    parts = getattr(rollout, "reward_components", None)
    return {name: values[sample] for name, values in parts.items()} if parts else None


def _token_versions(rollout: RawRollout, sample: int) -> list[list[int]] | None:
    """Sample ``sample``'s version runs when several versions sampled it (None: one)."""
    runs = rollout.token_versions[sample] if rollout.token_versions else None
    return [list(run) for run in runs] if runs and len(runs) > 1 else None


def untrainable(sample: SampleRecord) -> str | None:
    """Why a sample may not be part of an accepted batch (None: it may)."""
    if FinishReason(sample.finish_reason).is_failure:
        return f"{sample.finish_reason}/{sample.error_code}: {sample.error_message}"
    if not sample.response_token_ids:
        return "empty response"
    if sample.reward is None:
        return "no reward"
    return None


def split_batch(
    job_id: int, version: int, step: int, samples: Sequence[SampleRecord], reasons: Sequence[str]
) -> list[BatchRecord]:
    """An accepted batch of the trainable groups and, if any group is not trainable (a
    group-scoped rejection), a rejected batch of the same step with those groups."""
    bad = {}
    for s in samples:
        why = untrainable(s)
        if why is not None:
            bad.setdefault(s.prompt_index, f"prompt {s.prompt_index}: {why}")
    good = [s for s in samples if s.prompt_index not in bad]
    failed = [s for s in samples if s.prompt_index in bad]
    batches = []
    if good:
        batches.append(BatchRecord(job_id, version, step, BatchStatus.ACCEPTED, good))
    if failed:
        why = list(reasons) or list(bad.values())
        failed = [replace(s, advantage=None) for s in failed]
        batches.append(BatchRecord(job_id, version, step, BatchStatus.REJECTED, failed, why))
    return batches


def trainer_batches(job_id: int, version: int, step: StepRecord) -> list[BatchRecord]:
    """The storage batches of one trainer step, as the trainer decided it: an accepted step
    gives an accepted batch of its trained groups plus a rejected batch of its rejected groups;
    a rejected step one rejected batch (none if it has no rollout to store)."""
    if step.rollout is None:
        return []
    samples = sample_records(
        step.rollout,
        getattr(step.rollout, "rewards", None) or None,
        step.advantages,
        trainer_logprobs=step.trainer_logprobs,
        loss_records=step.loss_records,
    )
    if step.version is None:
        reasons = list(step.reasons) or ["rejected"]
        return [BatchRecord(job_id, version, step.step, BatchStatus.REJECTED, samples, reasons)]
    group = step.rollout.group_of
    good = [s for i, s in enumerate(samples) if group(i) not in step.rejected_groups]
    bad = [
        replace(s, advantage=None)
        for i, s in enumerate(samples)
        if group(i) in step.rejected_groups
    ]
    batches = [BatchRecord(job_id, version, step.step, BatchStatus.ACCEPTED, good)]
    if bad:
        reasons = [why for _, why in sorted(step.rejected_groups.items())]
        batches.append(BatchRecord(job_id, version, step.step, BatchStatus.REJECTED, bad, reasons))
    return batches


def policy_metrics(
    metrics: Mapping[str, object], num_accepted: int | None, num_rejected: int | None
) -> PolicyMetrics:
    """The trainer's metrics of a version: the named ones, every other number in ``extra``."""
    named = {field: _finite(metrics.get(key)) for key, field in _RECORDED_METRICS.items()}
    extra = {
        key: value
        for key, value in ((k, _finite(v)) for k, v in metrics.items())
        if key not in _RECORDED_METRICS and value is not None
    }
    return PolicyMetrics(**named, num_accepted=num_accepted, num_rejected=num_rejected, extra=extra)
