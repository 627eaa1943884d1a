"""DAPO's dynamic sampling (Yu et al. 2025, 2503.14476, section 3.2; verl's ``filter_groups``):
a step's batch is drawn again and again until it holds ``batch_size`` groups with mixed rewards
(a group whose rewards all agree has zero advantage: nothing to learn from), at most
``max_sampling_draws`` draws. As verl does, the mixed groups beyond ``batch_size`` are not
trained on. Every drawn group is kept in the step's rollout; the ones not trained on are in its
``filtered_groups`` with the reason, so they are stored as the step's rejected groups. When the
bound is hit first, every group is filtered with the reason naming it, and the step is not
trained on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace

import torch

from core_engine.rl.objective.advantages import zero_variance_groups
from core_engine.rl.rollout.results import RolloutResult
from core_engine.rl.rollout.runner import Produced
from core_engine.rl.trainer.screen import screen_groups


def concat_rollouts(parts: Sequence[RolloutResult]) -> RolloutResult:
    """The rollouts of several draws at one policy version as one: their groups in order."""
    first = parts[0]
    values = {}
    for f in fields(first):
        value = getattr(first, f.name)
        if isinstance(value, list):
            values[f.name] = [item for part in parts for item in getattr(part, f.name)]
        elif isinstance(value, dict):
            if any(getattr(part, f.name).keys() != value.keys() for part in parts):
                raise ValueError(f"draws with different {f.name} keys cannot be one batch")
            values[f.name] = {
                k: [x for part in parts for x in getattr(part, f.name)[k]] for k in value
            }
        elif any(getattr(part, f.name) != value for part in parts):
            raise ValueError(f"draws with different {f.name} cannot be one batch")
        else:
            values[f.name] = value
    return RolloutResult(**values)


def mixed_groups(rollout: RolloutResult) -> list[bool]:
    """Per group: whether its rewards differ (the advantages' own zero-variance rule)."""
    rewards = torch.tensor(rollout.rewards).view(-1, rollout.group_size)
    return (~zero_variance_groups(rewards)).tolist()


def draw_until_mixed(
    draw: Callable[[], Produced], batch_size: int, max_draws: int, reject_scope: str
) -> Produced:
    """Call ``draw`` (one batch's rollout) until ``batch_size`` groups have mixed rewards or
    ``max_draws`` draws were made (module docstring). A draw that fails (a `RewardError`) or
    holds a faulty group that rejects the batch (``reject_scope = "batch"``) ends the drawing:
    the trainer rejects it."""
    parts: list[RolloutResult] = []
    timings = {"generate_s": 0.0, "reward_s": 0.0}
    fresh = True
    filtered: dict[int, str] = {}
    kept = 0
    for _ in range(max_draws):
        result, fresh, spent = draw()
        if not isinstance(result, RolloutResult):
            return result, fresh, spent
        for key, seconds in spent.items():
            timings[key] = timings.get(key, 0.0) + seconds
        faulty = screen_groups(result, "group").rejected
        offset = sum(len(part.prompt_ids) for part in parts)
        for group, mixed in enumerate(mixed_groups(result)):
            if group in faulty:
                continue  # the trainer's screen rejects it, with its reason
            if not mixed:
                value = result.rewards[group * result.group_size]
                why = f"every reward of the group is {value:g}"
            elif kept == batch_size:
                why = f"beyond the batch's {batch_size} groups with mixed rewards"
            else:
                kept += 1
                continue
            filtered[offset + group] = (
                f"prompt {offset + group}: filtered by dynamic sampling: {why}"
            )
        parts.append(result)
        if kept == batch_size or (faulty and reject_scope == "batch"):
            break
    rollout = concat_rollouts(parts)
    if kept < batch_size and not (faulty and reject_scope == "batch"):
        bound = (
            f"dynamic sampling: {kept} of {batch_size} groups with mixed rewards after "
            f"{len(parts)} draws (max_sampling_draws): the step is not trained on"
        )
        filtered = dict.fromkeys(range(len(rollout.prompt_ids)), bound)
    timings["sampling_draws"] = float(len(parts))
    return replace(rollout, filtered_groups=filtered), fresh, timings
