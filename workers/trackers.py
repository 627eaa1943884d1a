"""Experiment trackers (a train job's ``report_to``): each recorded version's metrics, named as
TRL's GRPOTrainer names them, at step = version, written on this machine only: TensorBoard
event files and an MLflow store under the job's ``runs/`` directory, W&B in offline mode
(``wandb sync`` uploads it later), trackio in ``TRACKIO_DIR`` (default ``RLWB_DATA_DIR/trackio``).

A study's jobs are grouped (`tracked_run` with its name): their files are kept in the study's
folder (``RLWB_DATA_DIR/studies/<name>/``): a TensorBoard run per job (``tensorboard/job-<id>``,
so ``tensorboard --logdir`` on the folder overlays them), one MLflow store whose parent run is
the study and each job a child run; W&B runs share the study as their group.

Each backend is an optional extra (``pip install 'rl-workbench[tensorboard]'``), imported when a
job opens it. A tracker that fails (not installed on this worker, disk full) is dropped with one
warning: training goes on. Only committed versions are logged, so a resumed job appends.
"""

import importlib.util
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from db import METRIC_TYPES, JobInfo, PolicyMetrics
from workers.settings import STUDIES_DIR, TRACKIO_DIR

log = logging.getLogger(__name__)

# Our metric (`db.PolicyMetrics` field or ``extra`` key) -> the name TRL's GRPOTrainer logs
# for the same quantity. Metrics TRL lacks keep our name (heldout_accuracy, tokens_per_second,
# zero_variance_groups, the timings ...), and so do those we name as TRL does (learning_rate,
# the optimizer's; entropy, the trained tokens' mean). reward_std is the whole batch's standard
# deviation (TRL's is the mean of the groups' ones).
TRL_NAMES = {
    "reward_mean": "reward",
    "reward_std": "reward_std",
    "loss": "loss",
    "kl": "kl",
    "grad_norm": "grad_norm",
    "response_length": "completions/mean_length",
    "clip_fraction": "clip_ratio/region_mean",
    "train_infer_mismatch": "sampling/sampling_logp_difference/max",
    "mismatch_mean": "sampling/sampling_logp_difference/mean",
    "tis_weight_mean": "sampling/importance_sampling_ratio/mean",
    "zero_variance_fraction": "frac_reward_zero_std",  # the share of groups rewarded alike
}
# Where Hugging Face's Trainer puts training metrics in TensorBoard, W&B and trackio (MLflow
# gets the bare names), e.g. ``train/reward``.
TRAIN_PREFIX = "train/"
EXPERIMENT = "rlwb"  # the MLflow experiment, W&B and trackio project
PARENT_TAG = "mlflow.parentRunId"  # MLflow's nesting of a run under another


def trl_metrics(metrics: PolicyMetrics) -> dict[str, float]:
    """A version's recorded metrics (named ones that are set, and ``extra``) by TRL's names."""
    values = {name: getattr(metrics, name) for name in METRIC_TYPES} | dict(metrics.extra)
    return {_trl_name(k): float(v) for k, v in values.items() if v is not None}


def _trl_name(name: str) -> str:
    """TRL's name of one of our metrics; a reward component's ``reward/<name>/mean`` is
    TRL's ``rewards/<name>/mean`` (and std)."""
    if name.startswith("reward/"):
        return "rewards/" + name.removeprefix("reward/")
    return TRL_NAMES.get(name, name)


def _train_scoped(metrics: Mapping[str, float]) -> dict[str, float]:
    return {TRAIN_PREFIX + name: value for name, value in metrics.items()}


@dataclass(frozen=True)
class TrackedRun:
    """One train job as the trackers see it."""

    directory: Path  # the job's runs/ directory: TensorBoard, MLflow and W&B files
    name: str  # job-<id>: the run's name in every tracker
    uid: str  # the W&B run id: stable across resumes, its creation time tells installations apart
    params: Mapping[str, Any]  # the job's config: the run's parameters
    trackio_dir: Path  # TRACKIO_DIR unless the environment sets it
    study: str | None = None  # the study grouping it (then ``directory`` is the study's)

    @property
    def tensorboard_dir(self) -> Path:
        """The job's own TensorBoard folder (a study's jobs: one each in the study's)."""
        if self.study is None:
            return self.directory / "tensorboard"
        return self.directory / "tensorboard" / self.name


