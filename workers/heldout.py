"""Held-out accuracy during training: every N versions the colocated engine answers a fixed
set of held-out prompts of the job's built-in task greedily; the accuracy is stored with the
version (``heldout_accuracy`` among its metrics) and plotted next to the training reward.

Settings live in the train job's config next to the trainer's: ``heldout_every`` (versions;
default `DEFAULT_EVERY` for a built-in task, 0 = off, the only choice for JSONL data) and
``heldout_prompts`` (default `DEFAULT_PROMPTS`).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workers.specs import SpecError

DEFAULT_EVERY = 10
DEFAULT_PROMPTS = 200
MAX_PROMPTS = 2000
HELDOUT_SEED = 2  # the demo policy's held-out problems (its warm-up never trains on them)
KEYS = ("heldout_every", "heldout_prompts")
METRIC = "heldout_accuracy"


@dataclass(frozen=True)
class HeldoutSettings:
    every: int
    prompts: int

    def due(self, version: int, last: int) -> bool:
        """Whether ``version`` is evaluated: every ``every``-th one, the first and the last."""
        return bool(self.every) and (version % self.every == 0 or version == last)


def heldout_settings(config: Mapping[str, Any]) -> HeldoutSettings:
    """The held-out settings of a train job's config (`SpecError` if they are unusable)."""
    default = DEFAULT_EVERY if config.get("task") is not None else 0
    every = config.get("heldout_every", default)
    prompts = config.get("heldout_prompts", DEFAULT_PROMPTS)
    for name, value in (("heldout_every", every), ("heldout_prompts", prompts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpecError(f"{name} must be a whole number >= 0")
    if every and config.get("task") is None:
        raise SpecError("heldout_every needs a built-in task (held-out prompts come from it)")
    if not 1 <= prompts <= MAX_PROMPTS:
        raise SpecError(f"heldout_prompts must be from 1 to {MAX_PROMPTS}")
    return HeldoutSettings(every, prompts)


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
        from core_engine.rl.tasks import prompt_records

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
        from core_engine.rl.evaluate import evaluate
        from core_engine.rl.rewards import resolve_reward
        from core_engine.rl.tasks import default_reward
        from core_engine.task import SamplingParams

        reward = resolve_reward(default_reward(self.task))
        params = SamplingParams(temperature=0, max_tokens=self.max_tokens)
        return evaluate(engine, self.records, reward, params).mean_reward
