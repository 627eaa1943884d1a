"""RL Workbench storage: SQLAlchemy models, Alembic migrations and the repository API.

from db import Repository, upgrade
upgrade()                       # DATABASE_URL, else rlwb.db in the data dir (db.data_dir)
repo = Repository.from_url()
"""

from db.enums import (
    BatchStatus,
    EpisodeFinish,
    FinishReason,
    JobKind,
    JobStatus,
    StudyKind,
    StudyStatus,
)
from db.errors import (
    BatchNotFound,
    InvalidTransition,
    InvalidValue,
    JobNotFound,
    NotFound,
    SampleNotFound,
    StaleOwner,
    StorageError,
    StudyNotFound,
    VersionConflict,
    VersionNotFound,
)
from db.loss_flags import LossFlag
from db.migrate import downgrade, upgrade
from db.records import (
    METRIC_TYPES,
    BatchInfo,
    BatchRecord,
    JobInfo,
    PolicyMetrics,
    PolicyVersionInfo,
    PolicyVersionRecord,
    PromptComparison,
    RunMetric,
    SampleDetail,
    SampleFilter,
    SamplePage,
    SampleRecord,
    SampleSummary,
    StepInfo,
    VersionMetrics,
)
from db.repository import Repository
from db.repository.base import MAX_PAGE_SIZE
from db.repository.episode_filter import EpisodeFilter
from db.repository.studies import StudyInfo
from db.session import data_dir, make_engine, resolve_url

__all__ = [
    "MAX_PAGE_SIZE",
    "METRIC_TYPES",
    "BatchInfo",
    "BatchNotFound",
    "BatchRecord",
    "BatchStatus",
    "EpisodeFilter",
    "EpisodeFinish",
    "FinishReason",
    "InvalidTransition",
    "InvalidValue",
    "JobInfo",
    "JobKind",
    "JobNotFound",
    "JobStatus",
    "LossFlag",
    "NotFound",
    "PolicyMetrics",
    "PolicyVersionInfo",
    "PolicyVersionRecord",
    "PromptComparison",
    "Repository",
    "RunMetric",
    "SampleDetail",
    "SampleFilter",
    "SampleNotFound",
    "SamplePage",
    "SampleRecord",
    "SampleSummary",
    "StaleOwner",
    "StepInfo",
    "StorageError",
    "StudyInfo",
    "StudyKind",
    "StudyNotFound",
    "StudyStatus",
    "VersionConflict",
    "VersionMetrics",
    "VersionNotFound",
    "data_dir",
    "downgrade",
    "make_engine",
    "resolve_url",
    "upgrade",
]
