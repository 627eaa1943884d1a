"""Built-in verifiable tasks: seeded record generators with a matching reward."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from core_engine.rl.data.files import Columns, load_records, with_system
from core_engine.rl.data.word_problems import word_problem_records
from core_engine.rl.episodes.environments import guess_number_records

# The seed a train job's held-out prompts of a built-in task are drawn with (`workers.evaluation`);
# the shipped policies' warm-ups never train on its problems and score themselves on them.
HELDOUT_SEED = 2


@dataclass(frozen=True)
class BuiltinTask:
    name: str
    description: str
    reward: str  # a reward spec for `resolve_reward`
    make_records: Callable[[int, int], list[dict[str, str]]]  # (count, seed) -> records


def addition_records(count: int, seed: int, digits: int = 3) -> list[dict[str, str]]:
    rng = random.Random(seed)
    top = 10**digits
    records = []
    for _ in range(count):
        a, b = rng.randrange(top), rng.randrange(top)
        records.append({"instruction": "", "input": f"{a}+{b}=", "output": str(a + b)})
    return records


def always_seven_records(count: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [
        {"instruction": "", "input": f"{rng.randrange(100)}?", "output": "7"} for _ in range(count)
    ]


BUILTIN_TASKS = {
    task.name: task
    for task in (
        BuiltinTask(
            "addition", "3-digit addition, answer the sum", "exact_match", addition_records
        ),
        BuiltinTask("always7", "answer 7 to anything (a toy)", "exact_match", always_seven_records),
        BuiltinTask(
            "word_problems",
            "multi-step word problems in GSM8K's format, answer the number",
            "math",  # the final answer (`#### N`, boxed, ...), not the first number
            word_problem_records,
        ),
        BuiltinTask(
            "guess_number",
            "find a number in 1..100 (the guess_number environment's tasks)",
            "exact_match",  # an environment job is scored by its environment
            guess_number_records,
        ),
    )
}


def prompt_records(
    task: str | None,
    data: str | None,
    count: int = 2000,
    seed: int = 0,
    columns: Columns | None = None,
) -> list[dict[str, str]]:
    """Prompt records of a built-in task (``count`` of them, seeded) or of a data file or
    saved dataset (all, mapped by ``columns``): training and evaluation sets alike. The
    system prompt of ``columns`` is given to a task's records as to a file's."""
    columns = columns or Columns()
    if data is not None:
        return load_records(data, columns)
    if task not in BUILTIN_TASKS:
        raise ValueError(f"unknown task {task!r}; built-in tasks: {sorted(BUILTIN_TASKS)}")
    return [with_system(r, columns.system) for r in BUILTIN_TASKS[task].make_records(count, seed)]


def default_reward(task: str | None) -> str:
    return BUILTIN_TASKS[task].reward if task in BUILTIN_TASKS else "exact_match"
