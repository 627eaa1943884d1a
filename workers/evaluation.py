"""Evaluate and compare jobs: generate on a prompt set with saved versions, store the samples
(stamped with the evaluated version) and the metrics (a version row of the evaluation job)
together, so a version row means its samples are stored (a redelivered job skips it). And a
train job's held-out scores (`HeldoutEval`, settings in `workers.specs.heldout_settings`)."""

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.files import Columns, split_heldout
from core_engine.rl.data.tasks import HELDOUT_SEED, default_reward, prompt_records
from core_engine.rl.episodes.runner import EpisodeLimits
from core_engine.rl.rewards import resolve_reward
from core_engine.rl.rewards.mix import RewardMix, RewardSpec
from core_engine.rl.trainer.evaluate import EvalResult, evaluate
from core_engine.task import SamplingParams
from db import JobInfo, PolicyMetrics, PolicyVersionRecord, Repository
from workers.control import JobControl, Outcome
from workers.engines import engine_cache, saved_version
from workers.job_files import resolve_model
from workers.records import sample_records, split_batch
from workers.settings import Settings
from workers.specs import (
    HELDOUT_MEAN_AT_K_METRIC,
    HELDOUT_METRIC,
    EvalSettings,
    HeldoutSettings,
    compare_spec,
    evaluate_spec,
)

HELDOUT_COMPONENT_PREFIX = "heldout/"  # + a reward list entry's name: its greedy mean


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

    def phase(text: str) -> None:  # a Hub model's download
        control.report(0, 1, phase=text)

    if spec.model is not None:
        target = Target(resolve_model(spec.model, phase), 0)
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
    """A train job's held-out prompts scored with the job's reward (`RewardMix`, as the
    trainer scores): the mean of greedy answers (pass@1, ``heldout_accuracy``) and, with
    ``settings.k``, the mean over k sampled answers per prompt at the job's temperature and
    top-p (``heldout_mean_at_k``). With a reward list these are means of the weighted total
    reward (an accuracy for a single 0/1 reward only), and each component's greedy mean is
    stored too (``heldout/<name>``)."""

    def __init__(
        self,
        records: Sequence[Mapping[str, str]],
        reward: RewardSpec,
        settings: HeldoutSettings,
        params: SamplingParams,
        episodes: tuple[Any, EpisodeLimits] | None = None,
        device: str = "cpu",
    ) -> None:
        """`device`: where a reward model of the list scores (the trainer's shares it)."""
        self.records = [dict(r) for r in records[: settings.prompts]]
        self.reward = reward
        self.mix = RewardMix(reward, params.max_tokens, device)
        self.settings = settings
        self.params = params
        self.episodes = episodes  # an environment job's: (its session, the episode limits)

    def close(self) -> None:
        """End the environment session of an environment job (its processes with it)."""
        if self.episodes is not None:
            self.episodes[0].close()

    def greedy(self, engine: Any) -> EvalResult:
        """The engine's greedy answers (its current, acknowledged weights), scored."""
        greedy = SamplingParams(temperature=0, max_tokens=self.params.max_tokens)
        return evaluate(engine, self.records, self.mix, greedy, episodes=self.episodes)

    def accuracy(self, engine: Any) -> float:
        """Mean (total) reward of the engine's greedy answers."""
        return self.greedy(engine).mean_reward

    def scores(self, engine: Any) -> dict[str, float]:
        """The held-out metrics of the engine's current weights."""
        result = self.greedy(engine)
        found = {HELDOUT_METRIC: result.mean_reward}
        for name, values in result.components.items():
            found[HELDOUT_COMPONENT_PREFIX + name] = sum(values) / max(len(values), 1)
        if self.settings.k:
            records = self.records * self.settings.k
            sampled = evaluate(
                engine, records, self.mix, self.params, HELDOUT_SEED, episodes=self.episodes
            )
            found[HELDOUT_MEAN_AT_K_METRIC] = sampled.mean_reward
        return found


def heldout_eval(
    config: GRPOConfig,
    settings: HeldoutSettings,
    columns: Columns,
    records: list[dict[str, str]],
) -> tuple[list[dict[str, str]], HeldoutEval]:
    """(the training records, the job's `HeldoutEval`): held-out prompts from a test file, a
    held-out fraction of ``records`` (then left out of training), or drawn from the built-in
    task, those never drawn for training first (``always7`` has to reuse training ones)."""
    if settings.data is not None:
        heldout = prompt_records(None, settings.data, columns=columns)
    elif settings.fraction is not None:
        records, heldout = split_heldout(records, settings.fraction, config.seed)
    else:
        seen = {(r["instruction"], r["input"]) for r in records}
        drawn = prompt_records(config.task, None, 2 * settings.prompts, HELDOUT_SEED, columns)
        unseen = [r for r in drawn if (r["instruction"], r["input"]) not in seen]
        heldout = unseen + [r for r in drawn if r not in unseen]
    params = SamplingParams(
        temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens
    )
    reward = config.reward or default_reward(config.task)
    episodes = None
    if config.environment is not None:  # scored by greedy episodes in the job's environment
        from core_engine.rl.episodes.env_sandbox import EnvironmentSession

        limits = EpisodeLimits(config.max_turns, config.max_episode_tokens)
        episodes = (EnvironmentSession(config.environment), limits)
    return records, HeldoutEval(heldout, reward, settings, params, episodes, config.device)
