"""Per-version metrics of a job: the trainer's recorded metrics plus sample totals."""

from collections import defaultdict

from sqlalchemy import func, select

from db.enums import BatchStatus
from db.models import PolicyVersion, RolloutBatch, VersionSampleStats
from db.records import PolicyVersionInfo, VersionMetrics
from db.repository.base import RepositoryBase, load_job
from db.repository.versions import version_info


class MetricsMixin(RepositoryBase):
    def version_metrics(self, job_id: int) -> list[VersionMetrics]:
        """One entry per version that the job recorded or has samples or batches of,
        oldest first."""
        with self._read() as session:
            load_job(session, job_id)
            recorded = {
                row.version: version_info(row)
                for row in session.scalars(
                    select(PolicyVersion).where(PolicyVersion.job_id == job_id)
                )
            }
            stats: dict[int, list[VersionSampleStats]] = defaultdict(list)
            for row in session.scalars(
                select(VersionSampleStats).where(VersionSampleStats.job_id == job_id)
            ):
                stats[row.policy_version].append(row)
            batch_rows = session.execute(
                select(RolloutBatch.policy_version, RolloutBatch.status, func.count())
                .where(RolloutBatch.job_id == job_id)
                .group_by(RolloutBatch.policy_version, RolloutBatch.status)
            ).all()
        batches: dict[int, dict[BatchStatus, int]] = defaultdict(dict)
        for version, status, count in batch_rows:
            batches[version][status] = count
        return [
            _metrics(version, recorded.get(version), stats[version], batches[version])
            for version in sorted(recorded.keys() | stats.keys() | batches.keys())
        ]


def _metrics(
    version: int,
    recorded: PolicyVersionInfo | None,
    stats: list[VersionSampleStats],
    batches: dict[BatchStatus, int],
) -> VersionMetrics:
    samples = sum(row.samples for row in stats)
    rewarded = sum(row.rewarded for row in stats)
    return VersionMetrics(
        version=version,
        recorded=recorded,
        num_samples=samples,
        num_accepted_batches=batches.get(BatchStatus.ACCEPTED, 0),
        num_rejected_batches=batches.get(BatchStatus.REJECTED, 0),
        sample_reward_mean=sum(row.reward_sum for row in stats) / rewarded if rewarded else None,
        mean_response_length=(
            sum(row.response_tokens for row in stats) / samples if samples else None
        ),
        finish_reasons={row.finish_reason: row.samples for row in stats},
    )
