"""Train jobs: the GRPO loop with every step written to the database as it happens: the
checkpoint first, then the step's batches and version row in one transaction (see
`workers.checkpoints` for why that makes crashes harmless)."""

from pathlib import Path

from core_engine.rl.tasks import training_records
from core_engine.rl.trainer import (
    BatchRecord,
    GRPOTrainer,
    TrainerHooks,
    TrainingError,
    VersionRecord,
)
from core_engine.weights import canonical_weights, weights_checksum
from db import JobInfo, PolicyVersionRecord, Repository
from workers.checkpoints import reconcile
from workers.control import JobControl, Outcome
from workers.models import resolve_model
from workers.records import policy_metrics, trainer_batches
from workers.settings import Settings
from workers.specs import train_config


class Recorder:
    """Trainer hooks that store each step's batches and version together (`record_step`)."""

    def __init__(
        self, repo: Repository, job_id: int, control: JobControl, total_steps: int
    ) -> None:
        self.repo = repo
        self.job_id = job_id
        self.control = control
        self.total_steps = total_steps
        self.trainer: GRPOTrainer | None = None
        self.pending: PolicyVersionRecord | None = None
        self.rejected = 0

    def on_version(self, record: VersionRecord) -> None:
        """The checkpoint exists; the version's row waits for its step's batches."""
        if record.checkpoint is None:
            raise TrainingError(f"version {record.version} has no checkpoint")
        self.pending = PolicyVersionRecord(
            job_id=self.job_id,
            version=record.version,
            parent_version=record.parent,
            checkpoint_path=record.checkpoint,
            weights_checksum=record.checksum,
            metrics=policy_metrics(record.metrics, 1, self.rejected),
        )

    def on_batch(self, batch: BatchRecord) -> None:
        """Store the batch, and with an accepted one the version it produced, atomically."""
        accepted = batch.status == "accepted"
        if accepted and self.pending is None:
            raise TrainingError(f"accepted batch of step {batch.step} without a new version")
        new_version = self.pending if accepted else None
        batch_version = self.pending.parent_version if accepted else self.trainer.version
        records = trainer_batches(self.job_id, batch_version, batch)
        if records or new_version is not None:
            self.repo.record_step(records, new_version, fence=self.control.fence)
        if accepted:
            self.pending, self.rejected = None, 0
        else:
            self.rejected += 1
        self.control.report(
            self.trainer.step_index,
            self.total_steps,
            version=self.trainer.version,
            batch=batch.status,
            reward_mean=batch.metrics.get("reward_mean"),
        )


def output_dir(job: JobInfo, settings: Settings) -> Path:
    """The job's checkpoint directory: ``output_dir`` from its config, else the data dir's."""
    return Path(job.config.get("output_dir") or settings.jobs_dir / str(job.id))


def run_training(
    repo: Repository, job: JobInfo, settings: Settings, control: JobControl
) -> Outcome:
    """Run (or resume) a train job until its steps are done, it is stopped, or it fails."""
    model = resolve_model(job.config["model"], settings)
    config = train_config({**job.config, "model": model}, str(output_dir(job, settings)))
    reconcile(repo, job.id, config.output_dir, control.fence)
    records = training_records(config.task, config.data, seed=config.seed)
    recorder = Recorder(repo, job.id, control, config.steps)
    hooks = TrainerHooks(recorder.on_batch, recorder.on_version, control.should_stop)
    trainer = recorder.trainer = GRPOTrainer(config, records, hooks)
    if trainer.version == 0 and repo.latest_version(job.id) is None:
        weights = canonical_weights(trainer.model)
        repo.record_policy_version(
            PolicyVersionRecord(job.id, 0, None, model, weights_checksum(weights)),
            fence=control.fence,
        )
    control.report(trainer.step_index, config.steps, version=trainer.version)
    try:
        trainer.train()
    except TrainingError as exc:
        return Outcome("failed", f"training stopped: {exc}")
    if trainer.step_index >= config.steps:
        return Outcome("succeeded")
    if control.should_stop():
        return control.stopped()
    return Outcome(
        "failed",
        f"stopped early at step {trainer.step_index} of {config.steps}: "
        f"{config.max_consecutive_rejections + 1} batches in a row had no reward variance "
        "(nothing to learn from)",
    )
