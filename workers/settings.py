"""Worker settings from the environment (the Celery configuration they imply is
`workers.app.celery_config`).

``REDIS_URL`` set: Redis is the broker and the result backend. Unset: the embedded default,
a broker that needs no server (kombu's filesystem transport under ``RLWB_DATA_DIR/broker``,
which also carries ``inspect`` and ``revoke`` broadcasts) and results in a SQLite file.
``DATABASE_URL`` (the system of record) is read by `db` itself. No torch here.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from db import data_dir

GPU_QUEUE = "gpu"
INTERACTIVE_QUEUE = "interactive"  # short tasks (Playground chat) that never wait behind jobs
EMBEDDED_POLL_S = 0.1  # how often the embedded broker's folders are read
REDIS_POLL_S = 0.2  # the longest a Redis BRPOP blocks before it is issued again
INTERACTIVE_TASKS = ("workers.chat", "workers.audit", "workers.token_diff")
TASK_FOR_KIND = {kind: f"workers.{kind}" for kind in ("train", "evaluate", "compare")}
DAY_S = 24 * 3600
UPLOADS_DIR = "datasets"  # the data directory's folder of uploaded prompt sets
STUDIES_DIR = "studies"  # the trackers' folders of each study's runs (`workers.trackers`)
TRACKIO_DIR = "trackio"  # Trackio's project folder (`workers.trackers`)


def worker_device() -> str:
    """The device a worker runs its jobs on, and a job naming none: ``RLWB_DEVICE``, default
    cpu."""
    return os.environ.get("RLWB_DEVICE") or "cpu"


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    redis_url: str | None
    visibility_timeout_s: int
    max_attempts: int
    device: str
    engine_cache_size: int
    heartbeat_timeout_s: float = 60.0
    engine_memory_bytes: int | None = None
    study_max_jobs: int = 64
    study_max_concurrency: int = 4

    @classmethod
    def from_env(cls) -> "Settings":
        """``RLWB_DATA_DIR`` (default: `db.data_dir`), ``REDIS_URL``, ``RLWB_VISIBILITY_TIMEOUT``
        (seconds, default one day: longer than the longest job), ``RLWB_MAX_ATTEMPTS``
        (starts of one job, default 3), ``RLWB_DEVICE`` (the trainer and every engine of
        this worker's jobs, default cpu), ``RLWB_ENGINE_CACHE`` (warm engines kept per
        worker, default 2), ``RLWB_ENGINE_MEMORY`` (bytes those engines share, weights and
        KV pools; default: on CUDA 90% of the device memory free when the first one loads,
        on CPU no shared limit), ``RLWB_HEARTBEAT_TIMEOUT`` (seconds without a heartbeat
        before recovery re-queues a running job, default 60), ``RLWB_STUDY_MAX_JOBS`` and
        ``RLWB_STUDY_MAX_CONCURRENCY`` (the most jobs one study may plan, default 64, and
        keep queued or running at once, default 4)."""
        env = os.environ
        memory = env.get("RLWB_ENGINE_MEMORY")
        return cls(
            data_dir=data_dir().absolute(),
            redis_url=env.get("REDIS_URL") or None,
            visibility_timeout_s=int(env.get("RLWB_VISIBILITY_TIMEOUT") or DAY_S),
            max_attempts=int(env.get("RLWB_MAX_ATTEMPTS") or 3),
            device=worker_device(),
            engine_cache_size=int(env.get("RLWB_ENGINE_CACHE") or 2),
            heartbeat_timeout_s=float(env.get("RLWB_HEARTBEAT_TIMEOUT") or 60),
            engine_memory_bytes=int(memory) if memory else None,
            study_max_jobs=int(env.get("RLWB_STUDY_MAX_JOBS") or 64),
            study_max_concurrency=int(env.get("RLWB_STUDY_MAX_CONCURRENCY") or 4),
        )

    @property
    def heartbeat_interval_s(self) -> float:
        """How often a running job beats: several times per timeout."""
        return self.heartbeat_timeout_s / 5

    @property
    def embedded(self) -> bool:
        """No broker server: the filesystem broker in the data directory."""
        return self.redis_url is None

    @property
    def broker_dir(self) -> Path:
        return self.data_dir / "broker"

    @property
    def broker_queue_dir(self) -> Path:
        """Where the embedded broker keeps its message files."""
        return self.broker_dir / "queue"

    @property
    def jobs_dir(self) -> Path:
        """Where worker-run jobs keep their checkpoints (``jobs/<id>/``)."""
        return self.data_dir / "jobs"

    @property
    def uploads_dir(self) -> Path:
        """Where the UI stores uploaded prompt sets."""
        return self.data_dir / UPLOADS_DIR

    @property
    def own_dirs(self) -> dict[Path, str]:
        """The data directory's folders the workbench writes itself -> what they hold: no
        job's ``output_dir`` (`workers.job_files.check_output_dir`)."""
        return {
            self.jobs_dir: "the folders of the jobs that name no output_dir",
            self.broker_dir: "the embedded broker's messages",
            self.uploads_dir: "the uploaded prompt sets",
            self.data_dir / STUDIES_DIR: "the trackers' folders of the studies",
            self.data_dir / TRACKIO_DIR: "Trackio's runs",
        }
