"""Rollouts from our engine: prompts -> groups of samples stamped with one policy version."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Self

from core_engine.prompts import encode_prompt, render_prompt
from core_engine.rl.data import batch_rows, instruction_to_messages
from core_engine.rl.rewards import RewardError, RewardFn
from core_engine.rl.rewards.mix import RewardMix, score_rewards
from core_engine.rl.rollout.seeds import sample_seed
from core_engine.scheduler import InferenceScheduler
from core_engine.task import ErrorCode, SamplingParams, TaskError, expand_runs


class MixedVersionsError(RuntimeError):
    """A batch that must be one version's was generated across a weight update."""


class StaleRolloutError(RuntimeError):
    """A rollout's policy version is outside the allowed lag (or from the future)."""


@dataclass(frozen=True)
class RawRollout:
    """B prompts x G samples, sample-major within each group (sample i is in group i // G)."""

    prompts: list[str]  # rendered prompt text, one per prompt
    messages: list[list[dict]]  # the prompt conversation, one per prompt
    references: list[str]  # reward-side reference answers, one per prompt
    prompt_ids: list[list[int]]  # one per prompt
    response_ids: list[list[int]]  # one per sample
    completions: list[str]
    behaviour_logprobs: list[list[float]]  # the sampled distribution (after top-k/top-p)
    temp_logprobs: list[list[float]]  # log-softmax(logits / T), what the trainer matches
    finish_reasons: list[str]
    errors: list[TaskError | None]
    cached_prompt_tokens: list[int]
    seeds: list[int]
    policy_version: int
    group_size: int
    temperature: float
    # per sample, [[version, count], ...] of its tokens (`GenerationResult.token_versions`);
    # empty: every token of the batch is of `policy_version` (a rollout saved before these)
    token_versions: list[list[list[int]]] = field(default_factory=list)
    # per sample, the output indexes where it resumed after a preemption
    # (`GenerationResult.resumed_at`); empty: none recorded
    resumed_at: list[list[int]] = field(default_factory=list)
    # multi-turn episodes (`core_engine.rl.episodes`), per sample; empty for single turns:
    # 1 on the sampled assistant tokens of the response, 0 on the template's between turns
    loss_masks: list[list[int]] = field(default_factory=list)
    # the response's turns and observations: {"role", "start", "end", "text", ...}
    segments: list[list[dict]] = field(default_factory=list)
    episode_finishes: list[str] = field(default_factory=list)
    episode_rewards: list[float] = field(default_factory=list)  # the environment's
    # per sample, the rank that generated it (`core_engine.rl.ranks`); empty: one rank
    ranks: list[int] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return len(self.response_ids)

    def group_of(self, sample: int) -> int:
        return sample // self.group_size

    def sample_version(self, sample: int) -> int:
        """The version of the sample's oldest token (its first; `policy_version` when it
        has none): what the sample is stamped with and what the staleness bound reads."""
        runs = self.token_versions[sample] if self.token_versions else None
        return runs[0][0] if runs else self.policy_version

    def loss_mask_of(self, sample: int) -> list[int]:
        """1 for each response token the policy sampled (all of a single-turn response)."""
        if self.loss_masks:
            return self.loss_masks[sample]
        return [1] * len(self.response_ids[sample])

    def versions_of(self, sample: int) -> list[int]:
        """The version that sampled each of the sample's tokens."""
        if not self.token_versions:
            return [self.policy_version] * len(self.response_ids[sample])
        return expand_runs(self.token_versions[sample])

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (floats round-trip exactly), for a checkpoint to resume from or
        another rank. The rollout's own lists, not copies (`asdict` copied every number)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["errors"] = [None if e is None else asdict(e) for e in self.errors]
        return values

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> Self:
        errors = [
            None if e is None else TaskError(ErrorCode(e["code"]), e["message"])
            for e in values["errors"]
        ]
        return cls(**{**values, "errors": errors})


