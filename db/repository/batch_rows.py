"""Checking batch records before they are written: the column values of their samples."""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from db.arrays import encode_float32, encode_int32
from db.enums import BatchStatus, EpisodeFinish, FinishReason, coerce
from db.errors import InvalidValue
from db.loss_flags import LossFlag
from db.records import BatchRecord, SampleRecord
from db.repository.base import check_finite, check_json, check_non_negative, check_text


@dataclass(frozen=True)
class ValidBatch:
    """A checked batch record: its status and the column values of its samples."""

    record: BatchRecord
    status: BatchStatus
    rows: list[dict[str, Any]]


def _check_array(
    values: Sequence[Any], encode: Callable[[Sequence[Any]], bytes], field: str, length: int
) -> None:
    if len(values) != length:
        raise InvalidValue(f"{field}: {len(values)} values for {length} response tokens")
    try:
        encode(values)
    except InvalidValue as exc:
        raise InvalidValue(f"{field}: {exc}") from None


def logprob_gap_max(sample: SampleRecord) -> float | None:
    """The largest |trainer - behaviour| log-prob over a trained sample's trained tokens (all
    its tokens without a loss record; its behaviour: the temperature-only log-probs the
    trainer's ratio uses, if stored), else None."""
    if not sample.trainer_logprobs:
        return None
    behaviour = sample.temperature_logprobs or sample.behaviour_logprobs
    trained = [True] * len(behaviour)
    if sample.loss_flags is not None:
        trained = [bool(flags & LossFlag.TRAINED) for flags in sample.loss_flags]
    pairs = zip(sample.trainer_logprobs, behaviour, trained, strict=True)
    gap = max((abs(t - b) for t, b, kept in pairs if kept), default=None)
    return gap if gap is not None and math.isfinite(gap) else None


