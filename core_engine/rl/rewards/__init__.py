"""Verifiable rewards and their validation.

A reward function takes `(completions, references, prompts)` (lists of strings of equal
length) and returns one float per completion. A reward spec is one of:

- a built-in name: `BUILTIN_REWARDS` (in process), ``math`` (answer equivalence through
  `math-verify`, in the sandbox below: sympy can take unbounded time), ``format`` (the
  ``<think>...</think><answer>...</answer>`` template, on RE2); ``length`` and ``overlong``
  (DAPO's overlong penalty) and ``reward_model`` (a sequence-classification model's score)
  need settings, so they are only entries of a reward list (`core_engine.rl.rewards.mix`);
- ``regex:<pattern>``: 1.0 when the completion fully matches, on RE2 (linear time: no pattern
  can make scoring slow);
- the name of a function the operator registered on the worker: the ``rlwb.rewards``
  entry-point group, or ``RLWB_REWARDS="name=package.module:function,..."``. It runs in a
  child process with a time limit (``RLWB_REWARD_TIMEOUT`` seconds, default 60) and a memory
  limit (``RLWB_REWARD_MEMORY`` bytes of address space, default 1 GiB).

Nothing else: a spec never names a module to import. `check_reward_spec` checks the syntax
only (what the UI may do); `resolve_reward` also needs the registration (what the worker does).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence

import re2

from core_engine.rl.registry import NAME, registered
from core_engine.rl.rewards.sandbox import DEFAULT_MEMORY_BYTES, RewardError, SandboxedReward

__all__ = ["BUILTIN_REWARDS", "RewardError", "check_reward_spec", "resolve_reward", "score"]

RewardFn = Callable[[Sequence[str], Sequence[str], Sequence[str]], Sequence[float]]

ENTRY_POINT_GROUP = "rlwb.rewards"
MAX_PATTERN_CHARS = 1000
MATH_TARGET = "core_engine.rl.rewards.math_reward:math_reward"
DEFAULT_TAGS = ("think", "answer")
_TAG = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
DEFAULT_TIMEOUT_S = 60.0
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def exact_match(completions, references, prompts):
    return [float(c.strip() == r.strip()) for c, r in zip(completions, references, strict=True)]


def numeric_match(completions, references, prompts):
    """1.0 when the first number in the completion equals the reference's number."""

    def first_number(text: str) -> float | None:
        found = _NUMBER.search(text)
        return float(found.group()) if found else None

    scores = []
    for completion, reference in zip(completions, references, strict=True):
        got, want = first_number(completion), first_number(reference)
        scores.append(float(got is not None and want is not None and math.isclose(got, want)))
    return scores


BUILTIN_REWARDS: dict[str, RewardFn] = {"exact_match": exact_match, "numeric_match": numeric_match}
STANDALONE_REWARDS = (*BUILTIN_REWARDS, "math", "format")  # the built-ins a spec may name alone
# the built-ins that need settings, so only a reward list entry names them, and what they need
LIST_ONLY_REWARDS = {
    "length": ("a threshold", '{name="length", threshold=N}'),
    "overlong": ("its lengths", '{name="overlong", cache_length=N}'),
    "reward_model": ("a model", '{name="reward_model", model="<checkpoint or Hub id>"}'),
}
BUILTIN_NAMES = (*STANDALONE_REWARDS, *LIST_ONLY_REWARDS)


def format_pattern(tags: Sequence[str] = DEFAULT_TAGS) -> str:
    """The RE2 pattern of the reasoning template ``<think>...</think> <answer>...</answer>``
    (`tags`: the two tag names); ValueError for tags that are not plain names."""
    if len(tags) != 2 or not all(isinstance(t, str) and _TAG.fullmatch(t) for t in tags):
        raise ValueError(f"format tags must be two names of letters, digits and _, got {tags!r}")
    think, answer = tags
    return rf"<{think}>.*</{think}>\s*<{answer}>.*</{answer}>"


