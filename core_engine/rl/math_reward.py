"""The `math` reward: the completion's final answer is equivalent to the reference.

`math-verify` extracts the answer (``\\boxed{...}``, ``#### 42``, "the answer is ...", the
last number) and compares it with the reference (fractions, decimals, LaTeX, percentages,
units). It parses LaTeX with sympy, which can take unbounded time, so this module runs only in
the reward sandbox (`core_engine.rl.reward_sandbox`): the sandbox's deadline bounds the batch,
and math-verify's own signal-based timeouts are off.
"""

from __future__ import annotations

from collections.abc import Sequence

from math_verify import parse, verify


def _reference(reference: str) -> list:
    """The reference's answer: a bare answer (no ``$``, ``\\boxed`` or ``####``) is read as
    LaTeX math (``(x+1)^2``, ``\\pi``), anything else like a completion."""
    if not any(mark in reference for mark in ("$", "\\boxed", "####")):
        found = parse(f"${reference}$", parsing_timeout=None)
        if found:
            return found
    return parse(reference, parsing_timeout=None)


def equivalent(completion: str, reference: str) -> bool:
    """Whether the final answer of ``completion`` is equivalent to ``reference``. LaTeX in a
    completion is read inside ``$...$``, ``\\(...\\)`` or ``\\boxed{}``."""
    want = _reference(reference)
    got = parse(completion, parsing_timeout=None)
    return bool(want and got and verify(want, got, timeout_seconds=None))


def math_reward(
    completions: Sequence[str], references: Sequence[str], prompts: Sequence[str]
) -> list[float]:
    """1.0 per completion whose final answer is equivalent to its reference, else 0.0."""
    return [float(equivalent(c, r)) for c, r in zip(completions, references, strict=True)]