def _check_loss_record(sample: SampleRecord, where: str, length: int) -> None:
    """A trained sample's loss record: all three arrays or none, one entry per response token,
    flags made of `LossFlag` bits."""
    arrays = (sample.loss_ratios, sample.loss_weights, sample.loss_flags)
    if all(values is None for values in arrays):
        return
    if any(values is None for values in arrays):
        raise InvalidValue(f"{where}: loss_ratios, loss_weights and loss_flags go together")
    if sample.trainer_logprobs is None:
        raise InvalidValue(f"{where}.loss_flags: a loss record needs the trainer_logprobs")
    _check_array(sample.loss_ratios, encode_float32, f"{where}.loss_ratios", length)
    _check_array(sample.loss_weights, encode_float32, f"{where}.loss_weights", length)
    _check_array(sample.loss_flags, encode_int32, f"{where}.loss_flags", length)
    every = int(LossFlag.TRAINED | LossFlag.CORRECTED | LossFlag.CLIPPED)
    if not all(_is_count(flags) and flags & ~every == 0 for flags in sample.loss_flags):
        raise InvalidValue(f"{where}.loss_flags: expected LossFlag bits, 0..{every}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# An episode's record: the numbers of `core_engine.rl.episodes.record`, the contract the
# episode runner keeps (db imports no core_engine; tests/db/test_episode_store_contract.py
# checks that they agree).
MAX_SEGMENTS = 1024
MAX_SEGMENT_TEXT = 65_536


def _segments(sample: SampleRecord, where: str) -> list[dict[str, Any]] | None:
    """The episode's checked segments: in order, covering the response exactly (none for an
    episode that ended before its first turn), plain JSON."""
    if sample.segments is None:
        return None
    field = f"{where}.segments"
    parts = [dict(part) for part in sample.segments]
    if len(parts) > MAX_SEGMENTS:
        raise InvalidValue(f"{field}: expected at most {MAX_SEGMENTS} segments")
    end = 0
    for i, part in enumerate(parts):
        role, start, stop = part.get("role"), part.get("start"), part.get("end")
        if not isinstance(role, str) or not (_is_count(start) and _is_count(stop)):
            raise InvalidValue(f"{field}[{i}]: needs a role and whole-number start and end")
        if start != end or stop < start:
            raise InvalidValue(f"{field}[{i}]: starts at {start}, the previous ended at {end}")
        text = str(part.get("text", ""))
        if len(text) > MAX_SEGMENT_TEXT:
            raise InvalidValue(f"{field}[{i}]: text over {MAX_SEGMENT_TEXT} characters")
        check_text(text, f"{field}[{i}].text")
        end = stop
    if end != len(sample.response_token_ids):
        raise InvalidValue(
            f"{field}: cover {end} tokens for {len(sample.response_token_ids)} response tokens"
        )
    check_json(parts, field)
    return parts


def _episode_counts(sample: SampleRecord) -> dict[str, int | None]:
    """An episode's assistant turns and its turns with a tool-call error (None: one turn)."""
    if sample.segments is None:
        return {"turns": None, "tool_errors": None}
    turns = [part for part in sample.segments if part.get("role") == "assistant"]
    return {"turns": len(turns), "tool_errors": sum(bool(p.get("tool_error")) for p in turns)}


def _episode_finish(sample: SampleRecord, where: str) -> str | None:
    finish = sample.episode_finish
    if finish is not None and finish not in set(EpisodeFinish):
        choices = ", ".join(EpisodeFinish)
        raise InvalidValue(f"{where}.episode_finish: {finish!r} is not one of {choices}")
    if finish is not None and sample.segments is None:
        raise InvalidValue(f"{where}.episode_finish: an episode needs its segments")
    return finish


def _resumed_at(sample: SampleRecord, where: str) -> list[int] | None:
    """The sample's checked ``resumed_at``: increasing indexes inside its response."""
    if not sample.resumed_at:
        return None
    indexes = list(sample.resumed_at)
    length = len(sample.response_token_ids)
    if not all(_is_count(i) and 1 <= i <= length for i in indexes):
        raise InvalidValue(f"{where}.resumed_at: expected indexes in 1..{length}")
    if any(later <= earlier for earlier, later in pairwise(indexes)):
        raise InvalidValue(f"{where}.resumed_at: indexes must increase")
    return indexes


def _rank(sample: SampleRecord, where: str) -> int | None:
    """The sample's checked ``rank``: a whole number >= 0, or None (not recorded)."""
    rank = sample.rank
    if rank is not None and not (_is_count(rank) and rank >= 0):
        raise InvalidValue(f"{where}.rank: {rank!r} is not a whole number >= 0")
    return rank


def _token_version_runs(
    sample: SampleRecord, batch: BatchRecord, where: str
) -> list[list[int]] | None:
    """The sample's checked ``token_versions`` as stored: None when every token is of its
    ``policy_version`` (no runs, or one run)."""
    runs = sample.token_versions
    if runs is None:
        return None
    field = f"{where}.token_versions"
    runs = [list(run) for run in runs]
    if not all(len(run) == 2 and all(map(_is_count, run)) for run in runs):
        raise InvalidValue(f"{field}: expected [[version, count], ...] of whole numbers")
    versions = [version for version, _ in runs]
    if runs and versions[0] != sample.policy_version:
        raise InvalidValue(
            f"{field}: the first run's version {versions[0]} is not the sample's "
            f"policy_version {sample.policy_version} (its oldest token's)"
        )
    if any(later <= earlier for earlier, later in pairwise(versions)):
        raise InvalidValue(f"{field}: versions must increase from one run to the next")
    if versions and versions[-1] > batch.policy_version:
        raise InvalidValue(
            f"{field}: version {versions[-1]} is after the batch's {batch.policy_version}"
        )
    if any(count < 1 for _, count in runs):
        raise InvalidValue(f"{field}: every run needs at least one token")
    total, length = sum(count for _, count in runs), len(sample.response_token_ids)
    if total != length:
        raise InvalidValue(f"{field}: {total} tokens in runs for {length} response tokens")
    return runs if len(runs) > 1 else None


def _sample_row(sample: SampleRecord, batch: BatchRecord, where: str) -> dict[str, Any]:
    """Validate one sample of ``batch`` and return its column values."""
    finish = coerce(FinishReason, sample.finish_reason, f"{where}.finish_reason")
    for name in ("prompt_text", "response_text"):
        if not isinstance(getattr(sample, name), str):
            raise InvalidValue(f"{where}.{name}: expected a string")
    if sample.segments is not None:  # an episode's record (its contract: `_segments`)
        for name in ("prompt_text", "response_text"):
            check_text(getattr(sample, name), f"{where}.{name}")
    if finish.is_failure != (sample.error_code is not None):
        need = "requires" if finish.is_failure else "must not have"
        raise InvalidValue(f"{where}: finish_reason {finish.value!r} {need} an error_code")
    if not 0 <= sample.policy_version <= batch.policy_version:
        raise InvalidValue(
            f"{where}.policy_version: {sample.policy_version} is outside "
            f"0..{batch.policy_version} (the batch's version)"
        )
    for name in ("prompt_index", "group_index", "cached_prompt_tokens"):
        check_non_negative(getattr(sample, name), f"{where}.{name}")
    check_finite(sample.reward, f"{where}.reward")
    check_finite(sample.advantage, f"{where}.advantage")
    components = sample.reward_components
    if components is not None:
        if not all(isinstance(name, str) for name in components):
            raise InvalidValue(f"{where}.reward_components: names must be strings")
        for name, value in components.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidValue(f"{where}.reward_components[{name!r}]: expected a number")
            check_finite(value, f"{where}.reward_components[{name!r}]")
    length = len(sample.response_token_ids)
    _check_array(sample.response_token_ids, encode_int32, f"{where}.response_token_ids", length)
    _check_array(sample.behaviour_logprobs, encode_float32, f"{where}.behaviour_logprobs", length)
    if sample.temperature_logprobs is not None:
        _check_array(
            sample.temperature_logprobs, encode_float32, f"{where}.temperature_logprobs", length
        )
    if sample.trainer_logprobs is not None:
        _check_array(sample.trainer_logprobs, encode_float32, f"{where}.trainer_logprobs", length)
    _check_loss_record(sample, where, length)
    if sample.prompt_messages is not None:
        check_json(sample.prompt_messages, f"{where}.prompt_messages")
    return {
        "job_id": batch.job_id,
        "policy_version": sample.policy_version,
        "prompt_index": sample.prompt_index,
        "group_index": sample.group_index,
        "finish_reason": finish,
        "error_code": sample.error_code,
        "reward": sample.reward,
        "advantage": sample.advantage,
        "response_length": length,
        "cached_prompt_tokens": sample.cached_prompt_tokens,
        "seed": sample.seed,
        "prompt_text": sample.prompt_text,
        "response_text": sample.response_text,
        "error_message": sample.error_message,
        "reference_output": sample.reference_output,
        "prompt_messages": sample.prompt_messages,
        "reward_components": None if components is None else dict(components),
        "token_versions": _token_version_runs(sample, batch, where),
        "resumed_at": _resumed_at(sample, where),
        "segments": _segments(sample, where),
        "episode_finish": _episode_finish(sample, where),
        **_episode_counts(sample),
        "rank": _rank(sample, where),
        "response_token_ids": sample.response_token_ids,
        "behaviour_logprobs": sample.behaviour_logprobs,
        "temperature_logprobs": sample.temperature_logprobs,
        "trainer_logprobs": sample.trainer_logprobs,
        "loss_ratios": sample.loss_ratios,
        "loss_weights": sample.loss_weights,
        "loss_flags": sample.loss_flags,
        "logprob_gap_max": logprob_gap_max(sample),
    }


def _why_not_trainable(row: dict[str, Any]) -> str | None:
    if row["finish_reason"].is_failure:
        return f"finish_reason {row['finish_reason'].value!r}"
    if row["response_length"] == 0:
        return "an empty response"
    if row["reward"] is None:
        return "no reward"
    return None


def check_batch(batch: BatchRecord) -> ValidBatch:
    """Validate a batch record (no database needed) and return what `insert_batch` stores."""
    status = coerce(BatchStatus, batch.status, "status")
    check_non_negative(batch.policy_version, "policy_version")
    check_non_negative(batch.step, "step")
    if not batch.samples:
        raise InvalidValue("a batch needs at least one sample")
    reasons = list(batch.rejection_reasons)
    if any(not isinstance(reason, str) or not reason for reason in reasons):
        raise InvalidValue("rejection_reasons: each reason must be a non-empty string")
    if status is BatchStatus.REJECTED and not reasons:
        raise InvalidValue("a rejected batch needs at least one rejection reason")
    if status is BatchStatus.ACCEPTED and reasons:
        raise InvalidValue("an accepted batch has no rejection reasons")
    rows = [_sample_row(sample, batch, f"samples[{i}]") for i, sample in enumerate(batch.samples)]
    if status is BatchStatus.ACCEPTED:
        for i, row in enumerate(rows):
            why = _why_not_trainable(row)
            if why is not None:
                raise InvalidValue(f"samples[{i}]: an accepted batch cannot contain {why}")
    return ValidBatch(batch, status, rows)
