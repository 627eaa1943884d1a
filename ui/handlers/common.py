"""Input parsing shared by the handlers."""

import math
from collections.abc import Callable
from typing import Any

from db import InvalidValue


def parse_id(value: float | str | None, what: str) -> int | None:
    """A whole id (or version) from a number box or a dropdown; None when empty;
    `InvalidValue` for anything else."""
    number = parse_number(value, what)
    if number is None:
        return None
    if number != int(number) or number < 0:
        raise InvalidValue(f"{what}: {value!r} is not a whole number >= 0")
    return int(number)


def parse_number(value: float | str | None, what: str) -> float | None:
    """A finite number from a text or number box; None when empty; `InvalidValue` else."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidValue(f"{what}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise InvalidValue(f"{what}: {value!r} is not finite")
    return number


def ask_worker(
    call: Callable[[], dict[str, Any]], verb: str
) -> tuple[dict[str, Any] | None, str | None]:
    """A worker's answer, or one line saying why there is none: the input is invalid (its
    `InvalidValue` text), the queue is unreachable ("Could not VERB: ..."), or the worker
    refused ("Cannot VERB: ..."). Nothing is raised: the UI stays up."""
    try:
        answer = call()
    except InvalidValue as exc:
        return None, str(exc)
    except Exception as exc:  # the queue is unreachable
        return None, f"Could not {verb}: {type(exc).__name__}: {exc}"
    if "problem" in answer:
        return None, f"Cannot {verb}: {answer['problem']}"
    return answer, None
