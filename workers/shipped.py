"""The policies the package ships (`core_engine.assets`), by the name a job gives as its
model: where each one is, the module that rebuilds it, and what Launch fills in when it is
chosen. Imports no torch."""

from pathlib import Path
from typing import Any

from core_engine.assets import BUILDERS, CALCULATOR_MODEL, DEMO_MODEL, R1_MODEL, SHIPPED_POLICIES

SHIPPED_MODEL_NAMES = tuple(SHIPPED_POLICIES)
# What Launch fills in when a shipped policy is chosen: the task, environment, rewards and
# lengths it was built for, and a run long enough to see it learn on a CPU (docs/benchmarks.md,
# docs/rewards.md).
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    DEMO_MODEL: {"task": "addition", "environment": None, "steps": 600, "max_tokens": 6},
    CALCULATOR_MODEL: {
        "task": "word_problems",
        "environment": "calculator",
        "steps": 100,
        "max_tokens": 48,  # per turn: a tool call, or the answer
        "max_turns": 5,  # a problem has 2-4 worked lines, then the answer
        "max_episode_tokens": 384,  # the policy's context
    },
    # the R1 recipe: the answer checked and the <think>/<answer> template rewarded
    R1_MODEL: {
        "task": "word_problems",
        "environment": None,
        "reward": [{"name": "math"}, {"name": "format"}],
        "steps": 60,
        "max_tokens": 160,  # a reply of 4 worked lines is ~110 tokens
    },
}


def shipped_policy(model: str) -> tuple[Path, str]:
    """A shipped model name's checkpoint directory and the module that rebuilds it."""
    return SHIPPED_POLICIES[model], BUILDERS[model]
