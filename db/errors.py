"""Errors raised by the storage layer.

Every error is a `StorageError`; callers catch the specific subclass they can handle.
"""


class StorageError(Exception):
    """Base class of every error raised by `db`."""


class NotFound(StorageError, LookupError):
    """A referenced row does not exist."""


class JobNotFound(NotFound):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} does not exist")
        self.job_id = job_id


class StudyNotFound(NotFound):
    def __init__(self, id_or_name: int | str) -> None:
        what = f"id {id_or_name}" if isinstance(id_or_name, int) else f"name {id_or_name!r}"
        super().__init__(f"no study has the {what}")
        self.id_or_name = id_or_name


class SampleNotFound(NotFound):
    def __init__(self, sample_id: int) -> None:
        super().__init__(f"sample {sample_id} does not exist")
        self.sample_id = sample_id


class BatchNotFound(NotFound):
    def __init__(self, batch_id: int) -> None:
        super().__init__(f"batch {batch_id} does not exist")
        self.batch_id = batch_id


class VersionNotFound(NotFound):
    def __init__(self, job_id: int, version: int) -> None:
        super().__init__(f"job {job_id} has no policy version {version}")
        self.job_id = job_id
        self.version = version


class VersionConflict(StorageError):
    """A policy version that is not greater than the job's latest version."""

    def __init__(self, job_id: int, version: int, latest: int) -> None:
        super().__init__(
            f"job {job_id}: policy version {version} is not greater than the latest "
            f"recorded version {latest} (versions are never reused nor decreasing)"
        )
        self.job_id = job_id
        self.version = version
        self.latest = latest


class StaleOwner(StorageError):
    """A write by an attempt whose fencing token is no longer the job's (the job was
    recovered or restarted elsewhere): refused, nothing of it is stored."""

    def __init__(self, job_id: int, fence: int, current: int) -> None:
        super().__init__(
            f"job {job_id}: this attempt (fence {fence}) no longer owns the job (fence {current})"
        )
        self.job_id = job_id
        self.fence = fence
        self.current = current


class InvalidValue(StorageError, ValueError):
    """An input value the schema does not accept (unknown enum value, bad array, ...)."""


class InvalidTransition(StorageError):
    """A status change or write that the job's current status does not allow."""

    def __init__(self, job_id: int, status: str, action: str) -> None:
        super().__init__(f"job {job_id} is {status!r}: cannot {action}")
        self.job_id = job_id
        self.status = status
        self.action = action
