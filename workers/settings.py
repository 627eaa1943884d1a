"""Worker settings from the environment, and the Celery configuration they imply.

``REDIS_URL`` set: Redis is the broker and the result backend. Unset: the embedded default,
a broker that needs no server (kombu's filesystem transport under ``RLWB_DATA_DIR/broker``,
which also carries ``inspect`` and ``revoke`` broadcasts) and results in a SQLite file.
``DATABASE_URL`` (the system of record) is read by `db` itself. No torch here.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GPU_QUEUE = "gpu"
INTERACTIVE_QUEUE = "interactive"  # short tasks (Playground chat) that never wait behind jobs
EMBEDDED_POLL_S = 0.1  # how often the embedded broker's folders are read
INTERACTIVE_TASKS = ("workers.chat", "workers.audit", "workers.token_diff")
TASK_FOR_KIND = {kind: f"workers.{kind}" for kind in ("train", "evaluate", "compare")}
DAY_S = 24 * 3600


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    redis_url: str | None
    visibility_timeout_s: int
    max_attempts: int
    device: str
    engine_cache_size: int
    heartbeat_timeout_s: float = 60.0

    @classmethod
    def from_env(cls) -> "Settings":
        """``RLWB_DATA_DIR`` (default ``./data``), ``REDIS_URL``, ``RLWB_VISIBILITY_TIMEOUT``
        (seconds, default one day: longer than the longest job), ``RLWB_MAX_ATTEMPTS``
        (starts of one job, default 3), ``RLWB_DEVICE`` (the trainer and every engine of
        this worker's jobs, default cpu), ``RLWB_ENGINE_CACHE`` (warm engines kept per
        worker, default 2), ``RLWB_HEARTBEAT_TIMEOUT`` (seconds without a heartbeat before
        recovery re-queues a running job, default 60)."""
        env = os.environ
        return cls(
            data_dir=Path(env.get("RLWB_DATA_DIR") or "data").absolute(),
            redis_url=env.get("REDIS_URL") or None,
            visibility_timeout_s=int(env.get("RLWB_VISIBILITY_TIMEOUT") or DAY_S),
            max_attempts=int(env.get("RLWB_MAX_ATTEMPTS") or 3),
            device=env.get("RLWB_DEVICE") or "cpu",
            engine_cache_size=int(env.get("RLWB_ENGINE_CACHE") or 2),
            heartbeat_timeout_s=float(env.get("RLWB_HEARTBEAT_TIMEOUT") or 60),
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
    def jobs_dir(self) -> Path:
        """Where worker-run jobs keep their checkpoints (``jobs/<id>/``)."""
        return self.data_dir / "jobs"

    @property
    def demo_policy_dir(self) -> Path:
        """The built-in demo policy, built on first use (the UI reads its tokenizer here)."""
        return self.data_dir / "demo-policy"


def broker_settings(settings: Settings) -> dict[str, Any]:
    """Broker and result backend: Redis, or the embedded filesystem broker + SQLite results."""
    if not settings.embedded:
        return {
            "broker_url": settings.redis_url,
            "result_backend": settings.redis_url,
            "broker_transport_options": {"visibility_timeout": settings.visibility_timeout_s},
        }
    queue_dir = settings.broker_dir / "queue"
    control_dir = settings.broker_dir / "control"
    for folder in (queue_dir, control_dir):
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "broker_url": "filesystem://localhost/",
        "broker_transport_options": {
            "data_folder_in": str(queue_dir),
            "data_folder_out": str(queue_dir),
            "control_folder": str(control_dir),
            # kombu's default (1 s) delays every broadcast reply, e.g. the Queue tab's
            "polling_interval": EMBEDDED_POLL_S,
        },
        "result_backend": f"db+sqlite:///{settings.data_dir / 'celery-results.db'}",
    }


def celery_config(settings: Settings) -> dict[str, Any]:
    """The whole Celery configuration (RL notes, section 11)."""
    return {
        **broker_settings(settings),
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_routes": {
            **{name: {"queue": GPU_QUEUE} for name in TASK_FOR_KIND.values()},
            **{name: {"queue": INTERACTIVE_QUEUE} for name in INTERACTIVE_TASKS},
        },
        "task_default_queue": GPU_QUEUE,
        "worker_concurrency": 1,
        "worker_prefetch_multiplier": 1,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_track_started": True,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_soft_shutdown_timeout": 60.0,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "result_expires": DAY_S,
        "timezone": "UTC",
    }
