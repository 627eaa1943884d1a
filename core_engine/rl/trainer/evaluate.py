"""Score a policy (the engine's current weights) on a set of records with a reward."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from core_engine.rl.data import collate
from core_engine.rl.episodes.runner import EpisodeGenerator, EpisodeLimits
from core_engine.rl.rewards import RewardFn
from core_engine.rl.rewards.mix import RewardMix, score_rewards
from core_engine.rl.rollout.generator import RolloutGenerator
from core_engine.rl.rollout.results import RawRollout
from core_engine.scheduler import InferenceScheduler
from core_engine.task import SamplingParams


@dataclass(frozen=True)
class EvalResult:
    policy_version: int
    mean_reward: float
    rewards: list[float]
    rollout: RawRollout
    components: dict[str, list[float]] = field(default_factory=dict)  # a reward list's parts


def evaluate(
    engine: InferenceScheduler,
    records: Sequence[dict[str, str]],
    reward_fn: RewardMix | RewardFn,
    params: SamplingParams | None = None,
    seed: int = 0,
    episodes: tuple[Any, EpisodeLimits] | None = None,
) -> EvalResult:
    """Greedy (by default) generation on every record, scored by `reward_fn`: a reward
    function, or a job's `RewardMix` (the weighted total, and each component of a list). With
    `episodes` (an environment session and the episodes' limits), one episode per record,
    scored by its environment."""
    params = params or SamplingParams(temperature=0, max_tokens=32)
    if episodes is not None:
        session, limits = episodes
        generator = EpisodeGenerator(engine, params, 1, engine.tokenizer, session, limits)
        raw = generator.generate(collate(records), seed)
        rewards, parts = list(raw.episode_rewards), {}
    else:
        raw = RolloutGenerator(engine, params, group_size=1).generate(collate(records), seed)
        lengths = [len(ids) for ids in raw.response_ids]
        rewards, parts = score_rewards(
            reward_fn, raw.completions, raw.references, raw.prompts, lengths
        )
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    return EvalResult(raw.policy_version, mean, rewards, raw, parts)
