"""The Launch form's Vary section: the form's job as the base of a study (`workers.studies`):
a grid of fields and values (one line each, ``lr: 0.001, 0.003``), seeds per point, and the
budget (jobs at once; the worker's caps bound the rest)."""

import json
import re
from typing import Any

from ui.handlers.launch import InvalidLaunch, lag_for_pipeline, no_worker_warning, train_config
from ui.render import inert
from ui.services import Services

MAX_VARY_CHARS = 4000
MAX_FIELDS = 8
MAX_VALUES = 32
LINE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*[:=]\s*(.+)")


def _value(text: str) -> Any:
    """A number or true/false as JSON reads it; anything else is the text itself."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, int | float | bool) else text


def parse_vary(text: str | None, problems: list[str]) -> dict[str, list[Any]]:
    """The grid of the Vary box (``field: v1, v2`` per line); each problem appended."""
    text = text or ""
    if len(text) > MAX_VARY_CHARS:
        problems.append(f"Vary: at most {MAX_VARY_CHARS} characters")
        return {}
    grid: dict[str, list[Any]] = {}
    for line in filter(str.strip, text.splitlines()):
        match = LINE.fullmatch(line)
        if match is None:
            problems.append(f"Vary: {line.strip()!r} is not 'field: value, value'")
            continue
        name, values = match[1], [v.strip() for v in match[2].split(",") if v.strip()]
        if name in grid:
            problems.append(f"Vary: {name} is given twice")
        elif len(values) > MAX_VALUES:
            problems.append(f"Vary: {name} has {len(values)} values, at most {MAX_VALUES}")
        grid[name] = [_value(v) for v in values]
    if not grid and not problems:
        problems.append("Vary: give at least one line 'field: value, value'")
    if len(grid) > MAX_FIELDS:
        problems.append(f"Vary: at most {MAX_FIELDS} fields")
    return grid


def _count(value: float | str | None, label: str, problems: list[str]) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = 0.5
    if not number.is_integer() or number < 1:
        problems.append(f"{label}: {value!r} is not a whole number of at least 1")
        return 1
    return int(number)


def launch_study(
    services: Services,
    study_name: str,
    vary: str,
    seeds: float | str | None,
    concurrency: float | str | None,
    **form: Any,
) -> str:
    """Validate the form (as `launch_job` does) and the Vary section, and run the study;
    returns a Markdown message: the study and its first jobs, or every problem found
    (nothing is stored)."""
    problems: list[str] = []
    table = {
        "name": (study_name or "").strip(),
        "grid": parse_vary(vary, problems),
        "seeds": _count(seeds, "Seeds per point", problems),
        "concurrency": _count(concurrency, "Jobs at once", problems),
    }
    lag = lag_for_pipeline(form.get("pipeline"), form.get("max_policy_lag"))
    try:
        config = train_config(services, **{**form, "max_policy_lag": lag})
    except InvalidLaunch as exc:
        problems.extend(exc.problems)
    if problems:
        items = "\n".join(f"- {inert(problem)}" for problem in problems)
        return f"**Nothing was enqueued.** Fix these first:\n{items}"
    try:
        study = services.run_study(config, table)
    except ValueError as exc:
        return f"**Nothing was enqueued:** {inert(exc)}"
    jobs = services.repository.study_jobs(study.id)
    first = ", ".join(f"#{job.id}" for job in jobs)
    message = (
        f"Study **{inert(study.name)}** is {study.status.value}: {study.max_jobs} jobs planned "
        f"({len(table['grid'])} fields varied, {study.seeds} seeds per point), "
        f"{study.concurrency} at once; queued: {first}."
    )
    return message + no_worker_warning(services)
