"""What a rollout is: B prompts x G samples stamped with the versions that sampled them
(`RawRollout`), and the same scored (`RolloutResult`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Self

from core_engine.task import ErrorCode, TaskError, expand_runs


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
