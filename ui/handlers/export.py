"""CSV download of a job's metrics: one row per version, every recorded and aggregated
metric as a column (and a LoRA version's ``adapter_bytes``)."""

import csv
import tempfile
from dataclasses import fields
from pathlib import Path

from db import InvalidValue, JobNotFound, PolicyMetrics, VersionMetrics
from ui.handlers.common import parse_id
from ui.services import Services
from workers.api import adapter_bytes

NAMED = [f.name for f in fields(PolicyMetrics) if f.name != "extra"]


def _row(m: VersionMetrics) -> dict[str, object]:
    recorded = m.recorded.metrics if m.recorded else PolicyMetrics()
    row: dict[str, object] = {
        "version": m.version,
        "parent_version": m.recorded.parent_version if m.recorded else None,
        "created_at": m.recorded.created_at.isoformat() if m.recorded else None,
        **{name: getattr(recorded, name) for name in NAMED},
        "samples": m.num_samples,
        "sample_reward_mean": m.sample_reward_mean,
        "mean_response_length": m.mean_response_length,
        "accepted_batches": m.num_accepted_batches,
        "rejected_batches": m.num_rejected_batches,
    }
    size = adapter_bytes(m.recorded.checkpoint_path) if m.recorded else None
    return row | dict(recorded.extra) | ({} if size is None else {"adapter_bytes": size})


def metrics_csv(services: Services, job_id: float | str | None) -> str | None:
    """The path of a fresh CSV of the job's metrics per version (None without a job)."""
    try:
        chosen = parse_id(job_id, "job")
        if chosen is None:
            return None
        rows = [_row(m) for m in services.repository.version_metrics(chosen)]
    except (InvalidValue, JobNotFound):
        return None
    columns = list(dict.fromkeys(name for row in rows for name in row)) or ["version"]
    path = Path(tempfile.mkdtemp(prefix="rlwb-csv-")) / f"job-{chosen}-metrics.csv"
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return str(path)
