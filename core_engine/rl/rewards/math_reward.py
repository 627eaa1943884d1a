"""The `math` reward: the completion's final answer is equivalent to the reference.

A completion with an answer tag (``<answer>...</answer>``, the `format` reward's default
answer tag) answers with what its last tag holds (an empty tag answers nothing); otherwise
`math-verify` extracts the answer (``\\boxed{...}``, ``#### 42``, "the answer is ...", the
last number). Either is compared with the reference (fractions, decimals, LaTeX, percentages,
units). It parses LaTeX with sympy, which can take unbounded time, so this module runs only in
the reward sandbox (`core_engine.rl.rewards.sandbox`): the sandbox's deadline bounds the batch,
and math-verify's own signal-based timeouts are off.
"""

from __future__ import annotations

from collections.abc import Sequence

from math_verify import parse, verify

from core_engine.rl.rewards import DEFAULT_TAGS

ANSWER_TAG = DEFAULT_TAGS[1]


def _final_answer(text: str) -> list:
    """A final answer as written (a reference, an answer tag's content): a bare one (no ``$``,
    ``\\boxed`` or ``####``) is read as LaTeX math (``(x+1)^2``, ``\\pi``), anything else like
    a completion."""
    if not any(mark in text for mark in ("$", "\\boxed", "####")):
        found = parse(f"${text}$", parsing_timeout=None)
        if found:
            return found
    return parse(text, parsing_timeout=None)


def _tagged_answer(completion: str) -> str | None:
    """What the last complete answer tag of ``completion`` holds; None without one."""
    opening, closing = f"<{ANSWER_TAG}>", f"</{ANSWER_TAG}>"
    end = completion.rfind(closing)
    start = completion.rfind(opening, 0, end) if end >= 0 else -1
    return None if start < 0 else completion[start + len(opening) : end]


def equivalent(completion: str, reference: str) -> bool:
    """Whether the final answer of ``completion`` (its answer tag's, when it has one) is
    equivalent to ``reference``. LaTeX in a completion is read inside ``$...$``, ``\\(...\\)``
    or ``\\boxed{}``."""
    want = _final_answer(reference)
    tagged = _tagged_answer(completion)  # an empty tag answers nothing
    got = parse(completion, parsing_timeout=None) if tagged is None else _final_answer(tagged)
    return bool(want and got and verify(want, got, timeout_seconds=None))


def math_reward(
    completions: Sequence[str], references: Sequence[str], prompts: Sequence[str]
) -> list[float]:
    """1.0 per completion whose final answer is equivalent to its reference, else 0.0."""
    return [float(equivalent(c, r)) for c, r in zip(completions, references, strict=True)]
