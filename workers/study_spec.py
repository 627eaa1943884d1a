"""A study's table: what it varies and how (`StudySpec`, `parse_study`, the caps).

    name         unique; the study's jobs are grouped under it in the trackers
    kind         grid (default): every point of ``grid``, a table field -> values;
                 random: ``samples`` points drawn from ``ranges`` (seeded by ``seed``);
                 optuna: ``samples`` trials whose points Optuna's TPE sampler picks in
                 ``ranges``, each trial one job reporting its held-out score per evaluation
    ranges       field -> {low, high, log = false} (ints for int fields) or {choices = [...]}
    seeds        jobs per point (default 1), with the job seeds seed, seed + 1, ...
    seed         the first job seed (default the base config's, else 0)
    concurrency  the most jobs queued or running at once (default 1)
    pruner       optuna only: median or successive_halving (default none), with
                 ``pruner_warmup`` (versions never pruned, default 1) and ``pruner_startup``
                 (trials never pruned, default 1)

The points are planned in order and each point's seeds follow one another (job ``i`` is point
``i // seeds``), so on the queue whole seed sets finish first. Caps (`Settings.study_max_jobs`,
``study_max_concurrency``) refuse a larger study before anything is stored.
"""

import itertools
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from core_engine.rl.config import GRPOConfig
from db import StudyInfo, StudyKind
from workers.settings import Settings
from workers.specs import HELDOUT_KEYS, SpecError

PRUNERS = ("median", "successive_halving")
PRUNER_KEYS = ("pruner", "pruner_warmup", "pruner_startup")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
STUDY_KEYS = {
    "name",
    "kind",
    "grid",
    "ranges",
    "samples",
    "seeds",
    "seed",
    "concurrency",
    "pruner",
    "pruner_warmup",
    "pruner_startup",
}
# The search space as stored on the study row (the rest are its own columns).
SPACE_KEYS = ("grid", "ranges", "samples", "seed", "pruner", "pruner_warmup", "pruner_startup")
# What a study may vary: a train job's fields but those the seeds, the worker or each job's
# own folder set.
VARIABLE_FIELDS = ({f.name for f in fields(GRPOConfig)} | set(HELDOUT_KEYS)) - {
    "seed",
    "output_dir",
    "device",
    "resume",
    "checkpoint_every",
}


@dataclass(frozen=True)
class StudySpec:
    """A parsed, checked study (see the module docstring)."""

    name: str
    kind: StudyKind
    grid: dict[str, list[Any]] = field(default_factory=dict)
    ranges: dict[str, dict[str, Any]] = field(default_factory=dict)
    samples: int = 0
    seeds: int = 1
    seed: int = 0
    concurrency: int = 1
    pruner: str | None = None
    pruner_warmup: int = 1
    pruner_startup: int = 1

    @property
    def planned_jobs(self) -> int:
        points = math.prod(len(values) for values in self.grid.values())
        return (points if self.kind is StudyKind.GRID else self.samples) * self.seeds

    @property
    def search_space(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in SPACE_KEYS}

    def points(self) -> list[dict[str, Any]]:
        """The planned points, in order (grid and random studies)."""
        if self.kind is StudyKind.GRID:
            names = list(self.grid)
            return [
                dict(zip(names, v, strict=True)) for v in itertools.product(*self.grid.values())
            ]
        draw = random.Random(self.seed)
        return [
            {name: _draw(draw, space) for name, space in self.ranges.items()}
            for _ in range(self.samples)
        ]

    def job_config(self, base: Mapping[str, Any], index: int, point: Mapping[str, Any]) -> dict:
        """The config of the study's job ``index``: the base, the point, its seed."""
        return {**base, **point, "seed": self.seed + index % self.seeds}


def _draw(draw: random.Random, space: Mapping[str, Any]) -> Any:
    if "choices" in space:
        return draw.choice(space["choices"])
    low, high = space["low"], space["high"]
    if isinstance(low, int) and isinstance(high, int):
        return draw.randint(low, high)
    if space.get("log"):
        return math.exp(draw.uniform(math.log(low), math.log(high)))
    return draw.uniform(low, high)


def corner(space: Mapping[str, Any], end: int) -> Any:
    """A range's first (``end`` 0) or last (-1) value."""
    if "choices" in space:
        return space["choices"][end]
    return space["high" if end else "low"]


def _whole(values: Mapping[str, Any], key: str, default: int, low: int) -> int:
    value = values.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise SpecError(f"study {key}: {value!r} is not a whole number of at least {low}")
    return value


def _field_name(name: Any) -> str:
    """A field a study may vary: a train job's (`GRPOConfig`'s or held-out) but the seed
    (``seeds`` varies it) and the output folder."""
    if name == "seed":
        raise SpecError("study: vary the seed with 'seeds', not as a field")
    if name not in VARIABLE_FIELDS:
        raise SpecError(f"study: {name!r} is not a job field a study can vary")
    return name


