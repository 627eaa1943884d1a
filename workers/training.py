"""Train jobs: the GRPO loop with every step written to the database as it happens, and the
job's checkpoints and database rows kept in agreement across crashes.

A worker-run job writes, per version: the checkpoint (atomic rename), then the step's batches
and the version row in one transaction (`Repository.record_step`). So every version row has
its checkpoint, and after a crash `reconcile` finds either nothing newer than the database
(resume there) or a checkpoint whose step never committed (deleted; the step is redone).
Rejected batches stored after the latest version are deleted too, but for those its checkpoint
counts (`rejected_since_version`: a stop saves it after the batches it rejected, a crash's
checkpoint counts none): the resumed run redoes the others with the same seeds, so a retried
step replaces them instead of adding copies, and a stop loses none.

Version 0 of a full-weight job is the model directory itself. A LoRA job's version 0 is its
starting adapter, checkpointed like every other version (so its checksum, the adapter's, is
the one an engine of that checkpoint computes), and its base's checksum is recorded once on the
job row (`Repository.record_base_checksum`); the trainer refuses to resume on another base.
"""

import shutil
import threading
from contextlib import ExitStack, closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from core_engine.atomic_dir import Writer, recover
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data.files import Columns
from core_engine.rl.data.tasks import prompt_records
from core_engine.rl.ranks import RankInfo
from core_engine.rl.ranks.launch import RankFailedError, supervised_ranks
from core_engine.rl.rewards.reward_model import with_reward_models
from core_engine.rl.template_sandbox import RenderCancelled
from core_engine.rl.trainer.checkpoint import (
    checkpoint_dir,
    is_complete,
    list_checkpoints,
    read_trainer_state,
)
from core_engine.rl.trainer.grpo import GRPOTrainer, TrainingError
from core_engine.rl.trainer.records import StepRecord, StopReason, TrainerHooks
from core_engine.weights import model_checksum
from db import JobInfo, PolicyMetrics, PolicyVersionRecord, Repository
from workers.control import SHUTTING_DOWN, JobControl, Outcome, ProgressFn
from workers.evaluation import HeldoutEval, heldout_eval
from workers.job_files import job_output_dir, resolve_model
from workers.records import policy_metrics, trainer_batches
from workers.settings import Settings
from workers.specs import (
    HeldoutSettings,
    data_columns,
    heldout_settings,
    report_to,
    train_config,
)
from workers.study_trials import Pruning, job_pruning, job_study
from workers.trackers import Trackers, tracked_run

LOADING_PHASE = "loading the model and the data"


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
        if [version for version, _ in checkpoints] == [0]:  # a LoRA start never recorded
            shutil.rmtree(checkpoints[0][1])
        elif checkpoints:
            raise ResumeError(
                f"{root} holds checkpoints of another run (version {checkpoints[0][0]}): "
                "use an empty output_dir"
            )
        return None
    for version, path in checkpoints:
        if version > latest.version:
            shutil.rmtree(path)
    known, kept = latest.version, 0
    if is_complete(checkpoint := checkpoint_dir(root, known)):
        kept = read_trainer_state(checkpoint).get("rejections", {}).get("since_version", 0)
    elif known:
        raise ResumeError(f"the checkpoint of recorded version {known} is missing from {root}")
    repo.discard_unversioned(job_id, known, fence, keep=kept)
    return known


