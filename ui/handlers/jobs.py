"""Jobs tab: the live job table, cancel and resume, and one job's page (plots over versions)."""

from collections.abc import Callable
from typing import Any

import pandas as pd

from db import (
    BatchInfo,
    BatchStatus,
    InvalidTransition,
    InvalidValue,
    JobInfo,
    JobKind,
    JobNotFound,
    JobStatus,
    VersionMetrics,
)
from ui.devices import devices_text
from ui.handlers.common import parse_id
from ui.plots import (
    COMPONENT_PREFIX,
    PLOTS,
    components,
    extra_values,
    plot_frame,
    with_components,
)
from ui.progress import duration, eta_seconds
from ui.render import fmt, inert
from ui.services import Services
from workers.api import (
    HELDOUT_MEAN_AT_K_METRIC,
    HELDOUT_METRIC,
    adapter_bytes,
    algorithms,
    size_text,
    worker_device,
)

JOB_LIMIT = 50
BATCHES_SHOWN = 200
JOB_COLUMNS = [
    "job",
    "kind",
    "devices",
    "status",
    "progress",
    "version",
    "reward",
    "tokens/s",
    "algorithm",
    "created",
]
BATCH_COLUMNS = ["batch", "step", "version", "status", "samples", "reasons"]

# summary, config, one frame per plot of `PLOTS`, the keys of the plots to hide
JobPage = tuple[str, dict[str, Any], list[pd.DataFrame], set[str]]


def _progress(services: Services, job: JobInfo) -> str:
    """``step/total (percent)``, with the phase or the ETA of a running job."""
    text = str(job.step)
    if job.total_steps:
        text = f"{job.step}/{job.total_steps} ({100 * job.step // job.total_steps}%)"
    if job.status is not JobStatus.RUNNING:
        return text
    if job.phase:
        return f"{text} · {job.phase}"
    eta = eta_seconds(services.repository.list_versions(job.id), job)
    return text if eta is None else f"{text} · ETA {duration(eta)}"


def _job_row(services: Services, job: JobInfo, device: str) -> list[Any]:
    latest = None
    if job.current_version is not None:
        latest = services.repository.latest_version(job.id)
    metrics = latest.metrics if latest is not None else None
    return [
        job.id,
        job.kind.value,
        devices_text(job.config, device),
        job.status.value,
        _progress(services, job),
        "—" if job.current_version is None else job.current_version,
        fmt(metrics.reward_mean if metrics else None),
        fmt(metrics.tokens_per_second if metrics else None),
        algorithms.algorithm_label(job.config) if job.kind is JobKind.TRAIN else "—",
        job.created_at.strftime("%Y-%m-%d %H:%M:%S"),
    ]


def jobs_table(services: Services) -> pd.DataFrame:
    """The newest jobs with their devices, status, progress, current version, reward,
    tokens/s and (a train job's) algorithm."""
    jobs, device = services.repository.list_jobs(limit=JOB_LIMIT), worker_device()
    return pd.DataFrame([_job_row(services, job, device) for job in jobs], columns=JOB_COLUMNS)


def job_choices(services: Services) -> list[tuple[str, int]]:
    """(label, id) of the newest jobs, for job pickers."""
    return [
        (f"#{job.id} {job.kind.value} ({job.status.value})", job.id)
        for job in services.repository.list_jobs(limit=JOB_LIMIT)
    ]


def _act(
    services: Services, job_id: float | str | None, verb: str, action: Callable[[int], JobInfo]
) -> str:
    try:
        chosen = parse_id(job_id, "job")
        if chosen is None:
            return f"Choose a job to {verb}."
        job = action(chosen)
    except (InvalidValue, JobNotFound, InvalidTransition) as exc:
        return f"**Cannot {verb}:** {inert(exc)}"
    return f"Job **#{job.id}** is {job.status.value}."


def cancel_job(services: Services, job_id: float | str | None) -> str:
    """Cancel a job (a queued one at once, a running one at its next step)."""
    return _act(services, job_id, "cancel", services.cancel_job)


def resume_job(services: Services, job_id: float | str | None) -> str:
    """Queue a failed, stalled, pruned or cancelled train job again, from its newest checkpoint."""
    return _act(services, job_id, "resume", services.resume_job)


def _version_values(m: VersionMetrics) -> dict[str, float | int | None]:
    recorded = m.recorded.metrics if m.recorded else None
    extra = recorded.extra if recorded else {}
    # a version none of whose batches is decided yet (the one still generating) is not drawn
    # as 0 accepted
    decided = bool(m.num_accepted_batches or m.num_rejected_batches)
    return {
        "reward mean": recorded.reward_mean if recorded else m.sample_reward_mean,
        "held-out accuracy": extra.get(HELDOUT_METRIC),
        "held-out mean@k": extra.get(HELDOUT_MEAN_AT_K_METRIC),
        "mean response tokens": m.mean_response_length,
        "KL": recorded.kl if recorded else None,
        "mismatch": recorded.train_infer_mismatch if recorded else None,
        "accepted": m.num_accepted_batches if decided else None,
        "rejected": m.num_rejected_batches if decided else None,
        **{COMPONENT_PREFIX + name: value for name, value in components(extra).items()},
        **extra_values(extra),
    }


