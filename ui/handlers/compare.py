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
from ui.handlers.jobs import JOB_LIMIT
from ui.render import comparison_html, fmt, histogram_html, inert
from ui.services import Services
from workers import api

PROMPTS_SHOWN = 20
HISTOGRAM_BINS = 10
METRIC_COLUMNS = ["metric", "version A", "version B", "B - A"]
HISTOGRAM_COLUMNS = ["bin", "count", "version"]

Comparison = tuple[pd.DataFrame, str, str, str, int | None]
NO_PAIRS = (
    "<p>No prompt was answered by both versions (a training job's batches rarely repeat a "
    "prompt). <b>Run the held-out comparison</b> below: both versions answer the same "
    "held-out prompts, and Compare shows them here when it is done.</p>"
)


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


def heldout_job(services: Services, job_id: int, a: int, b: int) -> int | None:
    """The newest succeeded compare job of ``job_id`` over versions ``a`` and ``b``."""
    for job in services.repository.list_jobs(limit=MAX_PAGE_SIZE, kind="compare"):
        config = job.config
        if (
            job.status.value == "succeeded"
            and config.get("job_id") == job_id
            and sorted(config.get("versions", [])) == sorted([a, b])
        ):
            return job.id
    return None


def _pairs(services: Services, job: int, a: int, b: int) -> tuple[list[PromptComparison], str]:
    """The prompts both versions answered in the job itself, else in its newest held-out
    comparison (with a note saying which), else none and a note how to get them."""
    pairs = services.repository.compare_versions(job, a, b, limit=PROMPTS_SHOWN)
    if pairs:
        return pairs, ""
    heldout = heldout_job(services, job, a, b)
    if heldout is None:
        return [], NO_PAIRS
    pairs = services.repository.compare_versions(heldout, a, b, limit=PROMPTS_SHOWN)
    return pairs, f"<p>Held-out prompts answered by both versions (compare job #{heldout}).</p>"


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
) -> Comparison:
    """Metrics side by side, reward and length distributions, the same prompts' responses
    under both versions (from the job, else its held-out comparison), and a sample of
    version B to score in the token diff."""
    empty = pd.DataFrame(columns=METRIC_COLUMNS)
    try:
        job, a, b = _chosen(job_id, version_a, version_b)
        pairs, note = _pairs(services, job, a, b)
        metrics = {m.version: m for m in services.repository.version_metrics(job)}
        samples = {"A": _sample_values(services, job, a), "B": _sample_values(services, job, b)}
    except (InvalidValue, NotFound) as exc:
        return empty, "", "", f"<p><b>{escape(str(exc))}</b></p>", None
    table = pd.DataFrame(_metric_rows(metrics.get(a), metrics.get(b)), columns=METRIC_COLUMNS)
    names = {"A": f"version {a}", "B": f"version {b}"}
    rewards = histogram(
        {k: [s.reward for s in v if s.reward is not None] for k, v in samples.items()}
    )
    lengths = histogram({k: [s.response_length for s in v] for k, v in samples.items()})
    return (
        table,
        histogram_html(rewards, "Reward", names),
        histogram_html(lengths, "Response tokens", names),
        note + (comparison_html(pairs, a, b) if pairs else ""),
        _first_sample(pairs),
    )


def _chosen(
    job_id: float | str | None, version_a: float | str | None, version_b: float | str | None
) -> tuple[int, int, int]:
    """(job, version A, version B), or `InvalidValue` unless all three are given."""
    chosen = (
        parse_id(job_id, "job"),
        parse_id(version_a, "version A"),
        parse_id(version_b, "version B"),
    )
    if None in chosen:
        raise InvalidValue("choose a job and two versions")
    return chosen


def launch_compare(
    services: Services,
    job_id: float | str | None,
    version_a: float | str | None,
    version_b: float | str | None,
    task: str | None,
    num_prompts: float | str | None,
    seed: float | str | None,
    max_tokens: float | str | None,
) -> tuple[str, int | None]:
    """Enqueue a compare job: both versions answer the same held-out prompts of a built-in
    task (greedy). Returns a Markdown message and the id of the job queued (None if none)."""
    try:
        job, a, b = _chosen(job_id, version_a, version_b)
        counts = {
            "num_prompts": parse_id(num_prompts, "prompts"),
            "seed": parse_id(seed, "seed"),
            "max_tokens": parse_id(max_tokens, "max tokens"),
        }
        if a == b:
            raise InvalidValue("choose two different versions")
        if task not in api.TASKS:
            raise InvalidValue(f"task: choose one of {', '.join(api.TASKS)}")
        if not counts["num_prompts"] or not counts["max_tokens"] or counts["seed"] is None:
            raise InvalidValue("prompts and max tokens must be >= 1, and a seed is required")
        config: dict[str, Any] = {"job_id": job, "versions": [a, b], "task": task, **counts}
        launched = services.submit_job("compare", config)
    except ValueError as exc:  # InvalidValue, or the queue's own validation
        return f"**Nothing was enqueued:** {inert(exc)}", None
    return compare_job_line(launched), launched.id


def compare_job_line(job: JobInfo) -> str:
    """Where a launched compare job stands, as Markdown."""
    name = f"Compare job **#{job.id}**"
    if job.status is JobStatus.SUCCEEDED:
        return f"{name} finished: **Compare** shows both versions' answers to its prompts."
    if job.status is JobStatus.FAILED:
        return f"{name} failed: {inert(job.error or 'no reason recorded')}"
    if job.status is JobStatus.RUNNING and job.total_steps:
        return f"{name} is running: {job.step} of {job.total_steps} versions answered."
    return f"{name} is {job.status.value}."


def follow_compare_job(
    services: Services,
    launched: int,
    job_id: float | str | None,
    version_a: float | str | None,
    version_b: float | str | None,
) -> tuple[str, bool, Comparison | None]:
    """A launched compare job's line (`compare_job_line`), whether it has finished and, once
    it has succeeded, the comparison of the versions on view (`compare_versions`), which now
    shows its pairs: no other pick needed."""
    try:
        job = services.repository.get_job(launched)
    except NotFound as exc:
        return f"**{inert(exc)}**", True, None
    comparison = None
    if job.status is JobStatus.SUCCEEDED:
        comparison = compare_versions(services, job_id, version_a, version_b)
    return compare_job_line(job), job.status.is_terminal, comparison