def length_penalty(lengths: Sequence[int], threshold: int, max_tokens: int) -> list[float]:
    """DAPO's soft overlong penalty per completion length (tokens): 0 up to `threshold`, then
    falling linearly to -1 at `max_tokens` (and -1 beyond)."""
    span = max_tokens - threshold
    return [max(-1.0, min(0.0, (threshold - n) / span)) for n in lengths]


def _compile(pattern: str) -> re2._Regexp:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"reward regex: longer than {MAX_PATTERN_CHARS} characters")
    options = re2.Options()
    options.dot_nl = True
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(
            f"reward 'regex:{pattern}': invalid regular expression for RE2 ({detail}; "
            "back-references and look-arounds are not supported)"
        ) from None


def regex_reward(pattern: str) -> RewardFn:
    """1.0 when the completion (stripped) fully matches `pattern` (a format reward)."""
    compiled = _compile(pattern)

    def reward(completions, references, prompts):
        return [float(compiled.fullmatch(c.strip()) is not None) for c in completions]

    return reward


def check_reward_spec(spec: str) -> None:
    """Refuse a malformed reward spec (ValueError). Imports nothing and needs no registration."""
    if not isinstance(spec, str):
        raise ValueError(f"reward: expected a string, got {type(spec).__name__}")
    if spec in LIST_ONLY_REWARDS:
        what, entry = LIST_ONLY_REWARDS[spec]
        raise ValueError(
            f"reward {spec!r} needs {what}: use a reward list entry {entry} (see docs/rewards.md)"
        )
    if spec in BUILTIN_NAMES:
        return
    if spec.startswith("regex:"):
        _compile(spec.removeprefix("regex:"))
        return
    if not NAME.fullmatch(spec):
        raise ValueError(
            f"reward {spec!r} is not allowed: use one of {sorted(BUILTIN_NAMES)}, "
            "'regex:<pattern>' or the name of a reward registered on the worker "
            f"({ENTRY_POINT_GROUP} entry points or RLWB_REWARDS)"
        )


def registered_rewards() -> dict[str, str]:
    """name -> ``module:function`` the operator registered (read, never imported, here)."""
    return registered(ENTRY_POINT_GROUP, "RLWB_REWARDS")


def reward_timeout() -> float:
    return float(os.environ.get("RLWB_REWARD_TIMEOUT", DEFAULT_TIMEOUT_S))


def reward_memory() -> int:
    """``RLWB_REWARD_MEMORY``: the bytes of address space a sandboxed reward may use."""
    return int(os.environ.get("RLWB_REWARD_MEMORY") or DEFAULT_MEMORY_BYTES)


def _sandboxed(target: str) -> SandboxedReward:
    """The reward ``module:function`` in the sandbox, with the worker's limits."""
    return SandboxedReward(target, reward_timeout(), reward_memory())


def resolve_reward(spec: str) -> RewardFn:
    """The reward function of a spec (see the module docstring); ValueError if not allowed."""
    check_reward_spec(spec)
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if spec == "math":
        return _sandboxed(MATH_TARGET)
    if spec == "format":
        return regex_reward(format_pattern())
    if spec.startswith("regex:"):
        return regex_reward(spec.removeprefix("regex:"))
    target = registered_rewards().get(spec)
    if target is None:
        raise ValueError(
            f"unknown reward {spec!r}: not registered on this worker "
            f"(registered: {sorted(registered_rewards()) or 'none'})"
        )
    return _sandboxed(target)


def score(
    fn: RewardFn, completions: Sequence[str], references: Sequence[str], prompts: Sequence[str]
) -> list[float]:
    """Run a reward function and validate its output: one finite float per completion."""
    try:
        values = list(fn(list(completions), list(references), list(prompts)))
    except RewardError:
        raise
    except Exception as exc:
        raise RewardError(f"reward function raised {type(exc).__name__}: {exc}") from exc
    if len(values) != len(completions):
        raise RewardError(f"reward function returned {len(values)} values for {len(completions)}")
    try:
        values = [float(v) for v in values]
    except (TypeError, ValueError) as exc:
        raise RewardError(f"reward values must be numbers: {exc}") from exc
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:
        raise RewardError(f"reward function returned non-finite values at {bad[:5]}")
    return values
