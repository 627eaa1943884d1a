"""Per-version metrics of a job: the trainer's recorded metrics plus sample aggregates."""

from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import func, select

from db.enums import BatchStatus, FinishReason
from db.models import PolicyVersion, RolloutBatch, Sample
from db.records import VersionMetrics
from db.repository.base import RepositoryBase, load_job
from db.repository.versions import version_info


@dataclass
class _SampleTotals:
    samples: int = 0
    reward_sum: float = 0.0
    rewards: int = 0
    response_tokens: int = 0
    finish_reasons: dict[FinishReason, int] = field(default_factory=dict)

    @property
    def reward_mean(self) -> float | None:
        return self.reward_sum / self.rewards if self.rewards else None

    @property
    def mean_response_length(self) -> float | None:
        return self.response_tokens / self.samples if self.samples else None


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
            sample_rows = session.execute(
                select(
                    Sample.policy_version,
                    Sample.finish_reason,
                    func.count(),
                    func.sum(Sample.reward),
                    func.count(Sample.reward),
                    func.sum(Sample.response_length),
                )
                .where(Sample.job_id == job_id)
                .group_by(Sample.policy_version, Sample.finish_reason)
            ).all()
            batch_rows = session.execute(
                select(RolloutBatch.policy_version, RolloutBatch.status, func.count())
                .where(RolloutBatch.job_id == job_id)
                .group_by(RolloutBatch.policy_version, RolloutBatch.status)
            ).all()

        batches: dict[int, dict[BatchStatus, int]] = defaultdict(dict)
        for version, status, count in batch_rows:
            batches[version][status] = count
        totals: dict[int, _SampleTotals] = defaultdict(_SampleTotals)
        for version, finish, count, reward_sum, reward_count, length_sum in sample_rows:
            total = totals[version]
            total.samples += count
            total.reward_sum += reward_sum or 0.0
            total.rewards += reward_count
            total.response_tokens += length_sum
            total.finish_reasons[finish] = count
        return [
            VersionMetrics(
                version=version,
                recorded=recorded.get(version),
                num_samples=totals[version].samples,
                num_accepted_batches=batches[version].get(BatchStatus.ACCEPTED, 0),
                num_rejected_batches=batches[version].get(BatchStatus.REJECTED, 0),
                sample_reward_mean=totals[version].reward_mean,
                mean_response_length=totals[version].mean_response_length,
                finish_reasons=totals[version].finish_reasons,
            )
            for version in sorted(recorded.keys() | totals.keys() | batches.keys())
        ]