class Recorder:
    """The trainer's step hook: stores each step's batches and its version together
    (`record_step`), as the trainer decided them; then logs the version to the trackers."""

    def __init__(
        self,
        repo: Repository,
        job_id: int,
        control: JobControl,
        total_steps: int,
        heldout: HeldoutEval | None = None,
        trackers: Trackers | None = None,
        pruning: Pruning | None = None,
    ) -> None:
        self.repo = repo
        self.job_id = job_id
        self.control = control
        self.total_steps = total_steps
        self.heldout = heldout
        self.trackers = trackers
        self.pruning = pruning
        self.pruned: str | None = None  # why the study's pruner stopped the job
        self.trainer: GRPOTrainer | None = None
        self.rejected = 0
        self.unlearned: list[list[float]] = []  # each batch's rewards since the last version

    def heldout_metrics(self, version: int) -> dict[str, float]:
        """The held-out scores (`HeldoutEval.scores`) when ``version`` is due for them, also
        reported to a study job's trial: when its pruner says so, the job stops once the
        version is recorded (`should_stop`)."""
        if self.heldout is None or not self.heldout.settings.due(version, self.total_steps):
            return {}
        scores = self.heldout.scores(self.trainer.engine)
        if self.pruning is not None and self.pruned is None:
            self.pruned = self.pruning.judge(version, scores)
        return scores

    def should_stop(self) -> bool:
        """Stop at this step boundary: pruned, or as the job's control says."""
        return self.pruned is not None or self.control.should_stop()

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
        if new_version is not None and self.trackers is not None:
            self.trackers.log(new_version.metrics, new_version.version)
        self.rejected = 0 if new_version is not None else self.rejected + 1
        if new_version is not None:
            self.unlearned.clear()
        elif getattr(step.rollout, "rewards", None):
            self.unlearned.append(list(step.rollout.rewards))
        self.control.report(
            self.trainer.step_index,
            self.total_steps,
            version=self.trainer.version,
            batch=step.status,
            reward_mean=step.metrics.get("reward_mean"),
        )


def stall_reason(batches: list[list[float]], version: int) -> str:
    """Why a run stalled (`StopReason.STALLED`), from the rewards of each batch it scored
    since ``version``: the one score every sample got, or the range no group varied in. With
    no version learnt, the reward or the task is the likely cause."""
    scores = sorted({score for rewards in batches for score in rewards})
    if len(scores) == 1:
        what = f"every sample scored {float(scores[0])} in {len(batches)} batches"
    else:
        what = (
            f"no group's rewards varied in {len(batches)} batches (scores from "
            f"{float(scores[0])} to {float(scores[-1])})"
        )
    if version:
        return f"{what} since version {version}: nothing left to learn from"
    return f"{what}: check the reward and the task"


def checkpoint_writer(repo: Repository, control: JobControl) -> Writer:
    """Checkpoints of this attempt: staged under its own name, and committed (renamed into
    place) only while it owns the job, with the job row locked, so a stale owner can never
    replace a newer owner's checkpoint, nor commit one while the new owner cleans up."""
    return Writer(f"attempt{control.fence}", lambda: repo.owning(control.job_id, control.fence))


def run_training(
    repo: Repository, job: JobInfo, settings: Settings, control: JobControl
) -> Outcome:
    """Run (or resume) a train job until its steps are done, it is stopped, it stalls (no
    reward variance left to learn from), its study's pruner stops it, or it fails. A job on
    several devices runs as child processes of this one, all its ranks (`train_on_ranks`)."""

    def phase(text: str) -> None:  # before the steps: a Hub model's download, a 7B load
        control.report(job.step, job.total_steps, phase=text)

    model = resolve_model(job.config["model"], download=phase)
    phase(LOADING_PHASE)
    values = {"device": settings.device, **job.config, "model": model}
    if "reward" in job.config:  # its reward models' Hub ids: their snapshots
        resolve = partial(resolve_model, download=phase)
        values["reward"] = with_reward_models(job.config["reward"], resolve)
    config = train_config(values, str(job_output_dir(job.id, job.config, settings)))
    reconcile(repo, job.id, config.output_dir, control.fence)
    columns = data_columns(job.config)
    records = prompt_records(config.task, config.data, seed=config.seed, columns=columns)
    job_run = JobRun(job, settings.data_dir, config, records, heldout_settings(job.config), columns)
    if config.devices == 1:
        return train(repo, control, job_run, None)
    return train_on_ranks(control, job_run)


