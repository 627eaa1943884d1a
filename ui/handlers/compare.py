"""Compare tab: two versions of a job side by side, and launching a compare job."""

import math
from html import escape
from typing import Any

import pandas as pd

from db import (
    MAX_PAGE_SIZE,
    InvalidValue,
    JobInfo,
    JobStatus,
    NotFound,
    PromptComparison,
    SampleFilter,
    SampleSummary,
    VersionMetrics,
)
from ui.handlers.common import parse_id
from ui.handlers.compare_sides import chosen_sides, compared_pairs, side_names
from ui.handlers.jobs import JOB_LIMIT
from ui.render import comparison_html, fmt, histogram_html, inert
from ui.services import Services
from workers import api

HISTOGRAM_BINS = 10
METRIC_COLUMNS = ["metric", "version A", "version B", "B - A"]
HISTOGRAM_COLUMNS = ["bin", "count", "version"]

Comparison = tuple[pd.DataFrame, str, str, str, int | None]


def newest_job_with_samples(services: Services) -> int | None:
    """The job Compare opens on: the newest of the pickers' jobs with samples of two
    versions or more (something to compare), else the newest with samples."""
    with_samples = [
        job.id
        for job in services.repository.list_jobs(limit=JOB_LIMIT)
        if services.repository.list_samples(SampleFilter(job.id), limit=1).items
    ]
    for job_id in with_samples:
        sampled = [m for m in services.repository.version_metrics(job_id) if m.num_samples]
        if len(sampled) >= 2:
            return job_id
    return with_samples[0] if with_samples else None


def version_choices(services: Services, job_id: float | str | None) -> list[int]:
    """The job's versions: recorded ones (which a compare job can run) and those with samples."""
    try:
        chosen = parse_id(job_id, "job")
        metrics = [] if chosen is None else services.repository.version_metrics(chosen)
    except (InvalidValue, NotFound):
        return []
    return [m.version for m in metrics]


def default_versions(services: Services, job_id: float | str | None) -> tuple[int | None, ...]:
    """(A, B) to compare first: the oldest and newest versions with samples; with fewer than
    two of those, the oldest with samples (else the first) and the newest recorded one."""
    try:
        chosen = parse_id(job_id, "job")
        metrics = [] if chosen is None else services.repository.version_metrics(chosen)
    except (InvalidValue, NotFound):
        return None, None
    with_data = [m.version for m in metrics if m.num_samples]
    if len(with_data) >= 2:
        return with_data[0], with_data[-1]
    versions = [m.version for m in metrics]
    if not versions:
        return None, None
    first = with_data[0] if with_data else versions[0]
    last = next((v for v in reversed(versions) if v != first), None)
    return first, last


def job_task(services: Services, job_id: float | str | None) -> str | None:
    """The built-in task the job ran (the held-out comparison's default), if any."""
    try:
        chosen = parse_id(job_id, "job")
        task = None if chosen is None else services.repository.get_job(chosen).config.get("task")
    except (InvalidValue, NotFound):
        return None
    return task if task in api.TASKS else None


def _first_sample(pairs: list[PromptComparison]) -> int | None:
    """A sample to score in the token diff: the first of version B with a response."""
    for pair in pairs:
        for sample in pair.samples_b:
            if sample.response_length:
                return sample.id
    return None


def _metric_rows(a: VersionMetrics | None, b: VersionMetrics | None) -> list[list[str]]:
    def values(m: VersionMetrics | None) -> dict[str, float | int | None]:
        if m is None:
            return {}
        recorded = m.recorded.metrics if m.recorded else None
        return {
            "samples": m.num_samples,
            "sample reward mean": m.sample_reward_mean,
            "mean response tokens": m.mean_response_length,
            "accepted batches": m.num_accepted_batches,
            "rejected batches": m.num_rejected_batches,
            "trainer reward mean": recorded.reward_mean if recorded else None,
            "trainer reward std": recorded.reward_std if recorded else None,
            "KL": recorded.kl if recorded else None,
            "train/infer mismatch": recorded.train_infer_mismatch if recorded else None,
            "tokens/s": recorded.tokens_per_second if recorded else None,
            **{f"finish {k.value}": v for k, v in m.finish_reasons.items()},
        }

    left, right = values(a), values(b)
    rows = []
    for name in dict.fromkeys([*left, *right]):
        x, y = left.get(name), right.get(name)
        delta = y - x if x is not None and y is not None else None
        rows.append([name, fmt(x), fmt(y), fmt(delta)])
    return rows


