"""The job vocabulary the UI and the CLI offer, and checks of user input that import no user
code and no torch (re-exported by `workers.api`, the UI's one door)."""

from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from core_engine.rl.config import GRPOConfig
from core_engine.rl.data import DataError, load_jsonl
from core_engine.rl.rewards import BUILTIN_REWARDS, check_reward_spec
from core_engine.rl.tasks import BUILTIN_TASKS
from db import JobKind
from workers.chat import MAX_TEMPERATURE as CHAT_MAX_TEMPERATURE
from workers.chat import MAX_TOKENS_LIMIT as CHAT_MAX_TOKENS
from workers.heldout import DEFAULT_EVERY as HELDOUT_EVERY
from workers.heldout import DEFAULT_PROMPTS as HELDOUT_PROMPTS
from workers.limits import check_sizes
from workers.specs import DEMO_MODEL, SpecError, validate

__all__ = [
    "CHAT_MAX_TEMPERATURE",
    "CHAT_MAX_TOKENS",
    "DEMO_MODEL",
    "LAUNCH_DEFAULTS",
    "REWARDS",
    "TASKS",
    "TRAINER_DEFAULTS",
    "check_reward",
    "count_records",
    "validate_job",
]

TASKS: dict[str, str] = {name: task.description for name, task in BUILTIN_TASKS.items()}
TRAINER_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(GRPOConfig) if f.default is not MISSING
}
# What a new job starts from: the demo policy on addition, sized to show a clear rise of
# held-out accuracy within minutes on a 2-core CPU.
LAUNCH_DEFAULTS: dict[str, Any] = {
    **TRAINER_DEFAULTS,
    "model": DEMO_MODEL,
    "task": "addition",
    "steps": 300,
    "batch_size": 16,
    "group_size": 8,
    "lr": 3e-4,
    "max_tokens": 6,
    "heldout_every": HELDOUT_EVERY,
    "heldout_prompts": HELDOUT_PROMPTS,
}
REWARDS: tuple[str, ...] = tuple(BUILTIN_REWARDS)


def check_reward(spec: str) -> None:
    """The reward spec's syntax (`SpecError`); a registered name is checked on the worker."""
    try:
        check_reward_spec(spec)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def count_records(path: str | Path) -> int:
    """How many prompt records a JSONL file holds (`SpecError` if it is unusable)."""
    try:
        return len(load_jsonl(path))
    except (DataError, OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(exc)) from None


def validate_job(kind: JobKind | str, config: dict[str, Any]) -> int | None:
    """Check a job config and its sizes as the worker will (`SpecError`); returns its
    total steps."""
    total_steps = validate(kind, config)
    check_sizes(kind, config)
    return total_steps