@dataclass(frozen=True)
class RolloutResult(RawRollout):
    rewards: list[float] = field(default_factory=list)  # the total (weighted sum)
    # name -> one score per sample, for a job with a list of rewards (else empty)
    reward_components: dict[str, list[float]] = field(default_factory=dict)
    # group -> why it is not trained on although nothing failed: dynamic sampling's filtered
    # groups (`core_engine.rl.rollout.dynamic`); empty: none
    filtered_groups: dict[int, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> Self:
        filtered = {int(g): why for g, why in values.get("filtered_groups", {}).items()}
        return super().from_json({**values, "filtered_groups": filtered})


class RolloutGenerator:
    """Renders prompts with the chat template and delegates all generation to `run_batch`.
    With `in_flight`, weight updates may land during a batch: its samples then span versions
    (each token's is recorded); otherwise one batch is one version."""

    def __init__(
        self,
        engine: InferenceScheduler,
        params: SamplingParams,
        group_size: int,
        tokenizer: Any = None,
        in_flight: bool = False,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer or engine.tokenizer
        self.params = params
        self.group_size = group_size
        self.in_flight = in_flight

    @staticmethod
    def _instruction_to_messages(instruction: str, input: str = "", output: str = "") -> list[dict]:
        return instruction_to_messages(instruction, input, output)

    def _prepare_prompts(
        self, batch: Mapping[str, Sequence[str]]
    ) -> list[tuple[list[dict], str, str]]:
        """(prompt messages, rendered prompt, reference) per row; `output` stays reward-side."""
        prepared = []
        for row in batch_rows(batch):
            messages = self._instruction_to_messages(
                row.get("instruction", ""), row.get("input", "")
            )
            text = render_prompt(self.tokenizer, messages)
            prepared.append((messages, text, row.get("output", "")))
        return prepared

    def generate(self, batch: Mapping[str, Sequence[str]], seed: int) -> RawRollout:
        prepared = self._prepare_prompts(batch)
        prompt_ids = [encode_prompt(self.tokenizer, text) for _, text, _ in prepared]
        g = self.group_size
        params = [replace(self.params, seed=sample_seed(seed, i * g)) for i in range(len(prepared))]
        results = self.engine.run_batch(prompt_ids, params, samples_per_prompt=g)
        runs = [r.token_versions or [[r.policy_version, 0]] for r in results]
        versions = {v for sample in runs for v, _ in sample if v >= 0}  # -1: never admitted
        if not self.in_flight and len(versions) > 1:
            raise MixedVersionsError(
                f"one batch spans policy versions {sorted(versions)} outside in-flight mode: "
                "a weight update landed during it"
            )
        return RawRollout(
            prompts=[text for _, text, _ in prepared],
            messages=[messages for messages, _, _ in prepared],
            references=[reference for _, _, reference in prepared],
            prompt_ids=prompt_ids,
            response_ids=[r.output_ids for r in results],
            completions=[
                self.tokenizer.decode(r.output_ids, skip_special_tokens=True) for r in results
            ],
            behaviour_logprobs=[r.output_logprobs for r in results],
            temp_logprobs=[r.output_temp_logprobs for r in results],
            finish_reasons=[r.finish_reason.value for r in results],
            errors=[r.error for r in results],
            cached_prompt_tokens=[r.num_cached_prompt_tokens for r in results],
            seeds=[sample_seed(seed, i) for i in range(len(results))],
            policy_version=min(versions, default=self.engine.version),
            group_size=g,
            temperature=self.params.temperature,
            token_versions=[r.token_versions for r in results],
            resumed_at=[r.resumed_at for r in results],
        )


def check_policy_lag(rollout_version: int, trainer_version: int, max_policy_lag: int) -> None:
    lag = trainer_version - rollout_version
    if lag < 0:
        raise StaleRolloutError(
            f"rollout from future version {rollout_version} (trainer is at {trainer_version})"
        )
    if lag > max_policy_lag:
        raise StaleRolloutError(
            f"rollout of version {rollout_version} is {lag} versions old "
            f"(max_policy_lag={max_policy_lag})"
        )


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