def _sample_values(services: Services, job_id: int, version: int) -> list[SampleSummary]:
    """Up to `MAX_PAGE_SIZE` samples of one version (a bounded sample of its distribution)."""
    where = SampleFilter(job_id, min_version=version, max_version=version)
    return services.repository.list_samples(where, limit=MAX_PAGE_SIZE).items


def histogram(values: dict[str, list[float]]) -> pd.DataFrame:
    """Counts per bin for each named series, on shared bins in ascending order; whole-number
    data (lengths, 0/1 rewards) gets whole-number bins."""
    every = [v for series in values.values() for v in series]
    if not every:
        return pd.DataFrame(columns=HISTOGRAM_COLUMNS)
    low, high = min(every), max(every)
    if all(float(v).is_integer() for v in every):
        width = max(1, math.ceil((high - low + 1) / HISTOGRAM_BINS))
        bins = int((high - low) // width) + 1
        labels = [
            f"{low + i * width:g}" + (f"–{low + (i + 1) * width - 1:g}" if width > 1 else "")
            for i in range(bins)
        ]
    else:
        width = (high - low) / HISTOGRAM_BINS
        bins = HISTOGRAM_BINS
        labels = [f"{low + i * width:.3g}–{low + (i + 1) * width:.3g}" for i in range(bins)]
    rows = []
    for name, series in values.items():
        counts = [0] * bins
        for v in series:
            counts[min(int((v - low) // width), bins - 1)] += 1
        rows.extend([label, count, name] for label, count in zip(labels, counts, strict=True))
    return pd.DataFrame(rows, columns=HISTOGRAM_COLUMNS)


def compare_versions(
    services: Services,
    job_id: float | str | None,
    version_a: float | str | None,
    version_b: float | str | None,
    job_b: float | str | None = None,
) -> Comparison:
    """Metrics side by side, reward and length distributions, the same prompts' responses
    under both versions (from the jobs, else their held-out comparison), and a sample of
    version B to score in the token diff. Version B is of ``job_b`` when given: another job
    that shares the tokenizer (`shared_tokenizer`)."""
    empty = pd.DataFrame(columns=METRIC_COLUMNS)
    try:
        side_a, side_b = chosen_sides(services, job_id, version_a, version_b, job_b)
        pairs, note = compared_pairs(services, side_a, side_b)
        metrics = [
            {m.version: m for m in services.repository.version_metrics(job)}.get(version)
            for job, version in (side_a, side_b)
        ]
        samples = {"A": _sample_values(services, *side_a), "B": _sample_values(services, *side_b)}
    except (InvalidValue, NotFound) as exc:
        return empty, "", "", f"<p><b>{escape(str(exc))}</b></p>", None
    table = pd.DataFrame(_metric_rows(*metrics), columns=METRIC_COLUMNS)
    names = side_names(side_a, side_b)
    rewards = histogram(
        {k: [s.reward for s in v if s.reward is not None] for k, v in samples.items()}
    )
    lengths = histogram({k: [s.response_length for s in v] for k, v in samples.items()})
    return (
        table,
        histogram_html(rewards, "Reward", names),
        histogram_html(lengths, "Response tokens", names),
        note + (comparison_html(pairs, *names.values()) if pairs else ""),
        _first_sample(pairs),
    )


def launch_compare(
    services: Services,
    job_id: float | str | None,
    version_a: float | str | None,
    version_b: float | str | None,
    task: str | None,
    num_prompts: float | str | None,
    seed: float | str | None,
    max_tokens: float | str | None,
    job_b: float | str | None = None,
) -> tuple[str, int | list[int] | None]:
    """Enqueue the held-out comparison: both versions answer the same held-out prompts of a
    built-in task (greedy). Versions of one job: a compare job. Version B of another job
    (``job_b``, sharing the tokenizer): an evaluate job per side with the same prompts, seed
    and sampling. Returns a Markdown message and the id (or the two ids) queued (None: none)."""
    try:
        side_a, side_b = chosen_sides(services, job_id, version_a, version_b, job_b)
        counts = {
            "num_prompts": parse_id(num_prompts, "prompts"),
            "seed": parse_id(seed, "seed"),
            "max_tokens": parse_id(max_tokens, "max tokens"),
        }
        if side_a == side_b:
            raise InvalidValue("choose two different versions")
        if task not in api.TASKS:
            raise InvalidValue(f"task: choose one of {', '.join(api.TASKS)}")
        if not counts["num_prompts"] or not counts["max_tokens"] or counts["seed"] is None:
            raise InvalidValue("prompts and max tokens must be >= 1, and a seed is required")
        for job, version in side_a, side_b:
            _generating_weights(services, job, version)
        if side_a[0] == side_b[0]:
            config: dict[str, Any] = {
                "job_id": side_a[0],
                "versions": [side_a[1], side_b[1]],
                "task": task,
                **counts,
            }
            launched = services.submit_job("compare", config)
            return compare_job_line(launched), launched.id
        evaluations = [
            services.submit_job(
                "evaluate", {"job_id": job, "version": version, "task": task, **counts}
            )
            for job, version in (side_a, side_b)
        ]
    except ValueError as exc:  # InvalidValue, or the queue's own validation
        return f"**Nothing was enqueued:** {inert(exc)}", None
    return _lines(evaluations), [job.id for job in evaluations]


def _generating_weights(services: Services, job: int, version: int) -> None:
    """`InvalidValue` unless the version's weights are kept: the held-out comparison
    generates with them (the worker checks again: retention may delete them meanwhile)."""
    info = services.repository.get_version(job, version)
    if info is None or not api.weights_kept(info):
        raise InvalidValue(
            f"job #{job} version {version}: weights not kept, and the held-out comparison "
            "answers with each version's weights. Choose versions whose weights are kept "
            "(Samples marks them; a job keeps them as keep_last and keep_every say)"
        )


def _lines(jobs: list[JobInfo]) -> str:
    return "  \n".join(compare_job_line(job) for job in jobs)


def compare_job_line(job: JobInfo) -> str:
    """Where a launched compare (or evaluate) job stands, as Markdown."""
    name = f"{job.kind.value.capitalize()} job **#{job.id}**"
    if job.status is JobStatus.SUCCEEDED:
        return f"{name} finished: **Compare** shows both versions' answers to its prompts."
    if job.status is JobStatus.FAILED:
        return f"{name} failed: {inert(job.error or 'no reason recorded')}"
    if job.status is JobStatus.RUNNING and job.total_steps:
        return f"{name} is running: {job.step} of {job.total_steps} versions answered."
    return f"{name} is {job.status.value}."


def follow_compare_job(
    services: Services,
    launched: int | list[int],
    job_id: float | str | None,
    version_a: float | str | None,
    version_b: float | str | None,
    job_b: float | str | None = None,
) -> tuple[str, bool, Comparison | None]:
    """The launched jobs' lines (`compare_job_line`), whether they have all finished and,
    once they have all succeeded, the comparison on view (`compare_versions`), which now
    shows their pairs: no other pick needed."""
    try:
        jobs = [
            services.repository.get_job(i)
            for i in ([launched] if isinstance(launched, int) else launched)
        ]
    except NotFound as exc:
        return f"**{inert(exc)}**", True, None
    comparison = None
    if all(job.status is JobStatus.SUCCEEDED for job in jobs):
        comparison = compare_versions(services, job_id, version_a, version_b, job_b)
    return _lines(jobs), all(job.status.is_terminal for job in jobs), comparison
