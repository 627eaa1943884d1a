"""Train jobs: the GRPO loop with every step written to the database as it happens, and the
job's checkpoints and database rows kept in agreement across crashes.

A worker-run job writes, per version: the checkpoint (atomic rename), then the step's batches
and the version row in one transaction (`Repository.record_step`). So every version row has
its checkpoint, and after a crash `reconcile` finds either nothing newer than the database
(resume there) or a checkpoint whose step never committed (deleted; the step is redone).
Rejected batches stored after the latest version are deleted too: the resumed run redoes
those steps with the same seeds, so a retried step replaces them instead of adding copies.
"""

import shutil
from collections.abc import Callable
from pathlib import Path

from core_engine.atomic_dir import Writer, recover
from core_engine.rl.checkpoint import checkpoint_dir, is_complete, list_checkpoints
from core_engine.rl.demo_policy import TARGET_ACCURACY
from core_engine.rl.records import StepRecord, StopReason, TrainerHooks
from core_engine.rl.tasks import prompt_records
from core_engine.rl.trainer import GRPOTrainer, TrainingError
from core_engine.weights import model_checksum
from db import JobInfo, PolicyMetrics, PolicyVersionRecord, Repository
from workers.engines import demo_is_built, resolve_model
from workers.evaluation import HeldoutEval
from workers.jobs import JobControl, Outcome
from workers.records import policy_metrics, trainer_batches
from workers.settings import Settings
from workers.specs import DEMO_MODEL, HELDOUT_METRIC, heldout_settings, train_config

WARMUP_PHASE = "building the demo policy"


class ResumeError(ValueError):
    """The output directory does not match the job's recorded versions."""


def reconcile(repo: Repository, job_id: int, root: str | Path, fence: int) -> int | None:
    """Make ``root`` hold exactly the job's recorded versions, and the database hold nothing
    stored after the latest one (see the module docstring; the attempt's ``fence`` guards
    the deletion); returns the latest recorded version (None: a fresh job)."""
    root = Path(root)
    checkpoints = []
    if root.is_dir():
        recover(root, is_complete)
        checkpoints = list_checkpoints(root)
    latest = repo.latest_version(job_id)
    if latest is None:
        if checkpoints:
            raise ResumeError(
                f"{root} holds checkpoints of another run (version {checkpoints[0][0]}): "
                "use an empty output_dir"
            )
        return None
    repo.discard_unversioned(job_id, latest.version, fence)
    for version, path in checkpoints:
        if version > latest.version:
            shutil.rmtree(path)
    known = latest.version
    if known and not is_complete(checkpoint_dir(root, known)):
        raise ResumeError(f"the checkpoint of recorded version {known} is missing from {root}")
    return known


class Recorder:
    """The trainer's step hook: stores each step's batches and its version together
    (`record_step`), as the trainer decided them."""

    def __init__(
        self,
        repo: Repository,
        job_id: int,
        control: JobControl,
        total_steps: int,
        heldout: HeldoutEval | None = None,
    ) -> None:
        self.repo = repo
        self.job_id = job_id
        self.control = control
        self.total_steps = total_steps
        self.heldout = heldout
        self.trainer: GRPOTrainer | None = None
        self.rejected = 0

    def heldout_metrics(self, version: int) -> dict[str, float]:
        """``{heldout_accuracy: ...}`` when ``version`` is due for a held-out evaluation."""
        if self.heldout is None or not self.heldout.settings.due(version, self.total_steps):
            return {}
        return {HELDOUT_METRIC: self.heldout.accuracy(self.trainer.engine)}

    def on_step(self, step: StepRecord) -> None:
        new_version = None
        if step.version is not None:
            if step.version.checkpoint is None:
                raise TrainingError(f"version {step.version.version} has no checkpoint")
            new_version = PolicyVersionRecord(
                job_id=self.job_id,
                version=step.version.version,
                parent_version=step.version.parent,
                checkpoint_path=step.version.checkpoint,
                weights_checksum=step.version.checksum,
                metrics=policy_metrics(
                    {**step.version.metrics, **self.heldout_metrics(step.version.version)},
                    1,
                    self.rejected,
                ),
            )
        batch_version = self.trainer.version if new_version is None else step.version.parent
        records = trainer_batches(self.job_id, batch_version, step)
        if records or new_version is not None:
            self.repo.record_step(records, new_version, fence=self.control.fence)
        self.rejected = 0 if new_version is not None else self.rejected + 1
        self.control.report(
            self.trainer.step_index,
            self.total_steps,
            version=self.trainer.version,
            batch=step.status,
            reward_mean=step.metrics.get("reward_mean"),
        )


def checkpoint_writer(repo: Repository, control: JobControl) -> Writer:
    """Checkpoints of this attempt: staged under its own name, and committed (renamed into
    place) only while it owns the job, with the job row locked, so a stale owner can never
    replace a newer owner's checkpoint, nor commit one while the new owner cleans up."""
    return Writer(f"attempt{control.fence}", lambda: repo.owning(control.job_id, control.fence))


def output_dir(job: JobInfo, settings: Settings) -> Path:
    """The job's checkpoint directory: ``output_dir`` from its config, else the data dir's."""
    return Path(job.config.get("output_dir") or settings.jobs_dir / str(job.id))


def warmup_reporter(
    job: JobInfo, settings: Settings, control: JobControl
) -> Callable[[str], None] | None:
    """Where the demo policy's warm-up reports (the job's ``phase``), if it needs one."""
    if job.config["model"] != DEMO_MODEL or demo_is_built(settings):
        return None

    def report(line: str) -> None:
        control.report(job.step, job.total_steps, phase=f"{WARMUP_PHASE}: {line}")

    report(f"starting (first use only; stops at {TARGET_ACCURACY:.0%} held-out accuracy)")
    return report


def run_training(
    repo: Repository, job: JobInfo, settings: Settings, control: JobControl
) -> Outcome:
    """Run (or resume) a train job until its steps are done, it is stopped, or it fails."""
    model = resolve_model(job.config["model"], settings, warmup_reporter(job, settings, control))
    values = {"device": settings.device, **job.config, "model": model}
    config = train_config(values, str(output_dir(job, settings)))
    reconcile(repo, job.id, config.output_dir, control.fence)
    records = prompt_records(config.task, config.data, seed=config.seed)
    heldout = heldout_settings(job.config)
    evaluation = None
    if heldout.every:
        evaluation = HeldoutEval(config.task, heldout, config.max_tokens, records)
    recorder = Recorder(repo, job.id, control, config.steps, evaluation)
    hooks = TrainerHooks(recorder.on_step, control.should_stop, checkpoint_writer(repo, control))
    trainer = recorder.trainer = GRPOTrainer(config, records, hooks)
    if trainer.version == 0 and repo.latest_version(job.id) is None:
        metrics = PolicyMetrics(extra=recorder.heldout_metrics(0))
        repo.record_policy_version(
            PolicyVersionRecord(job.id, 0, None, model, model_checksum(trainer.model), metrics),
            fence=control.fence,
        )
    control.report(trainer.step_index, config.steps, version=trainer.version)  # phase over
    try:
        reason = trainer.train()
    except TrainingError as exc:
        return Outcome("failed", f"training stopped: {exc}")
    if reason is StopReason.DONE:
        return Outcome("succeeded")
    if reason is StopReason.STOPPED:
        return control.stopped()
    return Outcome(
        "failed",
        f"stopped early at step {trainer.step_index} of {config.steps}: "
        f"{config.max_consecutive_rejections + 1} batches in a row had no reward variance "
        "(nothing to learn from)",
    )
