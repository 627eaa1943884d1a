"""The Launch form's rewards: the first reward (the dropdown, with a weight) and up to
`EXTRA_REWARDS` more (name and weight each), the threshold of a `length` reward, the cache of an
`overlong` one and the checkpoint of a `reward_model`; one reward of weight 1 is the plain
spec."""

from typing import Any

from db import InvalidValue
from ui.handlers.common import parse_number
from workers import api

TASK_DEFAULT_REWARD = "task default"
LENGTH_REWARD = "length"  # DAPO's overlong penalty: needs a threshold in tokens
OVERLONG_REWARD = "overlong"  # DAPO's, as the paper writes it: its cache length (or default)
REWARD_MODEL = "reward_model"  # a sequence-classification model's score: needs its checkpoint
EXTRA_REWARDS = 3
# The form's fields after ``reward``: its weight, each extra reward's name and weight, then the
# `length` reward's threshold, the `overlong` reward's cache and the reward model's checkpoint.
REWARD_FIELDS = (
    "reward_weight",
    *(f"{kind}_{n}" for n in range(2, EXTRA_REWARDS + 2) for kind in ("reward", "weight")),
    "length_threshold",
    "overlong_cache",
    "reward_model_path",
)


def default_length_threshold(max_tokens: int) -> int:
    """The `length` threshold when the form leaves it blank: the last quarter of
    ``max_tokens`` is penalised (as DAPO's 4k cache of a 16k budget). 0 is a threshold (a
    penalty from the first token), not blank."""
    return max(1, max_tokens * 3 // 4)


def _threshold(form: dict[str, Any], max_tokens: Any, problems: list[str]) -> int | None:
    try:
        number = parse_number(form.get("length_threshold"), "length threshold")
    except InvalidValue as exc:
        problems.append(str(exc))
        return None
    if number is not None:  # 0 too: a penalty from the first token
        return int(number) if number.is_integer() else number
    try:  # max tokens' own problems are reported with the other numbers
        budget = parse_number(max_tokens, "max tokens")
    except InvalidValue:
        return None
    return default_length_threshold(int(budget)) if budget and budget.is_integer() else None


def _cache(form: dict[str, Any], problems: list[str]) -> int | float | None:
    """The `overlong` cache length the form gives (None: blank, the reward's default)."""
    try:
        number = parse_number(form.get("overlong_cache"), "overlong cache length")
    except InvalidValue as exc:
        problems.append(str(exc))
        return None
    return int(number) if number is not None and number.is_integer() else number


def _reward_model(form: dict[str, Any], problems: list[str]) -> str | None:
    path = (form.get("reward_model_path") or "").strip()
    if not path:
        problems.append("reward model: give its checkpoint directory or Hugging Face Hub id")
    return path or None


def _weight(value: float | str | None, what: str, problems: list[str]) -> float | None:
    try:
        number = parse_number(value, f"{what} weight")
    except InvalidValue as exc:
        problems.append(str(exc))
        return None
    return 1.0 if number is None else number


def reward_config(
    reward: str | None, form: dict[str, Any], problems: list[str], max_tokens: Any = None
) -> Any:
    """The job's ``reward``: None (the task's default), one spec, or a list of
    ``{name, weight}`` tables when a weight is not 1, more rewards are chosen or one is
    `length` (its ``threshold``: the form's, 0 included, else (blank) `default_length_threshold`
    of ``max_tokens``), `overlong` (its ``cache_length``: the form's, else its default) or
    `reward_model` (its ``model``: the form's checkpoint). `form` holds the
    `REWARD_FIELDS`; problems (`api.check_reward`) go to `problems`."""
    first = (reward or "").strip()
    first = "" if first == TASK_DEFAULT_REWARD else first
    weight = _weight(form.get("reward_weight"), "reward", problems)
    extras = []
    for n in range(2, EXTRA_REWARDS + 2):
        name = (form.get(f"reward_{n}") or "").strip()
        if name and name != TASK_DEFAULT_REWARD:
            extras.append((name, _weight(form.get(f"weight_{n}"), f"reward {n}", problems)))
    if not extras and weight == 1.0 and first not in (LENGTH_REWARD, OVERLONG_REWARD, REWARD_MODEL):
        spec: Any = first or None
    elif not first:
        problems.append("reward: choose the first reward to mix it with others (not the task's)")
        return None
    else:
        spec = [{"name": name, "weight": w} for name, w in [(first, weight), *extras]]
        for entry in spec:
            if entry["name"] == LENGTH_REWARD:
                entry["threshold"] = _threshold(form, max_tokens, problems)
            elif entry["name"] == OVERLONG_REWARD:
                cache = _cache(form, problems)
                if cache is not None:  # blank: the reward's default
                    entry["cache_length"] = cache
            elif entry["name"] == REWARD_MODEL:
                entry["model"] = _reward_model(form, problems)
    if spec is not None:
        try:
            api.check_reward(spec)  # syntax only: a registered name is checked by the worker
        except api.SpecError as exc:
            problems.append(f"reward: {exc}")
    return spec


def reward_form(reward: Any) -> dict[str, Any]:
    """The form's reward fields for a job's ``reward`` (Clone), the `length` threshold, the
    `overlong` cache and the reward model's checkpoint included; a `format` reward's own tags,
    an `overlong` reward's own max length and a reward model's max length and batch size are
    not carried (the form has the defaults)."""
    values: dict[str, Any] = {"reward": TASK_DEFAULT_REWARD, "reward_weight": 1.0}
    values["length_threshold"] = None  # blank: `default_length_threshold`
    values |= {"overlong_cache": None, "reward_model_path": ""}  # blank: the defaults; none
    values |= {f"reward_{n}": None for n in range(2, EXTRA_REWARDS + 2)}
    values |= {f"weight_{n}": 1.0 for n in range(2, EXTRA_REWARDS + 2)}
    if isinstance(reward, str) and reward:
        values["reward"] = reward
    elif isinstance(reward, list) and reward:
        entries = [e for e in reward if isinstance(e, dict)][: EXTRA_REWARDS + 1]
        for n, entry in enumerate(entries, start=1):
            name, weight = entry.get("name"), entry.get("weight", 1.0)
            keys = ("reward", "reward_weight") if n == 1 else (f"reward_{n}", f"weight_{n}")
            values |= dict(zip(keys, (name, weight), strict=True))
            if name == LENGTH_REWARD:
                values["length_threshold"] = entry.get("threshold")
            elif name == OVERLONG_REWARD:
                values["overlong_cache"] = entry.get("cache_length")
            elif name == REWARD_MODEL:
                values["reward_model_path"] = entry.get("model") or ""
    return values


def reward_weights(reward: Any) -> dict[str, float]:
    """Each reward's weight by name in a job's reward list ({} for one spec or the default)."""
    if not isinstance(reward, list):
        return {}
    entries = (e for e in reward if isinstance(e, dict) and isinstance(e.get("name"), str))
    return {e["name"]: e.get("weight", 1.0) for e in entries}