def _ranges(values: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(values, Mapping) or not values:
        raise SpecError("study ranges: give a table of field -> {low, high} or {choices}")
    ranges = {}
    for name, space in values.items():
        _field_name(name)
        if not isinstance(space, Mapping):
            raise SpecError(f"study ranges.{name}: give {{low, high}} or {{choices}}")
        if "choices" in space:
            if not isinstance(space["choices"], list) or not space["choices"]:
                raise SpecError(f"study ranges.{name}.choices: give a non-empty list")
        else:
            low, high = space.get("low"), space.get("high")
            numbers = all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)
            )
            if not numbers or not low < high:
                raise SpecError(
                    f"study ranges.{name}: give numbers low < high, not {low!r}, {high!r}"
                )
            if space.get("log") and low <= 0:
                raise SpecError(f"study ranges.{name}: a log range needs low > 0")
        ranges[name] = dict(space)
    return ranges


def _refuse_keys(values: Mapping[str, Any], kind: StudyKind, keys: tuple[str, ...]) -> None:
    extra = sorted(set(keys) & set(values))
    if extra:
        raise SpecError(f"study: a {kind} study takes no {', '.join(extra)}")


def parse_study(values: Any, base: Mapping[str, Any]) -> StudySpec:
    """A study table (a job file's ``[study]``) checked against ``base``, the jobs' common
    config (`SpecError` naming the problem)."""
    if not isinstance(values, Mapping):
        raise SpecError("study: give a table (name, kind, grid or ranges, seeds ...)")
    unknown = sorted(set(values) - STUDY_KEYS)
    if unknown:
        raise SpecError(f"study: unknown keys {', '.join(unknown)}")
    if "output_dir" in base:
        raise SpecError("a study's jobs each write their own folder: remove output_dir")
    name = values.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise SpecError(
            f"study name: {name!r} is not 1 to 64 letters, digits, '.', '_' or '-' "
            "(it names the study's tracker folder)"
        )
    try:
        kind = StudyKind(values.get("kind", "grid"))
    except ValueError:
        raise SpecError(
            f"study kind: {values.get('kind')!r} is not grid, random or optuna"
        ) from None
    spec = StudySpec(
        name=name,
        kind=kind,
        seeds=_whole(values, "seeds", 1, 1),
        seed=_whole(values, "seed", base.get("seed", 0), 0),
        concurrency=_whole(values, "concurrency", 1, 1),
    )
    if kind is StudyKind.GRID:
        grid = values.get("grid")
        if not isinstance(grid, Mapping) or not grid:
            raise SpecError("study grid: give a table of field -> list of values")
        for key, options in grid.items():
            _field_name(key)
            if not isinstance(options, list) or not options:
                raise SpecError(f"study grid.{key}: give a non-empty list of values")
        _refuse_keys(values, kind, ("ranges", "samples", *PRUNER_KEYS))
        return replace(spec, grid={k: list(v) for k, v in grid.items()})
    _refuse_keys(values, kind, ("grid",))
    spec = replace(
        spec, ranges=_ranges(values.get("ranges")), samples=_whole(values, "samples", 0, 1)
    )
    if kind is StudyKind.RANDOM:
        _refuse_keys(values, kind, PRUNER_KEYS)
        return spec
    if spec.seeds != 1:
        raise SpecError("study seeds: an optuna study runs one job (one seed) per trial")
    pruner = values.get("pruner")
    if pruner is not None and pruner not in PRUNERS:
        raise SpecError(f"study pruner: {pruner!r} is not one of {', '.join(PRUNERS)}")
    return replace(
        spec,
        pruner=pruner,
        pruner_warmup=_whole(values, "pruner_warmup", 1, 0),
        pruner_startup=_whole(values, "pruner_startup", 1, 0),
    )


def stored_spec(study: StudyInfo) -> StudySpec:
    """The spec a study was created with."""
    space = study.search_space
    return StudySpec(
        name=study.name,
        kind=study.kind,
        seeds=study.seeds,
        concurrency=study.concurrency,
        **{key: space[key] for key in SPACE_KEYS},
    )


def study_table(spec: StudySpec) -> dict[str, Any]:
    """The study table that `parse_study` reads back as ``spec``."""
    table = {
        "name": spec.name,
        "kind": spec.kind.value,
        "seeds": spec.seeds,
        "seed": spec.seed,
        "concurrency": spec.concurrency,
    }
    if spec.kind is StudyKind.GRID:
        return {**table, "grid": spec.grid}
    table |= {"ranges": spec.ranges, "samples": spec.samples}
    if spec.kind is StudyKind.RANDOM:
        return table
    pruning = {"pruner_warmup": spec.pruner_warmup, "pruner_startup": spec.pruner_startup}
    return {**table, **pruning, **({"pruner": spec.pruner} if spec.pruner else {})}


def check_caps(spec: StudySpec, settings: Settings) -> None:
    """Refuse a study above the worker's caps, saying which and by how much."""
    if spec.planned_jobs > settings.study_max_jobs:
        raise SpecError(
            f"study {spec.name!r} plans {spec.planned_jobs} jobs, above the limit of "
            f"{settings.study_max_jobs} (RLWB_STUDY_MAX_JOBS)"
        )
    if spec.concurrency > settings.study_max_concurrency:
        raise SpecError(
            f"study {spec.name!r} asks for {spec.concurrency} jobs at once, above the limit "
            f"of {settings.study_max_concurrency} (RLWB_STUDY_MAX_CONCURRENCY)"
        )
