"""The repository: everything the worker and the UI read and write.

`Repository` methods each run in their own transaction and return frozen dataclasses from
`db.records`; they raise the errors of `db.errors`.
"""

from sqlalchemy import URL

from db.repository.batches import BatchesMixin
from db.repository.comparisons import ComparisonsMixin
from db.repository.jobs import JobsMixin
from db.repository.metrics import MetricsMixin
from db.repository.ownership import OwnershipMixin
from db.repository.runs import RunsMixin
from db.repository.samples import SamplesMixin
from db.repository.steps import StepsMixin
from db.repository.studies import StudiesMixin
from db.repository.versions import VersionsMixin
from db.session import make_engine


class Repository(
    JobsMixin,
    OwnershipMixin,
    VersionsMixin,
    BatchesMixin,
    StepsMixin,
    SamplesMixin,
    ComparisonsMixin,
    MetricsMixin,
    RunsMixin,
    StudiesMixin,
):
    """Storage for studies, jobs, policy versions, rollout batches and samples over one engine."""

    @classmethod
    def from_url(cls, url: str | URL | None = None) -> "Repository":
        """A repository on ``url`` (default: ``DATABASE_URL``, else the SQLite file)."""
        return cls(make_engine(url))

    def close(self) -> None:
        """Close the engine's pooled connections."""
        self.engine.dispose()


__all__ = ["Repository"]
