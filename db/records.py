"""The plain, frozen data types of the repository API: inputs (``*Record``, `SampleFilter`)
and results. No ORM object ever leaves `db`.

Per-token arrays are plain Python lists: token ids are int32, log-probs float32.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, get_args, get_type_hints

from db.enums import BatchStatus, FinishReason, JobKind, JobStatus

# --- inputs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyMetrics:
    """Metrics of the optimizer step that produced a policy version (all optional).

    ``num_accepted`` / ``num_rejected`` count the rollout batches (or groups) accepted and
    rejected while producing the version; ``extra`` holds any further scalar metrics.
    """

    reward_mean: float | None = None
    reward_std: float | None = None
    loss: float | None = None
    kl: float | None = None
    train_infer_mismatch: float | None = None
    num_accepted: int | None = None
    num_rejected: int | None = None
    tokens_per_second: float | None = None
    extra: Mapping[str, float] = field(default_factory=dict)


# Each named metric (a nullable column of ``policy_versions``, see `db.models`) and its type:
# float, or int for the counts. A new metric is a field above (and a migration).
METRIC_TYPES: dict[str, type] = {
    f.name: int if int in get_args(get_type_hints(PolicyMetrics)[f.name]) else float
    for f in fields(PolicyMetrics)
    if f.name != "extra"
}


@dataclass(frozen=True)
class PolicyVersionRecord:
    """A new policy version of a job: greater than every version the job already has.

    ``parent_version`` (the version it was trained from) must be a recorded version of the job.
    """

    job_id: int
    version: int
    parent_version: int | None = None
    checkpoint_path: str | None = None
    weights_checksum: str | None = None
    metrics: PolicyMetrics = field(default_factory=PolicyMetrics)


@dataclass(frozen=True)
class SampleRecord:
    """One generated response, stamped with the policy version that generated it.

    ``error_code`` is required exactly when ``finish_reason`` is ``abort`` or ``error``.
    ``behaviour_logprobs`` (and ``temperature_logprobs`` and ``trainer_logprobs``, if given)
    have one entry per response token. ``trainer_logprobs`` are the trainer's log-probs at
    training time, for a sample trained on. ``reward`` and ``advantage`` must be finite or None;
    ``reward_components`` (a job with several rewards): each reward's finite score by name.
    ``token_versions`` (a weight update landed while it was generated): the version of its
    tokens as runs ``[[version, count], ...]``, increasing versions, counts summing to the
    response length, the first run's version being ``policy_version`` (its oldest token's);
    None or one run: every token is of ``policy_version`` (stored as None). ``resumed_at``: the
    response indexes at which it resumed after a preemption (the K/V of every earlier position
    recomputed there by that token's version), increasing, each in 1 .. its length.
    A multi-turn episode also has ``segments``: its response's turns and observations in
    order, ``{"role", "start", "end", "text", ...}`` covering the response exactly (role
    ``assistant``: sampled tokens, trained; any other: the template's tokens between turns,
    never trained), and ``episode_finish`` (``done``, ``max_turns``, ``context_exceeded``,
    ``tool_parse_error``, ``env_error``, ``env_timeout`` or ``error``). ``rank``: the rank of
    the job's ranks (one per device) that generated it, 0 for one device; None: not recorded.
    A trained sample's loss record, per token, all three or none: ``loss_ratios`` (the ratio
    used), ``loss_weights`` (behaviour weight: 1 uncorrected), ``loss_flags`` (`LossFlag`).
    """

    prompt_index: int
    group_index: int
    policy_version: int
    prompt_text: str
    response_text: str
    response_token_ids: Sequence[int]
    behaviour_logprobs: Sequence[float]
    finish_reason: FinishReason | str
    prompt_messages: list[dict[str, Any]] | None = None
    reference_output: str | None = None
    temperature_logprobs: Sequence[float] | None = None
    trainer_logprobs: Sequence[float] | None = None
    reward: float | None = None
    advantage: float | None = None
    error_code: str | None = None
    error_message: str | None = None
    cached_prompt_tokens: int = 0
    seed: int | None = None
    reward_components: Mapping[str, float] | None = None
    token_versions: Sequence[Sequence[int]] | None = None
    resumed_at: Sequence[int] | None = None
    segments: Sequence[Mapping[str, Any]] | None = None
    episode_finish: str | None = None
    rank: int | None = None
    loss_ratios: Sequence[float] | None = None
    loss_weights: Sequence[float] | None = None
    loss_flags: Sequence[int] | None = None


@dataclass(frozen=True)
class BatchRecord:
    """A rollout batch with all its samples, written in one transaction.

    ``policy_version`` is the trainer's version when the batch was assembled; no sample may
    come from a later version. A ``rejected`` batch needs at least one reason. An
    ``accepted`` batch (trained on) may not contain an ``abort``/``error`` sample, an empty
    response or a missing reward.
    """

    job_id: int
    policy_version: int
    step: int
    status: BatchStatus | str
    samples: Sequence[SampleRecord]
    rejection_reasons: Sequence[str] = ()


@dataclass(frozen=True)
class SampleFilter:
    """Filters of `Repository.list_samples`; None means "any". Ranges are inclusive.

    ``text`` is a case-insensitive substring of the prompt or the response; ``batch_id``
    keeps the samples of one rollout batch of the job; ``min_logprob_gap`` keeps trained
    samples with a trained token whose |trainer - behaviour| log-prob (|log ratio|) is at least
    that; ``component`` with ``min_component`` keeps samples whose score for that reward
    of the job's list (`reward_components`) is at least that.
    """

    job_id: int
    min_version: int | None = None
    max_version: int | None = None
    finish_reason: FinishReason | str | None = None
    error_code: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    batch_status: BatchStatus | str | None = None
    text: str | None = None
    batch_id: int | None = None
    min_logprob_gap: float | None = None
    component: str | None = None
    min_component: float | None = None


# --- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobInfo:
    id: int
    kind: JobKind
    status: JobStatus
    config: dict[str, Any]
    step: int
    total_steps: int | None
    current_version: int | None
    error: str | None
    celery_task_id: str | None
    attempts: int
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    fence: int = 0
    heartbeat_at: datetime | None = None
    phase: str | None = None
    base_checksum: str | None = None  # a LoRA job's base checkpoint, recorded once
    study_id: int | None = None
    study_point: dict[str, Any] | None = None  # the varied fields' values (a study's job)
    study_trial: int | None = None  # its Optuna trial's number


@dataclass(frozen=True)
class PolicyVersionInfo:
    job_id: int
    version: int
    parent_version: int | None
    checkpoint_path: str | None
    weights_checksum: str | None
    metrics: PolicyMetrics
    created_at: datetime


@dataclass(frozen=True)
class BatchInfo:
    id: int
    job_id: int
    policy_version: int
    step: int
    status: BatchStatus
    rejection_reasons: list[str]
    num_samples: int
    created_at: datetime


@dataclass(frozen=True)
class StepInfo:
    """What `Repository.record_step` stored: its batches (in order), the version made if any."""

    batches: list[BatchInfo]
    version: PolicyVersionInfo | None


@dataclass(frozen=True)
class SampleSummary:
    """A sample without its per-token arrays, for lists."""

    id: int
    job_id: int
    batch_id: int
    batch_status: BatchStatus
    policy_version: int
    prompt_index: int
    group_index: int
    prompt_text: str
    response_text: str
    response_length: int
    finish_reason: FinishReason
    error_code: str | None
    reward: float | None
    advantage: float | None
    prompt_messages: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class SampleDetail:
    """Everything stored about one sample."""

    id: int
    job_id: int
    batch_id: int
    batch_status: BatchStatus
    policy_version: int
    prompt_index: int
    group_index: int
    prompt_text: str
    prompt_messages: list[dict[str, Any]] | None
    reference_output: str | None
    response_text: str
    response_token_ids: list[int]
    behaviour_logprobs: list[float]
    temperature_logprobs: list[float] | None
    finish_reason: FinishReason
    error_code: str | None
    error_message: str | None
    reward: float | None
    advantage: float | None
    cached_prompt_tokens: int
    seed: int | None
    trainer_logprobs: list[float] | None = None
    reward_components: dict[str, float] | None = None
    token_versions: list[list[int]] | None = None  # None: every token is of policy_version
    resumed_at: list[int] | None = None  # None: never preempted after its first token
    segments: list[dict[str, Any]] | None = None  # a multi-turn episode's (`SampleRecord`)
    episode_finish: str | None = None
    turns: int | None = None
    tool_errors: int | None = None
    rank: int | None = None  # the rank that generated it (`SampleRecord`); None: not recorded
    # the loss record (`SampleRecord`); None: not trained, or stored before it was recorded
    loss_ratios: list[float] | None = None
    loss_weights: list[float] | None = None
    loss_flags: list[int] | None = None

    @property
    def sampled_tokens(self) -> list[bool]:
        """Which response tokens the policy sampled: all of a single turn; an episode's
        assistant turns (its observations are the chat template's tokens: never trained,
        nothing to re-score)."""
        if not self.segments:
            return [True] * len(self.response_token_ids)
        sampled = [False] * len(self.response_token_ids)
        for part in self.segments:
            if part["role"] == "assistant":
                sampled[part["start"] : part["end"]] = [True] * (part["end"] - part["start"])
        return sampled

    @property
    def version_runs(self) -> list[list[int]]:
        """``[[version, count], ...]`` of the response's tokens (one run, or none for an
        empty response, when they are all of ``policy_version``)."""
        if self.token_versions:
            return [list(run) for run in self.token_versions]
        length = len(self.response_token_ids)
        return [[self.policy_version, length]] if length else []


@dataclass(frozen=True)
class SamplePage:
    """One page of samples; pass ``next_cursor`` back to get the next page (None: last page).
    The cursor is an opaque string. ``searched``: the samples a text search read when it
    stopped at its bound before filling the page (the next page searches on); else None."""

    items: list[SampleSummary]
    next_cursor: str | None
    searched: int | None = None


@dataclass(frozen=True)
class VersionMetrics:
    """What is known about one policy version of a job.

    ``recorded`` holds the trainer's metrics if the version was recorded in this job (an
    evaluation job stores samples of versions trained elsewhere); the rest is aggregated
    from the job's stored batches and samples of that version.
    """

    version: int
    recorded: PolicyVersionInfo | None
    num_samples: int
    num_accepted_batches: int
    num_rejected_batches: int
    sample_reward_mean: float | None
    mean_response_length: float | None
    finish_reasons: dict[FinishReason, int]


@dataclass(frozen=True)
class PromptComparison:
    """The samples two versions produced for the same prompt, each in group order."""

    prompt_index: int
    prompt_text: str
    samples_a: list[SampleSummary]
    samples_b: list[SampleSummary]


@dataclass(frozen=True)
class RunMetric:
    """One metric of one job over its recorded versions, oldest first: each version, the
    seconds from the job's first version to it (wall time) and the value (None: not recorded
    at that version)."""

    job_id: int
    versions: list[int]
    seconds: list[float]
    values: list[float | None]
