"""Verifiable rewards and their validation.

A reward function takes `(completions, references, prompts)` (lists of strings of equal
length) and returns one float per completion. Built-ins are named; user functions are given
as `module:function`.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Sequence

RewardFn = Callable[[Sequence[str], Sequence[str], Sequence[str]], Sequence[float]]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class RewardError(RuntimeError):
    """The reward function failed or returned unusable values (the batch is rejected)."""


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


def regex_reward(pattern: str) -> RewardFn:
    """1.0 when the completion fully matches `pattern` (a format reward)."""
    compiled = re.compile(pattern, re.DOTALL)

    def reward(completions, references, prompts):
        return [float(compiled.fullmatch(c.strip()) is not None) for c in completions]

    return reward


BUILTIN_REWARDS: dict[str, RewardFn] = {"exact_match": exact_match, "numeric_match": numeric_match}


def check_reward_spec(spec: str) -> None:
    """Refuse a malformed reward spec without importing anything (ValueError)."""
    if spec in BUILTIN_REWARDS:
        return
    if spec.startswith("regex:"):
        try:
            re.compile(spec.removeprefix("regex:"))
        except re.error as exc:
            raise ValueError(f"reward {spec!r}: invalid regular expression ({exc})") from None
        return
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"unknown reward {spec!r}: use one of {sorted(BUILTIN_REWARDS)}, "
            "'regex:<pattern>' or 'module:function'"
        )


def resolve_reward(spec: str) -> RewardFn:
    """`exact_match`, `numeric_match`, `regex:<pattern>` or `package.module:function`."""
    check_reward_spec(spec)
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if spec.startswith("regex:"):
        return regex_reward(spec.removeprefix("regex:"))
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load reward {spec!r}: {exc}") from exc
    if not callable(fn):
        raise ValueError(f"reward {spec!r} is not callable")
    return fn


def score(
    fn: RewardFn, completions: Sequence[str], references: Sequence[str], prompts: Sequence[str]
) -> list[float]:
    """Run a reward function and validate its output: one finite float per completion."""
    try:
        values = list(fn(list(completions), list(references), list(prompts)))
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
