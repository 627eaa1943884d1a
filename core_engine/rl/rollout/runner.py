"""A batch's scored rollout (`RolloutRunner`: generated, or the last one reused while fresh
enough) and the producers' call around it (`produce_rollout`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from core_engine.rl.rewards import RewardError, RewardFn
from core_engine.rl.rewards.mix import RewardMix, score_rewards
from core_engine.rl.rollout.generator import RolloutGenerator
from core_engine.rl.rollout.results import RawRollout, RolloutResult
from core_engine.rl.rollout.staleness import check_policy_lag


class RolloutRunner:
    """`runner(batch) -> (result, is_fresh)`: reuses the last rollout of the same batch while it
    is within `max_policy_lag` of the trainer's version (unless `reuse` is off), else generates
    a fresh one."""

    def __init__(
        self,
        generator: RolloutGenerator,
        reward_fn: RewardMix | RewardFn,
        trainer_version: Callable[[], int],
        max_policy_lag: int = 0,
        reuse: bool = True,
    ) -> None:
        self.generator = generator
        self.reward_fn = reward_fn
        self.trainer_version = trainer_version
        self.max_policy_lag = max_policy_lag
        self.reuse = reuse
        self._last: tuple[tuple, RolloutResult] | None = None
        self.reward_seconds = 0.0  # time the last fresh rollout spent in the reward function

    def _scored(self, raw: RawRollout) -> tuple[list[float], dict[str, list[float]]]:
        refs = [raw.references[raw.group_of(i)] for i in range(raw.num_samples)]
        prompts = [raw.prompts[raw.group_of(i)] for i in range(raw.num_samples)]
        try:
            lengths = [len(ids) for ids in raw.response_ids]
            return score_rewards(self.reward_fn, raw.completions, refs, prompts, lengths)
        except RewardError as exc:
            exc.rollout = raw
            raise

    @staticmethod
    def _key(batch: Mapping[str, Sequence[str]]) -> tuple:
        return tuple((k, tuple(v)) for k, v in sorted(batch.items()))

    def close(self) -> None:
        """Release what the generator holds (an episode generator's environment session)."""
        if hasattr(self.generator, "close"):
            self.generator.close()

    @property
    def last(self) -> RolloutResult | None:
        """The rollout kept for reuse (None: nothing kept)."""
        return None if self._last is None else self._last[1]

    def keep(self, batch: Mapping[str, Sequence[str]], result: RolloutResult) -> None:
        """Keep `result` as the rollout of `batch` (a resumed run restores its saved one)."""
        self._last = (self._key(batch), result)

    def __call__(
        self, batch: Mapping[str, Sequence[str]], seed: int = 0
    ) -> tuple[RolloutResult, bool]:
        key = self._key(batch)
        if self.reuse and self._last is not None and self._last[0] == key:
            cached = self._last[1]
            if 0 <= self.trainer_version() - cached.policy_version <= self.max_policy_lag:
                return cached, False
        raw = self.generator.generate(batch, seed)
        check_policy_lag(raw.policy_version, self.trainer_version(), self.max_policy_lag)
        start = time.perf_counter()
        if raw.episode_rewards:  # the environment scored its episodes
            rewards, parts = list(raw.episode_rewards), {}
        else:
            rewards, parts = self._scored(raw)
        self.reward_seconds = time.perf_counter() - start
        result = RolloutResult(**vars(raw), rewards=rewards, reward_components=parts)
        self._last = (key, result)
        return result, True


Produced = tuple[RolloutResult | RewardError, bool, dict[str, float]]


def produce_rollout(
    runner: RolloutRunner, batch: Mapping[str, Sequence[str]], seed: int
) -> Produced:
    """(rollout, is_fresh, timings), or the `RewardError` that rejects the batch in place of
    the rollout."""
    start = time.perf_counter()
    try:
        result, fresh = runner(batch, seed)
    except RewardError as exc:
        return exc, True, {}
    reward_s = runner.reward_seconds if fresh else 0.0
    generate_s = time.perf_counter() - start - reward_s
    return result, fresh, {"generate_s": generate_s, "reward_s": reward_s}
