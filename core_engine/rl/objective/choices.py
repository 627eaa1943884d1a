"""The objective's named choices (each the name of one registered function in
`core_engine.rl.objective`), TRL's names for our settings, and the objective's combinations that
have no meaning: torch-free, for the config, the job checks and the UI's lists."""

from __future__ import annotations

from typing import Any

# The objective's named parts (`core_engine.rl.objective`: each name is one registered function):
# how the per-token losses of a step become one number, the surrogate, which ratio it takes,
# and how rewards become advantages. The first of each is today's and the default.
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "seq_mean_token_sum")
POLICY_LOSSES = ("ppo_clip", "cispo", "sapo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")
ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "reinforce_pp", "dr_grpo")
SCALE_REWARDS = ("group", "batch", "none")
ADVANTAGE_STDS = ("population", "unbiased")
LR_SCHEDULERS = ("constant", "linear", "cosine")
# TRL's GRPOConfig names that mean the same as ours; `from_dict` accepts them under either name.
TRL_NAMES = {
    "num_generations": "group_size",
    "beta": "kl_coef",
    "epsilon": "clip_eps",
    "epsilon_high": "clip_eps_high",
    "learning_rate": "lr",
    "max_completion_length": "max_tokens",
    "max_steps": "steps",
}
# TRL's names with no meaning of the same name here: refused, with what to write instead.
TRL_REFUSED = {
    "per_device_train_batch_size": "batch_size counts prompts (each drawn group_size times) "
    "and max_tokens_per_micro_batch bounds a training forward",
    "gradient_accumulation_steps": "micro-batches follow max_tokens_per_micro_batch; the "
    "loss is exact over the whole step",
    "num_iterations": "updates_per_batch",
    "vllm_importance_sampling_mode": "importance_mode ('truncate' or 'mask') with importance_cap",
    "vllm_importance_sampling_cap": "importance_cap",
    "temperature_eval": "a held-out evaluation's temperature",
    "warmup_steps": "warmup_ratio (a share of steps)",
}


def objective_problems(config: Any, numbers_wrong: bool) -> list[str]:
    """What is wrong with `config`'s objective (a `GRPOConfig`): its names, and the combinations
    that have no meaning; `numbers_wrong`: its numbers were refused (the combinations compare
    them)."""
    problems = [
        f"{name} must be one of {', '.join(choices)}, got {getattr(config, name)!r}"
        for name, choices in (
            ("loss_type", LOSS_TYPES),
            ("policy_loss", POLICY_LOSSES),
            ("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS),
            ("advantage", ADVANTAGE_ESTIMATORS),
            ("scale_rewards", SCALE_REWARDS),
            ("advantage_std", ADVANTAGE_STDS),
            ("lr_scheduler_type", LR_SCHEDULERS),
        )
        if getattr(config, name) not in choices
    ]
    if problems or numbers_wrong:
        return problems
    if config.policy_loss == "cispo" and config.clip_eps_high is None:
        problems.append(
            "policy_loss 'cispo' caps the importance weight at clip_eps_high (TRL's "
            "epsilon_high, an absolute bound: ScaleRL recommends 5.0): set it"
        )
    if config.policy_loss != "ppo_clip" and (config.clip_ratio_c or config.delta) is not None:
        problems.append(
            f"clip_ratio_c and delta bound PPO's clipped surrogate: policy_loss "
            f"{config.policy_loss!r} has none"
        )
    if config.clip_ratio_c is not None and config.clip_ratio_c <= 1:
        problems.append("clip_ratio_c (dual clip) must be > 1, as verl asserts")
    high = config.clip_high
    if config.delta is not None and config.delta <= 1 + high:
        problems.append(
            f"delta ({config.delta}) must exceed 1 + the upper clip ({1 + high:g}), as TRL "
            "recommends: below it delta, not the clip, would bound a positive advantage's ratio"
        )
    if config.advantage != "grpo" and (config.scale_rewards, config.advantage_std) != (
        "group",
        "population",
    ):
        problems.append(
            f"scale_rewards and advantage_std belong to advantage 'grpo', not {config.advantage!r}"
        )
    if config.advantage == "rloo" and config.group_size < 2:
        problems.append("advantage 'rloo' needs group_size >= 2 (one other sample at least)")
    if config.top_entropy_quantile < 1 and config.devices > 1:
        problems.append(
            "top_entropy_quantile < 1 takes its threshold over the whole step, which is "
            "not gathered over ranks yet: use devices = 1"
        )
    return problems


def trl_names_as_ours(values: dict[str, Any]) -> dict[str, Any]:
    """TRL's `GRPOConfig` names (`TRL_NAMES`) as ours; a TRL name with no equal here, or a
    name given under both spellings, is refused with the mapping named."""
    problems, renamed = [], {}
    for key, value in values.items():
        if key in TRL_REFUSED:
            problems.append(f"{key!r} (TRL) has no equal here: {TRL_REFUSED[key]}")
            continue
        ours = TRL_NAMES.get(key, key)
        if ours in renamed or (ours != key and ours in values):
            problems.append(f"{key!r} is TRL's name for {ours!r}: give one of them")
            continue
        if ours == "scale_rewards" and isinstance(value, bool):  # TRL's True / False
            value = "group" if value else "none"
        renamed[ours] = value
    if problems:
        raise ValueError("invalid training config: " + "; ".join(problems))
    return renamed
