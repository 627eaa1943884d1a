"""Evaluate and compare jobs: generate on a prompt set with saved versions, store the samples
(stamped with the evaluated version) and the metrics (a version row of the evaluation job)
together, so a version row means its samples are stored (a redelivered job skips it). And a
train job's held-out accuracy (`HeldoutEval`, settings in `workers.specs.heldout_settings`)."""

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core_engine.rl.demo_policy import HELDOUT_SEED  # problems its warm-up never trains on
from core_engine.rl.evaluate import evaluate
from core_engine.rl.rewards import resolve_reward
from core_engine.rl.tasks import default_reward, prompt_records
from core_engine.task import SamplingParams
from db import JobInfo, PolicyMetrics, PolicyVersionRecord, Repository
from workers.control import JobControl, Outcome
from workers.engines import engine_cache, resolve_model, saved_version
from workers.records import sample_records, split_batch
from workers.settings import Settings
from workers.specs import EvalSettings, HeldoutSettings, compare_spec, evaluate_spec


@dataclass(frozen=True)
class Target:
    """A saved policy: its checkpoint directory, version and recorded checksum (if any)."""

    checkpoint: str
    version: int
    checksum: str | None = None


def source_version(repo: Repository, job_id: int, version: int) -> Target:
    """A recorded version of a (training) job, with its checkpoint still on disk."""
    info = saved_version(repo, job_id, version)
    return Target(info.checkpoint_path, version, info.weights_checksum)


def evaluate_target(
    repo: Repository,
    job_id: int,
    target: Target,
    settings: EvalSettings,
    worker: Settings,
    step: int,
    fence: int,
) -> None:
    """Generate with ``target`` on the prompt set and store the samples (as batches of
    ``step``) with the version's evaluation record, in one transaction."""
    engine, checksum = engine_cache(worker).verified(
        target.checkpoint, target.version, target.checksum
    )
    params = settings.sampling_params()
    reward = resolve_reward(settings.reward or default_reward(settings.task))
    records = prompt_records(settings.task, settings.data, settings.num_prompts, settings.seed)
    result = evaluate(engine, records[: settings.num_prompts], reward, params, settings.seed)
    samples = sample_records(result.rollout, result.rewards)
    metrics = PolicyMetrics(
        reward_mean=result.mean_reward,
        reward_std=statistics.pstdev(result.rewards) if result.rewards else None,
        extra={"num_prompts": float(len(result.rewards))},
    )
    repo.record_step(
        split_batch(job_id, target.version, step, samples, []),
        PolicyVersionRecord(job_id, target.version, None, target.checkpoint, checksum, metrics),
        fence=fence,
    )


def run_evaluate(
    repo: Repository, job: JobInfo, settings: Settings, control: JobControl
) -> Outcome:
    spec = evaluate_spec(job.config)
    if spec.model is not None:
        target = Target(resolve_model(spec.model), 0)
    else:
        target = source_version(repo, spec.job_id, spec.version)
    if repo.get_version(job.id, target.version) is None:
        control.report(0, 1)
        evaluate_target(repo, job.id, target, spec.eval, settings, 0, control.fence)
    control.report(1, 1, version=target.version)
    return Outcome("succeeded")


def run_compare(repo: Repository, job: JobInfo, settings: Settings, control: JobControl) -> Outcome:
    """Both versions on the same prompts with the same seeds, the older first; view them side
    by side with ``Repository.compare_versions(compare_job_id, version_a, version_b)``."""
    spec = compare_spec(job.config)
    targets = [source_version(repo, spec.job_id, version) for version in sorted(spec.versions)]
    for step, target in enumerate(targets):
        if repo.get_version(job.id, target.version) is not None:
            continue  # done by an earlier attempt
        control.report(step, len(targets))
        if control.should_stop():
            return control.stopped()
        evaluate_target(repo, job.id, target, spec.eval, settings, step, control.fence)
    control.report(len(targets), len(targets))
    return Outcome("succeeded")


class HeldoutEval:
    """The job's held-out prompts and their greedy accuracy: the task's own reward (never a
    job's custom reward: accuracy is the task's measure, and no user code runs here). Prompts
    never drawn for training come first; a task with few distinct prompts (``always7``) has to
    reuse training ones."""

    def __init__(
        self,
        task: str,
        settings: HeldoutSettings,
        max_tokens: int,
        train_records: Sequence[Mapping[str, str]],
    ) -> None:
        count = settings.prompts
        seen = {(r.get("instruction", ""), r.get("input", "")) for r in train_records}
        drawn = prompt_records(task, None, 2 * count, HELDOUT_SEED)
        unseen = [r for r in drawn if (r.get("instruction", ""), r.get("input", "")) not in seen]
        self.records = (unseen + [r for r in drawn if r not in unseen])[:count]
        self.settings = settings
        self.task = task
        self.max_tokens = max_tokens

    def accuracy(self, engine: Any) -> float:
        """Mean task reward of the engine's greedy answers (its current, acknowledged
        weights)."""
        reward = resolve_reward(default_reward(self.task))
        params = SamplingParams(temperature=0, max_tokens=self.max_tokens)
        return evaluate(engine, self.records, reward, params).mean_reward