def version_frames(metrics: list[VersionMetrics]) -> list[pd.DataFrame]:
    """One long-format frame over versions per plot of `PLOTS` (see `ui.plots.plot_frame`);
    the reward of a version the job did not train is its samples' mean."""
    values = {m.version: _version_values(m) for m in metrics}
    found = {key for row in values.values() for key in row if key.startswith(COMPONENT_PREFIX)}
    names = sorted(found)  # drawn as the reward's name: "reward/format" -> "format"
    frames = [plot_frame(with_components(spec, names), values) for spec in PLOTS]
    for spec, frame in zip(PLOTS, frames, strict=True):
        if spec.key == "reward-components":
            frame["series"] = frame["series"].astype(str).str.removeprefix(COMPONENT_PREFIX)
    return frames


def hidden_plots(job: JobInfo | None) -> set[str]:
    """Plots that can only be flat for this job: KL without a KL coefficient."""
    if job is not None and job.kind is JobKind.TRAIN and not job.config.get("kl_coef"):
        return {"kl"}
    return set()


def batches_table(batches: list[BatchInfo]) -> pd.DataFrame:
    rows = [
        [
            b.id,
            b.step,
            b.policy_version,
            b.status.value,
            b.num_samples,
            "; ".join(b.rejection_reasons),
        ]
        for b in batches
    ]
    return pd.DataFrame(rows, columns=BATCH_COLUMNS)


def _summary(services: Services, job: JobInfo) -> str:
    lines = [
        f"### Job #{job.id} · {job.kind.value} · {job.status.value}",
        f"progress {_progress(services, job)} · current version "
        f"{'—' if job.current_version is None else job.current_version} · "
        f"attempts {job.attempts}",
    ]
    if isinstance(job.config.get("lora"), dict) and job.kind is JobKind.TRAIN:
        lines.append(_lora_summary(services, job))
    if job.error:
        why = {JobStatus.STALLED: "Stalled", JobStatus.PRUNED: "Pruned"}.get(job.status, "Error")
        lines.append(f"**{why}:** {inert(job.error)}")
    return "\n\n".join(lines)


def _lora_summary(services: Services, job: JobInfo) -> str:
    """A LoRA job's settings (as set; the others are the defaults), its base's checksum and
    its versions' adapters: the size of each (one shape: one size), how many are kept."""
    settings = " · ".join(f"{k} {v}" for k, v in job.config["lora"].items()) or "defaults"
    base = job.base_checksum[:16] if job.base_checksum else "not recorded yet"
    line = f"**LoRA** {inert(settings)} · base checksum `{base}`"
    versions = services.repository.list_versions(job.id)
    sizes = [size for v in versions if (size := adapter_bytes(v.checkpoint_path)) is not None]
    if not sizes:
        return line
    each = " to ".join(dict.fromkeys(size_text(size) for size in (min(sizes), max(sizes))))
    return (
        f"{line} · adapter {each} per version, {len(sizes)} of {len(versions)} versions "
        f"kept ({size_text(sum(sizes))})"
    )


def job_page(services: Services, job_id: float | str | None) -> JobPage:
    """One job: a summary (with its phase or ETA), its config, its plots over versions and
    the plots to hide."""
    empty = version_frames([])
    try:
        chosen = parse_id(job_id, "job")
        if chosen is None:
            return "Choose a job.", {}, empty, set()
        job = services.repository.get_job(chosen)
        frames = version_frames(services.repository.version_metrics(job.id))
    except (InvalidValue, JobNotFound) as exc:
        return f"**{inert(exc)}**", {}, empty, set()
    return _summary(services, job), job.config, frames, hidden_plots(job)


def latest_batches(
    services: Services, job_id: int, status: BatchStatus | None = None
) -> list[BatchInfo]:
    """The job's newest `BATCHES_SHOWN` batches (of ``status``, if given), oldest first."""
    newest = services.repository.list_batches(
        job_id, status=status, limit=BATCHES_SHOWN, newest_first=True
    )
    return newest[::-1]


def job_batches(services: Services, job_id: float | str | None) -> pd.DataFrame:
    """The job's latest rollout batches, accepted and rejected (with the reasons)."""
    try:
        chosen = parse_id(job_id, "job")
        batches = [] if chosen is None else latest_batches(services, chosen)
    except (InvalidValue, JobNotFound):
        batches = []
    return batches_table(batches)
