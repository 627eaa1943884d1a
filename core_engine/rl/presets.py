"""The published GRPO variants as named presets: each sets a job's fields to its paper's
settings, and a setting the job gives itself wins over its preset's. The one home of the
presets: a job file's ``preset = "DAPO"`` (`GRPOConfig.from_dict`), the Launch form and the Jobs
view read this table.

A preset sets only what its paper changes (the objective's fields: `loss_type`, `advantage`,
`clip_eps` / `clip_eps_high`, `importance_sampling_level`, `kl_coef`; DAPO's dynamic sampling);
batch sizes, lengths and the learning rate stay the job's, since they depend on the model and
the task. DAPO also adds its soft overlong punishment to the job's rewards (the ``overlong``
reward with its defaults: up to ``max_tokens``, the last fifth penalised, the paper's 4,096 of
20,480 tokens), unless the job's reward list has one already.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core_engine.rl.data.tasks import default_reward


@dataclass(frozen=True)
class AlgorithmPreset:
    paper: str  # as cited
    url: str
    settings: Mapping[str, Any]  # GRPOConfig field -> its value in the paper
    summary: str  # what it changes, in a line
    overlong: bool = False  # adds DAPO's soft overlong punishment to the rewards


ALGORITHM_PRESETS: dict[str, AlgorithmPreset] = {
    "GRPO": AlgorithmPreset(
        "Shao et al. 2024, DeepSeekMath",
        "https://arxiv.org/abs/2402.03300",
        {"loss_type": "grpo", "advantage": "grpo", "clip_eps": 0.2, "kl_coef": 0.04},
        "each sequence's token mean, group-normalised advantages, KL to the reference",
    ),
    "Dr. GRPO": AlgorithmPreset(
        "Liu et al. 2025, Understanding R1-Zero-Like Training",
        "https://arxiv.org/abs/2503.20783",
        {"loss_type": "dr_grpo", "advantage": "dr_grpo", "clip_eps": 0.2, "kl_coef": 0.0},
        "a constant normaliser (no length bias), advantages not divided by the std",
    ),
    "DAPO": AlgorithmPreset(
        "Yu et al. 2025, DAPO",
        "https://arxiv.org/abs/2503.14476",
        {
            "loss_type": "dapo",
            "advantage": "grpo",
            "clip_eps": 0.2,
            "clip_eps_high": 0.28,
            "kl_coef": 0.0,
            "dynamic_sampling": True,
        },
        "clip-higher (0.2 / 0.28), token mean over the step, dynamic sampling, soft overlong "
        "punishment, no KL",
        overlong=True,
    ),
    "GSPO": AlgorithmPreset(
        "Zheng et al. 2025, Group Sequence Policy Optimization",
        "https://arxiv.org/abs/2507.18071",
        {
            "importance_sampling_level": "sequence",
            "loss_type": "grpo",
            "advantage": "grpo",
            "clip_eps": 3e-4,
            "clip_eps_high": 4e-4,
            "kl_coef": 0.0,
        },
        "a sequence-level importance ratio (the geometric mean of the token ratios), clipped "
        "to 3e-4 / 4e-4, no KL",
    ),
    "RLOO": AlgorithmPreset(
        "Ahmadian et al. 2024, Back to Basics: REINFORCE Style Optimization",
        "https://arxiv.org/abs/2402.14740",
        {"advantage": "rloo", "loss_type": "seq_mean_token_sum", "kl_coef": 0.05},
        "leave-one-out baseline (no std), each sequence's summed log-probability",
    ),
}


def preset_problems(name: Any) -> list[str]:
    """What is wrong with a job's ``preset`` (None: none chosen, nothing)."""
    if name is None or (isinstance(name, str) and name in ALGORITHM_PRESETS):
        return []
    return [f"preset {name!r}: choose one of {', '.join(ALGORITHM_PRESETS)}"]


def apply_preset(values: Mapping[str, Any]) -> dict[str, Any]:
    """A job's values with its ``preset``'s settings beneath them (the job's own win) and,
    for DAPO, the overlong reward added (module docstring); values without a preset as they
    are (ValueError for an unknown one). Applying it twice changes nothing more."""
    name = values.get("preset")
    if name is None:
        return dict(values)
    if problems := preset_problems(name):
        raise ValueError("invalid training config: " + problems[0])
    applied = {**ALGORITHM_PRESETS[name].settings, **values}
    if ALGORITHM_PRESETS[name].overlong and values.get("environment") is None:  # rewards score
        applied["reward"] = _with_overlong(values.get("reward"), values.get("task"))
    return applied


def _with_overlong(reward: Any, task: Any) -> Any:
    """The job's reward as a list with the ``overlong`` reward in it (a malformed reward as it
    is: its check names the problem)."""
    if reward is None:
        reward = default_reward(task if isinstance(task, str) else None)
    if isinstance(reward, str):
        reward = [{"name": reward}]
    if not isinstance(reward, list):
        return reward
    if any(isinstance(e, Mapping) and e.get("name") == "overlong" for e in reward):
        return reward
    return [*reward, {"name": "overlong"}]


def algorithm_label(config: Mapping[str, Any]) -> str:
    """A job's algorithm in a few words: its preset, else its loss and advantage as set, else
    the defaults'."""
    if isinstance(config.get("preset"), str):
        return config["preset"]
    chosen = [str(config[key]) for key in ("loss_type", "advantage") if config.get(key)]
    return " / ".join(chosen) or "default"