@dataclass(frozen=True)
class JobRun:
    """What a train job's rank 0 needs to run it (sent to its process on several devices)."""

    job: JobInfo
    data_dir: Path
    config: GRPOConfig
    records: list[dict[str, str]]  # before the held-out ones are set apart
    heldout: HeldoutSettings
    columns: Columns

    def training_records(self) -> tuple[list[dict[str, str]], HeldoutEval | None]:
        """The records trained on, and the held-out evaluation when the job has one."""
        if not self.heldout.every:
            return self.records, None
        return heldout_eval(self.config, self.heldout, self.columns, self.records)


def train_on_ranks(control: JobControl, job_run: JobRun) -> Outcome:
    """The job's ranks as child processes of this worker (`ranks.launch.supervised_ranks`):
    rank 0 records (`lead_rank`), this process passes its progress on and its stop (a warm
    shutdown) to it, and a rank that fails, dies or hangs fails the job, naming it."""
    records, evaluation = job_run.training_records()
    if evaluation is not None:
        evaluation.close()  # rank 0's own evaluates
    progress = control.progress or (lambda ping: None)
    try:
        return supervised_ranks(
            job_run.config,
            records,
            lead_rank,
            (control.fence, job_run),
            progress,
            SHUTTING_DOWN.is_set,
        )
    except RankFailedError as exc:
        return Outcome("failed", f"training stopped: {exc}")


def lead_rank(
    info: RankInfo, send: ProgressFn, stopping: Any, fence: int, job_run: JobRun
) -> Outcome:
    """Rank 0 of a job, in its own process: the job's database (as the worker's environment
    names it) and attempt, progress sent to the worker, the worker's shutdown obeyed."""
    from workers.app import repository

    def forward_shutdown() -> None:
        stopping.wait()
        SHUTTING_DOWN.set()

    threading.Thread(target=forward_shutdown, daemon=True).start()
    control = JobControl(repository(), job_run.job.id, fence, send)
    return train(control.repo, control, job_run, info)


def train(
    repo: Repository, control: JobControl, job_run: JobRun, ranks: RankInfo | None
) -> Outcome:
    """The job's trainer (rank 0's on several devices), its steps recorded."""
    job, config = job_run.job, job_run.config
    records, evaluation = job_run.training_records()
    study = job_study(repo, job)
    run = tracked_run(job, Path(config.output_dir), job_run.data_dir, study.name if study else None)
    try:
        with closing(Trackers(report_to(job.config), run)) as trackers, ExitStack() as stack:
            if evaluation is not None:
                stack.callback(evaluation.close)
            pruning = job_pruning(repo, job)
            recorder = Recorder(repo, job.id, control, config.steps, evaluation, trackers, pruning)
            writer = checkpoint_writer(repo, control)
            trainer = recorder.trainer = GRPOTrainer(
                config, records, TrainerHooks(recorder.on_step, recorder.should_stop, writer), ranks
            )
            if trainer.base_checksum is not None:
                repo.record_base_checksum(job.id, trainer.base_checksum, fence=control.fence)
            if trainer.version == 0 and repo.latest_version(job.id) is None:
                metrics = PolicyMetrics(extra=recorder.heldout_metrics(0))
                start = config.model if config.lora is None else str(trainer.save())  # LoRA
                checksum = model_checksum(trainer.whole_model)
                repo.record_policy_version(
                    PolicyVersionRecord(job.id, 0, None, start, checksum, metrics),
                    fence=control.fence,
                )
                trackers.log(metrics, 0)
            control.report(trainer.step_index, config.steps, version=trainer.version)  # phase over
            reason = trainer.train()
    except TrainingError as exc:
        return Outcome("failed", f"training stopped: {exc}")
    except RenderCancelled:  # a cancel while the prompts were rendered, before any step
        return control.stopped()
    if reason is StopReason.DONE:
        return Outcome("succeeded")
    if reason is StopReason.STOPPED and recorder.pruned is not None:
        return Outcome("pruned", recorder.pruned)
    if reason is StopReason.STOPPED:
        return control.stopped()
    return Outcome("stalled", stall_reason(recorder.unlearned, trainer.version))
