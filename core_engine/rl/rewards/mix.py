"""Several rewards per job, each with a weight; the total is the weighted sum.

A job's ``reward`` is one spec (`core_engine.rl.rewards`) or a list of at most `MAX_REWARDS`
tables ``{name=<spec>, weight=1.0}``, not every weight 0: ``length`` also takes ``threshold``
(tokens; below the job's ``max_tokens``), ``format`` optional ``tags`` (two names, default
think/answer); ``overlong`` (DAPO's soft overlong punishment, `overlong_penalty`) takes
optional ``max_length`` and ``cache_length`` (tokens; default the job's ``max_tokens`` and a
fifth of it);
``reward_model`` takes ``model`` (a reward model's checkpoint directory, or a Hub id the worker
resolves to one), optional ``max_length`` (tokens it reads) and ``batch_size``
(`core_engine.rl.rewards.reward_model`). A list keeps each entry's scores as a component of the
sample (keyed by its name); a single spec has none (its component would be the total).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from core_engine.rl.limits import REWARD_TERM_FIELDS, field_problems
from core_engine.rl.rewards import (
    DEFAULT_TAGS,
    RewardError,
    RewardFn,
    check_reward_spec,
    format_pattern,
    length_penalty,
    regex_reward,
    resolve_reward,
    score,
)
from core_engine.rl.rewards.reward_model import REWARD_MODEL, RewardModelScorer

MAX_REWARDS = 8
OVERLONG_CACHE_SHARE = 5  # `overlong`'s default L_cache: L_max / 5 (DAPO: 4,096 of 20,480)
_KEYS = ("name", "weight", "threshold", "tags", "model", "max_length", "cache_length", "batch_size")
# with ``regex:`` patterns: score without a reference
REFERENCE_FREE = ("format", "length", "overlong", REWARD_MODEL)
# the keys only some rewards take, and which
_OWN_KEYS = {
    "threshold": ("length",),
    "model": (REWARD_MODEL,),
    "max_length": ("overlong", REWARD_MODEL),
    "cache_length": ("overlong",),
    "batch_size": (REWARD_MODEL,),
}

RewardSpec = str | Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class RewardTerm:
    """One entry of a reward list."""

    name: str
    weight: float = 1.0
    threshold: int | None = None  # `length` only
    tags: tuple[str, ...] = DEFAULT_TAGS  # `format` only
    model: str | None = None  # `reward_model` only: its checkpoint
    max_length: int | None = None  # `overlong`: L_max; `reward_model`: tokens it reads
    cache_length: int | None = None  # `overlong` only: L_cache
    batch_size: int | None = None  # `reward_model` only: texts per forward


def _term(entry: Any, max_tokens: int | None) -> RewardTerm:
    if not isinstance(entry, Mapping):
        raise ValueError(f"reward list entry must be a table {{name, weight}}, got {entry!r}")
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown or "name" not in entry:
        raise ValueError(f"reward list entry {dict(entry)!r}: keys are {list(_KEYS)}, name needed")
    own = {key: entry[key] for key in _OWN_KEYS if key in entry}
    term = RewardTerm(entry["name"], entry.get("weight", 1.0), **own)
    problems = field_problems(
        {k: v for k, v in vars(term).items() if v is not None}, REWARD_TERM_FIELDS
    )
    if problems:
        raise ValueError(f"reward {term.name!r}: " + "; ".join(problems))
    for key in own:
        if term.name not in _OWN_KEYS[key]:
            names = [repr(name) for name in _OWN_KEYS[key]]
            takes = f"{' and '.join(names)} {'take' if len(names) > 1 else 'takes'}"
            raise ValueError(f"reward {term.name!r}: only {takes} {key}")
    if term.name == "length":
        if term.threshold is None:
            raise ValueError("reward 'length' needs a threshold (tokens)")
        if max_tokens is not None and term.threshold >= max_tokens:
            raise ValueError(
                f"reward 'length': threshold ({term.threshold}) must be below max_tokens "
                f"({max_tokens})"
            )
    elif term.name == "overlong":
        term = _overlong(term, max_tokens)
    elif term.name == REWARD_MODEL:
        if not isinstance(term.model, str) or not term.model:
            raise ValueError(
                "reward 'reward_model' needs model: a reward model's checkpoint directory or "
                "Hugging Face Hub id"
            )
    else:
        check_reward_spec(term.name)
    if "tags" in entry:
        if term.name != "format":
            raise ValueError(f"reward {term.name!r}: only 'format' takes tags")
        tags = entry["tags"]
        format_pattern(tags if isinstance(tags, list | tuple) else [tags])
        term = RewardTerm(term.name, term.weight, None, tuple(tags))
    return term


def _overlong(term: RewardTerm, max_tokens: int | None) -> RewardTerm:
    """An ``overlong`` term with its L_max (default: the job's ``max_tokens``) and L_cache
    (default: a fifth of L_max, the paper's 4,096 of 20,480 tokens), checked."""
    max_length = term.max_length if term.max_length is not None else max_tokens
    if max_length is None:  # the job's max_tokens is itself refused
        return term
    cache = term.cache_length
    if cache is None:
        cache = max(1, max_length // OVERLONG_CACHE_SHARE)
    if not 1 <= cache <= max_length:
        raise ValueError(
            f"reward 'overlong': cache_length ({cache}) must be between 1 and max_length "
            f"({max_length})"
        )
    return replace(term, max_length=max_length, cache_length=cache)


def overlong_penalty(lengths: Sequence[int], max_length: int, cache_length: int) -> list[float]:
    """DAPO's soft overlong punishment (2503.14476, eq. 13) per completion length |y|: 0 while
    |y| <= L_max - L_cache, then ((L_max - L_cache) - |y|) / L_cache, and -1 beyond L_max
    (the `length` reward's ramp, its threshold L_max - L_cache)."""
    threshold = max_length - cache_length
    return length_penalty(lengths, threshold, max_length)


def parse_rewards(spec: RewardSpec, max_tokens: int | None = None) -> list[RewardTerm]:
    """The terms of a job's reward (ValueError when not allowed); a string is one term of
    weight 1. Imports nothing and needs no registration (what the UI may check)."""
    if isinstance(spec, str):
        check_reward_spec(spec)
        return [RewardTerm(spec)]
    if not isinstance(spec, list | tuple) or not spec:
        raise ValueError(
            f"reward: expected a name or a list of {{name, weight}} tables, got {spec!r}"
        )
    if len(spec) > MAX_REWARDS:
        raise ValueError(f"reward: at most {MAX_REWARDS} rewards, got {len(spec)}")
    terms = [_term(entry, max_tokens) for entry in spec]
    names = [t.name for t in terms]
    if len(set(names)) != len(names):
        raise ValueError(f"reward: each name at most once, got {names}")
    if all(t.weight == 0 for t in terms):
        raise ValueError(
            "reward: every weight is 0, so every sample would score 0 and no group would have "
            "anything to learn (the job would stall): give at least one reward a non-zero weight"
        )
    return terms


def needs_reference(spec: Any) -> bool:
    """Whether a reward spec or list (valid or not) has a reward that may read the reference
    answer: any but `REFERENCE_FREE` and ``regex:`` patterns (a registered reward may)."""
    if isinstance(spec, str):
        names = [spec]
    elif isinstance(spec, list | tuple):
        names = [entry.get("name") if isinstance(entry, Mapping) else None for entry in spec]
    else:
        return True
    return not all(
        isinstance(name, str) and (name in REFERENCE_FREE or name.startswith("regex:"))
        for name in names
    )


class RewardMix:
    """The weighted sum of a job's rewards; `score` also returns each component."""

    def __init__(self, spec: RewardSpec, max_tokens: int, device: Any = "cpu") -> None:
        """`device`: where a reward model scores (the worker's)."""
        self.terms = parse_rewards(spec, max_tokens)
        self.named = not isinstance(spec, str)
        self.max_tokens = max_tokens
        self._fns: list[RewardFn | None] = [self._resolve(t, device) for t in self.terms]

    @staticmethod
    def _resolve(term: RewardTerm, device: Any) -> RewardFn | None:
        if term.name in ("length", "overlong"):
            return None  # scored from token counts in `score`
        if term.name == "format":
            return regex_reward(format_pattern(term.tags))
        if term.name == REWARD_MODEL:
            return RewardModelScorer(term.model or "", device, term.max_length, term.batch_size)
        return resolve_reward(term.name)

    def score(
        self,
        completions: Sequence[str],
        references: Sequence[str],
        prompts: Sequence[str],
        lengths: Sequence[int],
    ) -> tuple[list[float], dict[str, list[float]]]:
        """(total per completion, name -> scores per completion; empty for a single spec).
        `lengths`: each completion's token count. RewardError when any reward fails."""
        if len(lengths) != len(completions):
            raise RewardError(f"{len(lengths)} lengths for {len(completions)} completions")
        parts: dict[str, list[float]] = {}
        for term, fn in zip(self.terms, self._fns, strict=True):
            if term.name == "overlong":
                parts[term.name] = overlong_penalty(
                    lengths, term.max_length or self.max_tokens, term.cache_length or 0
                )
            elif fn is None:
                parts[term.name] = length_penalty(lengths, term.threshold or 0, self.max_tokens)
            else:
                parts[term.name] = score(fn, completions, references, prompts)
        totals = [
            sum(t.weight * parts[t.name][i] for t in self.terms) for i in range(len(completions))
        ]
        return totals, (parts if self.named else {})


def component_stats(parts: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """``reward/<name>/mean`` and ``reward/<name>/std`` (population) of each component."""
    stats = {}
    for name, values in parts.items():
        mean = sum(values) / len(values)
        stats[f"reward/{name}/mean"] = mean
        stats[f"reward/{name}/std"] = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return stats


def score_rewards(
    reward: RewardMix | RewardFn,
    completions: Sequence[str],
    references: Sequence[str],
    prompts: Sequence[str],
    lengths: Sequence[int],
) -> tuple[list[float], dict[str, list[float]]]:
    """`RewardMix.score`, or a plain reward function's validated scores (no components)."""
    if isinstance(reward, RewardMix):
        return reward.score(completions, references, prompts, lengths)
    return score(reward, completions, references, prompts), {}