def tracked_run(
    job: JobInfo, job_dir: Path, data_dir: Path, study: str | None = None
) -> TrackedRun:
    """Job ``job`` (files in ``job_dir``, its checkpoint directory; with ``study``, the name
    of its study, in the study's folder) as the trackers see it."""
    uid = f"rlwb-{job.id}-{job.created_at:%Y%m%d%H%M%S}"
    directory = job_dir / "runs" if study is None else data_dir / STUDIES_DIR / study
    trackio = data_dir / TRACKIO_DIR
    return TrackedRun(directory, f"job-{job.id}", uid, job.config, trackio, study)


class Tracker(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    def __init__(self, run: TrackedRun) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run.tensorboard_dir))
        self.writer.add_text("args", json.dumps(run.params, indent=2))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in _train_scoped(metrics).items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()  # a crashed worker loses nothing already logged

    def close(self) -> None:
        self.writer.close()


class MlflowTracker:
    """An MLflow SQLite store (``runs/mlflow/mlflow.db``) holding the job's one run, or a
    study's store holding the study's parent run and a child run per job; MLflow 3 refuses
    its older file store unless told otherwise. ``mlflow ui --backend-store-uri
    sqlite:///PATH`` shows it."""

    def __init__(self, run: TrackedRun) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        root = run.directory / "mlflow"
        root.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        if experiment is None:
            artifacts = (root / "artifacts").as_uri()
            experiment_id = self.client.create_experiment(EXPERIMENT, artifacts)
        else:
            experiment_id = experiment.experiment_id
        own = f"tags.`mlflow.runName` = '{run.name}'"
        earlier = self.client.search_runs([experiment_id], own, max_results=1)
        if earlier:  # a resumed job: the same run goes on
            self.run_id = earlier[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {} if run.study is None else {PARENT_TAG: self._parent(experiment_id, root, run)}
            made = self.client.create_run(experiment_id, run_name=run.name, tags=tags)
            self.run_id = made.info.run_id
            params = [Param(k, str(v)) for k, v in run.params.items()]
            self.client.log_batch(self.run_id, params=params)

    def _parent(self, experiment_id: str, root: Path, run: TrackedRun) -> str:
        """The study's parent run, made by its first job (under a file lock: a study's jobs
        may start together)."""
        import fcntl

        with open(root / "parent.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            found = self.client.search_runs(
                [experiment_id], f"tags.`mlflow.runName` = '{run.study}'", max_results=1
            )
            if found:
                return found[0].info.run_id
            return self.client.create_run(experiment_id, run_name=run.study).info.run_id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(name, value, now, step) for name, value in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbTracker:
    """A W&B run in offline mode under ``runs/wandb``: nothing leaves the machine."""

    def __init__(self, run: TrackedRun) -> None:
        import wandb

        directory = run.directory / "wandb"
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=EXPERIMENT,
            name=run.name,
            id=run.uid,
            dir=str(directory),
            mode="offline",
            resume="allow",
            config=dict(run.params),
            group=run.study,
            settings=wandb.Settings(console="off", silent=True),
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(_train_scoped(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    """A trackio run in the local store ``TRACKIO_DIR`` (read when trackio is first imported,
    so it is one store per worker process)."""

    def __init__(self, run: TrackedRun) -> None:
        os.environ.setdefault("TRACKIO_DIR", str(run.trackio_dir))
        import trackio

        self.run = trackio.init(
            project=EXPERIMENT,
            name=run.name,
            resume="allow",
            config=dict(run.params),
            auto_log_gpu=False,
            auto_log_cpu=False,
            embed=False,
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(_train_scoped(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


OPENERS: dict[str, Callable[[TrackedRun], Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "mlflow": MlflowTracker,
    "wandb": WandbTracker,
    "trackio": TrackioTracker,
}
TRACKERS = tuple(OPENERS)


def is_installed(name: str) -> bool:
    """Whether tracker ``name``'s package is importable here (each one's module is its name)."""
    return importlib.util.find_spec(name) is not None


class Trackers:
    """The trackers a job reports to; each failure drops its tracker with a warning."""

    def __init__(self, names: tuple[str, ...], run: TrackedRun) -> None:
        self.active: dict[str, Tracker] = {}
        for name in names:
            with self._guarded(name):
                self.active[name] = OPENERS[name](run)

    def log(self, metrics: PolicyMetrics, version: int) -> None:
        named = trl_metrics(metrics)
        for name, tracker in list(self.active.items()):
            if named:
                with self._guarded(name):
                    tracker.log(named, version)

    def close(self) -> None:
        for name, tracker in list(self.active.items()):
            with self._guarded(name):
                tracker.close()
        self.active.clear()

    @contextmanager
    def _guarded(self, name: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # a tracker never stops training
            self.active.pop(name, None)
            log.warning("report_to %s dropped, training goes on: %r", name, exc)
