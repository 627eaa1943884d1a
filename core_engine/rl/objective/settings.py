"""The objective's named choices and their parameters, as one value the trainer hands the loss
(`GRPOConfig`'s fields of the same names; the defaults are today's GRPO)."""

from __future__ import annotations

from dataclasses import dataclass

from core_engine.rl.objective.choices import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, POLICY_LOSSES


@dataclass(frozen=True)
class Objective:
    loss_type: str = "dapo"
    policy_loss: str = "ppo_clip"
    importance_sampling_level: str = "token"
    clip_eps_high: float | None = None  # None: the lower clip's
    clip_ratio_c: float | None = None
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0
    completion_length: int = 1  # dr_grpo's constant (the job's max_tokens)

    def __post_init__(self) -> None:
        for name, choices in (
            ("loss_type", LOSS_TYPES),
            ("policy_loss", POLICY_LOSSES),
            ("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")

    def clip_high(self, clip_eps: float) -> float:
        return clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @property
    def top_entropy(self) -> bool:
        """Whether only the top quantile of tokens by entropy keep their policy term."""
        return self.top_entropy_quantile < 1.0
